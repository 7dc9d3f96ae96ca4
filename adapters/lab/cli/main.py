"""The ``prefixkv`` command line: ``compare`` backends head to head, ``replay`` one trace,
``calibrate`` a cost profile.

Only the standard library and :mod:`.signals` load first; each subcommand is a module of
this package, imported once it is chosen.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from .signals import Interrupts

COMMANDS = {
    "compare": "run backends head to head; write tables, report.md, results.json and plots",
    "replay": "replay one trace through one backend; write per-request hits (oracle format)",
    "calibrate": "fit a cost profile to a served engine, vllm bench serve results or the "
    "reference engine; --list the shipped profiles",
    "cluster": "route a trace over N replicas with each routing policy; write a report",
}
"""Each subcommand and its ``--help`` line; its module defines ``add_arguments(parser)``
and ``run(args, argv, interrupts)``."""


def command(name: str) -> ModuleType:
    """The module of subcommand ``name``."""
    return importlib.import_module(f"{__package__}.{name}")


def build_parser() -> argparse.ArgumentParser:
    """The ``prefixkv`` parser; a subcommand's flags are added only when it parses."""
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
    """Run ``prefixkv`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status: 0,
    2 on an error in the input or the flags, 128 + the signal that stopped it (130 for Ctrl-C),
    1 on an internal error (``PREFIXKV_TRACEBACK=1`` shows its traceback). Every error is one
    line on stderr; the caller's signal handlers are put back (as the program: ignored)."""
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
        # A closed terminal takes stdout and stderr with it: only the messages are lost.
        if not interrupts.received:
            raise
        _silence(sys.stdout, sys.stderr)
        return interrupts.status()
    finally:
        interrupts.restore(ignore=argv is None)


def _run(args_list: list[str], interrupts: Interrupts) -> int:
    """Parse, dispatch and turn every error into one line and an exit status."""
    from prefixkv.indexes.errors import PrefixKVError

    from .args import EXIT_ERROR, EXIT_INTERNAL

    try:
        args = build_parser().parse_args(args_list)
        return int(command(args.command).run(args, args_list, interrupts))
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


def _silence(*streams: object) -> None:
    """Point these streams at the null device, so flushing them at exit cannot fail."""
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
