"""The ``prefixkv`` command line: ``compare`` backends head to head, ``replay`` one trace,
``calibrate`` a cost profile.

``compare`` with ``--request-rate`` or ``--time-scale`` also runs each backend at arrival
time on its natural engine and reports TTFT, queueing and GPU time. ``replay`` writes
the per-request hit file the vLLM and SGLang reference oracles write, so the two diff
request by request. ``calibrate`` times the reference engine and writes a cost profile
``compare --profile`` reads. Traces stream: memory is the cache and the live
requests, never the trace. Sizes are real tokens with vLLM's suffixes (``1k`` = 1,000,
``1K`` = 1,024). Errors are one line on stderr and exit status 2; Ctrl-C (or SIGTERM,
SIGHUP, any signal that stops a process) writes what is finished, marked partial, and
exits 128 + the signal (130 for Ctrl-C); every file is written atomically.
``replay --kv-events`` also writes (or publishes over ZeroMQ) the index's KV events, one
batch per scheduler step, in vLLM 0.33's wire format.

This module imports only the standard library and :mod:`.signals` at the top: the
signal handler is in place before the subcommands (and numpy, msgspec...) load. Each
subcommand is a module of this package (:data:`COMMANDS`) that gives its parser its
flags (``add_arguments``) and runs (``run``); it is imported only once it is chosen, so
a command loads what it runs and no other subcommand's stack, and ``prefixkv --help``
loads none.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Mapping, Sequence
from types import MappingProxyType, ModuleType

from .signals import Interrupts

__all__ = ["COMMANDS", "build_parser", "command", "main"]

COMMANDS: Mapping[str, str] = MappingProxyType(
    {
        "compare": "run backends head to head; write tables, report.md, results.json and plots",
        "replay": "replay one trace through one backend; write per-request hits (oracle format)",
        "calibrate": "fit a cost profile to a served engine, vllm bench serve results or the "
        "reference engine; --list the shipped profiles",
        "cluster": "route a trace over N replicas with each routing policy; write a report",
    }
)
"""Each subcommand, in ``--help``'s order, with its line there; its module in this
package has its name and defines ``add_arguments(parser)`` and ``run(args, argv,
interrupts)``."""


def command(name: str) -> ModuleType:
    """The module of subcommand ``name`` (imported now if it was not yet)."""
    return importlib.import_module(f"{__package__}.{name}")


def build_parser() -> argparse.ArgumentParser:
    """The ``prefixkv`` argument parser with its subcommands (compare, replay, calibrate,
    cluster), each of which imports its module and adds its flags only when it parses."""
    from prefixkv.indexes.buildinfo import VersionAction

    from .args import CommandParser, Parser

    parser = Parser(prog="prefixkv", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=CommandParser
    )
    for name, line in COMMANDS.items():
        sub.add_parser(name, help=line, module=f"{__package__}.{name}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``prefixkv`` command line; returns the exit status.

    The handler of every stopping signal is installed first (:class:`~.signals.Interrupts`),
    then the subcommands are imported and run. Called with ``argv``, the caller's
    handlers are put back at the end; called as the program (no ``argv``), later
    signals are ignored instead while the process exits, so a last Ctrl-C can neither
    print a traceback nor kill it with its files half closed.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 on success; 2 on any error in the input or the flags (one line on
        stderr); 128 + the signal when a signal stopped it (130 for Ctrl-C, 143 for
        SIGTERM, 129 for SIGHUP: what was finished is written, marked partial, even
        when the terminal is gone); 1 on an internal error (one line too; set
        ``PREFIXKV_TRACEBACK=1`` to see the traceback).
    """
    interrupts = Interrupts()
    try:  # from before the first handler goes in: no signal escapes as a traceback
        interrupts.handle_signals()
        return _run(list(sys.argv[1:] if argv is None else argv), interrupts)
    except KeyboardInterrupt:
        with contextlib.suppress(OSError):
            print(
                f"prefixkv: {interrupts.name()} before anything was finished; nothing written",
                file=sys.stderr,
            )
        return interrupts.status()
    except OSError:
        # A closed terminal (SIGHUP, a dropped ssh) takes stdout and stderr with it: what
        # finished is written, only the messages are lost; the status names the signal.
        if not interrupts.received:
            raise
        _silence(sys.stdout, sys.stderr)
        return interrupts.status()
    finally:
        if argv is None:
            interrupts.ignore()  # the process is exiting: nothing may cut that short
        else:
            interrupts.restore()


def _run(args_list: list[str], interrupts: Interrupts) -> int:
    """Parse, dispatch and turn every error into one line and an exit status."""
    from prefixkv.indexes.errors import PrefixKVError

    from .args import EXIT_ERROR, EXIT_INTERNAL

    try:
        args = build_parser().parse_args(args_list)
        return _dispatch(args, args_list, interrupts)
    except SystemExit as exc:  # --help and --version exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except BrokenPipeError:  # `prefixkv compare | head`: the reader left, not an error
        _silence(sys.stdout)
        return interrupts.status() if interrupts.received else 0
    except MemoryError:
        print(
            "prefixkv: error: out of memory; lower --capacity-tokens, --max-prompt-tokens "
            "or --max-output-tokens",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except (PrefixKVError, OSError, ValueError, RecursionError) as exc:
        print(f"prefixkv: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if os.environ.get("PREFIXKV_TRACEBACK"):
            raise
        print(
            f"prefixkv: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(set PREFIXKV_TRACEBACK=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _dispatch(args: argparse.Namespace, argv: Sequence[str], interrupts: Interrupts) -> int:
    status: int = command(args.command).run(args, argv, interrupts)
    return status


def _silence(*streams: object) -> None:
    """Point these streams' file descriptors at the null device, so that flushing them
    at exit cannot fail (Python would exit 120)."""
    for stream in streams:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # type: ignore[attr-defined]


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.strerror or exc}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    from ..messages import one_line  # an error path: nothing more loads before the handler

    return one_line(text, 500)
