"""The ``prefixkv`` command line: ``compare`` backends head to head, ``replay`` one trace.

``replay`` writes the per-request hit file the vLLM and SGLang reference oracles write,
so the two diff request by request. Errors are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.registry import available_indexes

from . import report
from .compare import (
    BackendSpec,
    CompareError,
    compare_workload,
    parse_backends,
    plan_capacities,
    roomy_capacity,
)
from .progress import progress
from .replay import DRIVERS, ReplayError, replay
from .sources import DEFAULT_WORKLOADS, load_workloads, workload_names
from .traces import load_any

__all__ = ["CLIUsageError", "build_parser", "main"]

EXIT_ERROR = 2
SWEEP_POINTS = 7


class CLIUsageError(PrefixKVError):
    """A command-line argument is missing, malformed or out of range."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise CLIUsageError(f"{message} (see {self.prog} --help)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--block-size",
        type=_positive_int,
        default=16,
        metavar="N",
        help="tokens per block for the hash chain and none (default 16)",
    )
    p.add_argument(
        "--page-size",
        type=_positive_int,
        default=1,
        metavar="N",
        help="the radix tree's page size in tokens (default 1)",
    )
    cap = p.add_mutually_exclusive_group()
    cap.add_argument(
        "--capacity-tokens",
        type=_positive_int,
        metavar="T",
        help="KV capacity in tokens, the same for every backend (blocks = T // size)",
    )
    cap.add_argument(
        "--capacity-blocks",
        type=_positive_int,
        metavar="N",
        help="KV capacity as N blocks of --block-size tokens (N * block size tokens)",
    )
    p.add_argument(
        "--concurrency",
        "-k",
        type=_positive_int,
        default=1,
        metavar="K",
        help="at most K live requests; the oldest finishes first (default 1)",
    )
    p.add_argument(
        "--max-requests", type=_positive_int, metavar="N", help="use only the first N requests"
    )
    p.add_argument(
        "--scale-block",
        type=_positive_int,
        metavar="S",
        help="Mooncake traces: S tokens per 512-token hash id (e.g. 16)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="workload seed and Mooncake token seed (default 0)"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The ``prefixkv`` argument parser with its two subcommands."""
    parser = _Parser(prog="prefixkv", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    cmp = sub.add_parser(
        "compare",
        help="run backends head to head; write tables, report.md, results.json and plots",
        description="Replay workloads (or a trace) through each backend at equal capacity, "
        "print a table per workload and write a report. Default: the built-in set "
        f"{', '.join(DEFAULT_WORKLOADS)} with a capacity sweep.",
    )
    src = cmp.add_mutually_exclusive_group()
    src.add_argument(
        "--workload",
        "-w",
        action="extend",
        nargs="+",
        metavar="NAME",
        help=f"built-in workloads (several allowed): {', '.join(workload_names())}",
    )
    src.add_argument("--trace", metavar="FILE", help="a prefixkv or Mooncake JSONL trace")
    cmp.add_argument(
        "--indexes",
        default="hash_chain,radix,none",
        metavar="LIST",
        help="comma-separated backends, NAME or NAME:SIZE "
        f"(default hash_chain,radix,none; known: {', '.join(available_indexes())})",
    )
    _add_common(cmp)
    cmp.add_argument(
        "--capacity-sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also replay at 7 capacities from tight to roomy and plot hit ratio "
        "vs capacity (default: on for the built-in set, off otherwise)",
    )
    cmp.add_argument(
        "--timing-repeats",
        type=_positive_int,
        default=3,
        metavar="R",
        help="timed replays per backend; each request's index time is its "
        "minimum over them (default 3)",
    )
    cmp.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib)")
    cmp.add_argument(
        "--out",
        "-o",
        default="prefixkv-report",
        metavar="DIR",
        help="output folder (default ./prefixkv-report)",
    )
    rep = sub.add_parser(
        "replay",
        help="replay one trace through one backend; write per-request hits (oracle format)",
        description="Replay TRACE through one backend and write one {id, prompt_len, "
        "hit_tokens} line per request and a final {summary} line, as the vLLM and SGLang "
        "reference oracles do. Default capacity: roomy (no eviction). vLLM's oracle "
        "--num-blocks N matches --capacity-blocks N-1 (its block 0 is the null block).",
    )
    rep.add_argument("trace", metavar="TRACE", help="a prefixkv or Mooncake JSONL trace")
    rep.add_argument(
        "--index",
        required=True,
        metavar="NAME",
        help=f"the backend: {', '.join(available_indexes())}",
    )
    rep.add_argument(
        "--driver",
        choices=DRIVERS,
        help="call order: vllm, sglang or manager (default: the backend's own)",
    )
    _add_common(rep)
    rep.add_argument("--out", "-o", required=True, metavar="FILE", help="result JSONL")
    return parser


def _capacity(args: argparse.Namespace) -> int | None:
    """The capacity asked for, in tokens; ``None`` for the roomy default."""
    if args.capacity_tokens is not None:
        return int(args.capacity_tokens)
    if args.capacity_blocks is not None:
        return int(args.capacity_blocks) * int(args.block_size)
    return None


def _capacity_rule(args: argparse.Namespace) -> str:
    if args.capacity_tokens is not None:
        return f"{args.capacity_tokens} tokens for every backend"
    if args.capacity_blocks is not None:
        return (
            f"{args.capacity_blocks} blocks of {args.block_size} tokens = "
            f"{args.capacity_blocks * args.block_size} tokens for every backend"
        )
    return "roomy: every request's prompt and output plus two blocks, so nothing is evicted"


def _run_compare(args: argparse.Namespace, argv: Sequence[str]) -> int:
    t0 = time.perf_counter()
    backends = parse_backends(args.indexes, block_size=args.block_size, page_size=args.page_size)
    sweep = args.capacity_sweep
    if sweep is None:
        sweep = not args.workload and args.trace is None
    names = [n for part in args.workload or [] for n in part.split(",") if n]
    workloads = load_workloads(
        names or None,
        args.trace,
        max_requests=args.max_requests,
        scale_block=args.scale_block,
        seed=args.seed,
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plans = [
        (
            w,
            *plan_capacities(
                w,
                backends,
                capacity_tokens=_capacity(args),
                concurrency=args.concurrency,
                sweep_points=SWEEP_POINTS if sweep else 0,
            ),
        )
        for w in workloads
    ]
    runs = 1 + args.timing_repeats
    total = sum(len(w.requests) * len(backends) * (runs + len(caps)) for w, _, caps in plans)
    bar = progress(total, "compare", quiet=args.quiet)
    try:
        results = [
            compare_workload(
                w,
                backends,
                cap,
                caps,
                concurrency=args.concurrency,
                timing_repeats=args.timing_repeats,
                tick=bar.update,
            )
            for w, cap, caps in plans
        ]
    finally:
        bar.close()
    for r in results:
        print(report.workload_title(r))
        print(report.text_table(report.table_rows(r["backends"])))
        print()
    doc: dict[str, Any] = {
        "config": _compare_config(args, argv, backends, sweep),
        "machine": report.machine_info(),
        "versions": report.package_versions(),
        "workloads": results,
        "plots": {} if args.no_plots else _plots(results, out, args.quiet),
    }
    doc["elapsed_seconds"] = time.perf_counter() - t0
    report.write_results(out / "results.json", doc)
    report.write_report(out / "report.md", doc)
    print(
        f"wrote {out / 'report.md'}, {out / 'results.json'}"
        + ("" if args.no_plots else " and the plots")
    )
    return 0


def _compare_config(
    args: argparse.Namespace, argv: Sequence[str], backends: Sequence[BackendSpec], sweep: bool
) -> dict[str, Any]:
    return {
        "command": shlex.join(["prefixkv", *argv]),
        "backends": [
            {"label": b.label, "index": b.index, "block_size": b.block_size, "driver": b.driver}
            for b in backends
        ],
        "backends_described": [b.describe() for b in backends],
        "workloads": args.workload,
        "trace": args.trace,
        "capacity_tokens": args.capacity_tokens,
        "capacity_blocks": args.capacity_blocks,
        "capacity_rule": _capacity_rule(args),
        "capacity_sweep": sweep,
        "concurrency": args.concurrency,
        "max_requests": args.max_requests,
        "scale_block": args.scale_block,
        "seed": args.seed,
        "timing_repeats": args.timing_repeats,
        "timing": "hits and accounting from a replay with boundary accounting; index times "
        f"from {args.timing_repeats} more without it (garbage collector paused), each "
        "request's time the minimum over those",
    }


def _plots(results: list[dict[str, Any]], out: Path, quiet: bool) -> dict[str, Any]:
    from . import plots  # matplotlib only now, and only if plots are wanted

    bar = progress(plots.num_plots(results), "plots", quiet=quiet, unit="plot")
    try:
        return plots.write_plots(results, out, tick=bar.update)
    except ImportError:
        print(
            "prefixkv: plots skipped: matplotlib is not installed (pip install 'prefixkv[report]')",
            file=sys.stderr,
        )
        return {}
    finally:
        bar.close()


def _run_replay(args: argparse.Namespace, argv: Sequence[str]) -> int:
    specs = parse_backends(
        args.index, block_size=args.block_size, page_size=args.page_size, driver=args.driver
    )
    if len(specs) != 1:
        raise CompareError(f"replay takes one backend, got {args.index!r}")
    spec = specs[0]
    requests = load_any(
        args.trace, max_requests=args.max_requests, scale_block=args.scale_block, seed=args.seed
    )
    if not requests:
        raise CompareError(f"trace {args.trace} holds no request")
    capacity = _capacity(args)
    if capacity is None:
        capacity = roomy_capacity(requests, specs)
    num_blocks = spec.num_blocks(capacity)
    if num_blocks < 1:
        raise CompareError(f"capacity {capacity} tokens holds no {spec.block_size}-token block")
    bar = progress(len(requests), "replay", quiet=args.quiet)

    def advance(_count: int) -> None:
        bar.update(1)

    try:
        result = replay(
            requests,
            spec.make(),
            num_blocks,
            driver=spec.driver,
            concurrency=args.concurrency,
            on_request=advance,
        )
    except ReplayError as exc:
        raise ReplayError(
            f"capacity {capacity} tokens ({num_blocks} × {spec.block_size}-token blocks) is too "
            f"small at concurrency {args.concurrency}: {exc}"
        ) from None
    finally:
        bar.close()
    summary = result.summary()
    summary.update(
        {
            "trace": os.path.basename(args.trace),
            "config": {
                "command": shlex.join(["prefixkv", *argv]),
                "index": spec.index,
                "driver": spec.driver,
                "block_size": spec.block_size,
                "num_blocks": num_blocks,
                "capacity_tokens": num_blocks * spec.block_size,
                "concurrency": args.concurrency,
                "max_requests": args.max_requests,
                "scale_block": args.scale_block,
                "seed": args.seed,
                "prefixkv": report.package_versions()["prefixkv"],
                "python": sys.version.split()[0],
            },
        }
    )
    out = Path(args.out)
    report.write_hits(out, result.hits, summary)
    if not args.quiet:
        print(
            f"{summary['trace']} {spec.describe()} K={args.concurrency} "
            f"capacity={num_blocks * spec.block_size} tokens: hit {summary['total_hit_tokens']}"
            f"/{summary['total_prompt_tokens']} = {summary['hit_ratio']:.4f}, evicted "
            f"{summary['evicted_blocks']} blocks -> {out}"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``prefixkv`` command line; returns the exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 2 on any error (printed as one line on stderr), 130 when
        interrupted.
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
        if args.command == "compare":
            return _run_compare(args, args_list)
        return _run_replay(args, args_list)
    except SystemExit as exc:  # --help and --version exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("prefixkv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `prefixkv compare | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (PrefixKVError, OSError, ValueError) as exc:
        print(f"prefixkv: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.strerror or exc}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())
