"""``prefixkv compare``: backends head to head on workloads or a trace, at equal capacity
and, with ``--request-rate`` or ``--time-scale``, at arrival time; a table per workload,
the tidy tables, ``report.md``, ``results.json`` and plots."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import check_output_folder, install_file

from ..backends import parse_backends
from ..compare.options import CompareOptions
from ..compare.plan import SCHEDULERS, CompareSettings, plan_comparison
from ..compare.run import Comparison, WorkloadResult, run_comparison
from ..extras import require_extra
from ..outputs import compare as report
from ..outputs.markdown import machine_info, package_versions, text_table
from ..outputs.tables import write_json
from ..progress import progress
from ..sim import (
    ARRIVAL_PROCESSES,
    DEFAULT_PROFILE,
    QUEUE_ORDERS,
    CostProfile,
    load_profile,
)
from ..sim.model_config import ModelConfig
from ..workloads import DEFAULT_WORKLOADS
from . import common, flags
from .args import (
    CLIUsageError,
    distinct,
    positive_int,
)
from .signals import Interrupts


def add_arguments(cmp: argparse.ArgumentParser) -> None:
    """Give the ``compare`` subcommand's parser its description and flags."""
    cmp.description = (
        "Replay workloads (or a trace) through each backend at equal capacity, print a table "
        f"per workload and write a report. Default: the built-in set {', '.join(DEFAULT_WORKLOADS)}"
        " with a capacity sweep."
    )
    src = cmp.add_mutually_exclusive_group()
    flags.add_workload(src, many=True)
    flags.add_trace(src)
    flags.add_index(cmp, default=CompareOptions.indexes, many=True)
    flags.add_common(cmp, many=True)
    flags.add_seed(cmp, seeds="the built-in workloads, hash-id traces' tokens and Poisson arrivals")
    flags.add_quiet(cmp)
    _add_replay_flags(cmp)
    _add_time_flags(cmp)
    flags.add_model_flags(cmp)
    flags.add_no_plots(cmp)
    flags.add_out(cmp, folder="prefixkv-report")


def _add_replay_flags(cmp: argparse.ArgumentParser) -> None:
    """The extra replays: capacity sweep and search, timing repeats, boundary accounting."""
    cmp.add_argument(
        "--capacity-sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also replay at 7 capacities from tight to roomy and plot hit ratio vs capacity "
        "(default: on for the built-in set, off otherwise)",
    )
    cmp.add_argument(
        "--capacity-search",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="find each backend's working set (the smallest capacity reaching the infinite-cache "
        "hit ratio) and knee (98%% of it) by bisection over replays, to within 5%%: about 8-16 "
        "more replays a backend (default: on for built-in workloads, off for a trace)",
    )
    cmp.add_argument(
        "--timing-repeats",
        type=lambda t: positive_int(t) if t != "0" else 0,
        default=None,
        metavar="R",
        help="timed replays per backend; each request's index time is its minimum over them; "
        "0 times the accounting replay itself (default 3, 1 for a trace)",
    )
    cmp.add_argument(
        "--boundary-accounting",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay once more with the token-level mirror that counts matched-but-recomputed "
        "tokens (SPEC BB-8) (default: on, but off for hash-id traces, whose sharing stops at "
        "block boundaries by construction)",
    )


def _add_time_flags(p: argparse.ArgumentParser) -> None:
    """The arrival-time run's flags (they need --request-rate or --time-scale)."""
    g = p.add_argument_group(
        "arrival time (TTFT, queueing, GPU time): give --request-rate or --time-scale"
    )
    flags.add_rate_flags(
        g,
        runs="also run each backend at arrival time",
        spacing="Poisson or --arrival fixed",
        sweep="sweep the rate at the table's capacity, the first being the table's",
        auto="one replica has room and doubles until every backend is overloaded",
    )
    g.add_argument(
        "--arrival",
        choices=ARRIVAL_PROCESSES,
        help="with --request-rate: poisson (seeded by --seed; the default) or fixed spacing",
    )
    _add_scheduler_flags(g)
    flags.add_open_loop(g, given_only=True)
    flags.add_slo_flags(g)
    flags.add_profile(
        g,
        sizes="--capacity-tokens auto and --capacity-gib, and capacities beyond it warn",
        given_only=True,
    )


def _add_scheduler_flags(g: argparse._ArgumentGroup) -> None:
    """The engine's step: its batch limits, queue order and scheduler."""
    flags.add_engine_limits(g, given_only=True)
    g.add_argument(
        "--policy",
        choices=QUEUE_ORDERS,
        help="waiting-queue order for every backend: fcfs, or SGLang's cache-aware lpm "
        "(default: fcfs, both engines' default)",
    )
    g.add_argument(
        "--scheduler",
        type=_schedulers,
        metavar="LIST",
        help="the scheduler every backend runs under: vllm (prefill chunks and decodes mixed in "
        "one step; the default, so only the index varies), sglang (a prefill step whenever one "
        "fits, else a decode step), both as vllm,sglang (the scheduler becomes an axis), or "
        "natural (each backend on the engine it models: hash chain and none as vLLM, radix as "
        "SGLang; index and scheduler then move together)",
    )


def _schedulers(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    want = f"distinct names of {', '.join(SCHEDULERS)} (comma-separated)"
    return tuple(distinct(names, text, want, ok=set(names) <= set(SCHEDULERS)))


def run(args: argparse.Namespace, argv: Sequence[str], interrupts: Interrupts | None = None) -> int:
    """Run ``prefixkv compare``; returns the exit status (130 or 143: interrupted, partial).
    Plots' extra, backends and ``--out`` are checked before anything runs."""
    interrupts = interrupts or Interrupts()
    t0 = time.perf_counter()
    if not args.no_plots:
        require_extra("report", "compare's plots", ("matplotlib",), instead="(or give --no-plots)")
    parse_backends(
        args.index,
        block_size=args.block_size,
        page_size=args.page_size,
        options=common.backend_options(args),
    )
    given = [f for f in (args.profile, args.model_config) if f and os.path.exists(f)]
    out = check_output_folder(args.out, _OUTPUTS, [args.trace, *given])
    _check_time_flags(args)
    profile, model = common.apply_model(args, load_profile(args.profile or DEFAULT_PROFILE))
    options = _options(args, profile, model)
    timed = options.time_settings() is not None  # its values checked before any work
    names = [n for part in args.workload or [] for n in part.split(",") if n]
    workloads = common.load_workloads_for(args, names or None)
    caps = common.capacities(args, profile)
    options = dataclasses.replace(options, capacity_tokens=caps)
    if sizing := common.model_line(args, profile, model):
        print(f"capacity: {sizing}")
    settings = options.settings(workloads)
    rule = options.length_rule(settings)
    plans = plan_comparison(options.admitted(workloads, settings), settings)
    warnings: list[str] = []
    if timed or args.profile is not None or caps is not None or sizing:
        listed = caps or [p.capacity_tokens for p in plans]
        warnings = common.capacity_warnings(sorted(set(listed)), profile, args)

    comparison = run_comparison(
        plans,
        settings,
        bars=lambda desc, total: progress(total, desc, quiet=args.quiet, unit="tok"),
    )
    interrupts.held = True
    comparison.warnings[:0] = warnings
    for r in comparison.workloads:
        _print_workload(r)
    for line in comparison.warnings:
        print(f"prefixkv: warning: {line}", file=sys.stderr)
    config = _compare_config(args, argv, settings, caps)
    config["capacity_model"] = sizing
    config["admission"] = None if rule is None else rule.describe()
    return _write_outputs(args, out, comparison, config, t0, interrupts)


_OUTPUTS = (
    "results.json", "report.md", "requests.csv", "runs.csv", "requests.parquet",
    "runs.parquet", "hit_ratio_vs_capacity.png", "index_time_vs_prompt_length.png",
)  # fmt: skip
"""The files compare writes under these names (the per-workload plots add theirs)."""


def _print_workload(r: WorkloadResult) -> None:
    """One workload's K-live table, its notes and its arrival-time tables."""
    print(report.workload_title(r))
    if r.backends:
        print(text_table(report.table_rows(r.backends), report.COLUMNS))
    for note in r.notes:
        print(f"note: {note}")
    if r.anchors:
        print()
        print(text_table(report.anchor_rows(r), report.ANCHOR_COLUMNS))
        for line in report.capacity_lines(r):
            print(f"capacity: {line}")
    if arrival := r.arrival_at_table():
        print()
        print(report.time_title(r))
        print(text_table(report.time_rows(arrival), report.TIME_COLUMNS))
        for line in report.load_lines(r):
            print(f"load: {line}")
    if swept := report.rate_runs(r):
        print()
        print(f"{r.name}: request-rate sweep at {r.capacity_tokens:,} tokens")
        print(text_table(report.rate_rows(swept), report.RATE_COLUMNS))
        for line in report.saturation_lines(r):
            print(f"saturation: {line}")
    print()


def _write_outputs(
    args: argparse.Namespace,
    out: Path,
    comparison: Comparison,
    config: dict[str, Any],
    t0: float,
    interrupts: Interrupts,
) -> int:
    """Tables, plots, ``results.json`` and ``report.md``, each whole; a signal stops only plots."""
    interrupted = comparison.partial or interrupts.received
    results = comparison.workloads
    meta: dict[str, Any] = {
        "config": config,
        "machine": machine_info(),
        "versions": package_versions(),
        "partial": interrupted,
        "warnings": list(comparison.warnings),
        "plots": {},
        "tables": {},
    }
    try:  # called without main()'s handler, a signal leaves each file whole or absent
        if results:
            report.write_compare_tables(comparison, out, meta["tables"])
        if not interrupted and not args.no_plots and results:
            meta["plots"] = _plots(results, out, args.quiet, interrupts)
    except KeyboardInterrupt:
        interrupted = meta["partial"] = True
    meta["elapsed_seconds"] = time.perf_counter() - t0
    write_json(out / "results.json", report.results_document(comparison, meta))
    report.write_report(out / "report.md", results, meta)
    what = "partial results (interrupted)" if interrupted else "the results"
    files = [out / "report.md", out / "results.json", *(out / f for f in meta["tables"].values())]
    print(
        f"wrote {what} to {', '.join(str(f) for f in files)}"
        + (" and the plots" if meta["plots"] else "")
    )
    return interrupts.status() if interrupted else 0


_TIME_KNOBS = (
    "arrival",
    "max_num_seqs",
    "max_num_batched_tokens",
    "policy",
    "scheduler",
    "open_loop",
    "slo_ttft",
    "slo_tpot",
    "slo_e2el",
)
"""The arrival-time flags, each refused without --request-rate or --time-scale."""


def _check_time_flags(args: argparse.Namespace) -> None:
    """The arrival-time flags go together: refused alone or in a pair that clashes."""
    if args.request_rate is None and args.time_scale is None:
        given = ", ".join(
            "--" + k.replace("_", "-") for k in _TIME_KNOBS if getattr(args, k) is not None
        )
        if given:
            raise CLIUsageError(f"{given} need --request-rate or --time-scale")
    elif args.arrival is not None and args.request_rate is None:
        raise CLIUsageError("--arrival goes with --request-rate (--time-scale keeps the trace's)")


def _options(
    args: argparse.Namespace, profile: CostProfile, model: ModelConfig | None
) -> CompareOptions:
    """The flags as :class:`CompareOptions`; a flag not given takes the option's default."""
    rates, repeats = args.request_rate, args.timing_repeats
    listed = [] if rates is None or rates == "auto" else list(rates)
    fields: dict[str, Any] = {name: getattr(args, name) for name in _SAME_NAMED}
    fields.update(
        workloads=args.workload,
        indexes=args.index,
        index_options=common.backend_options(args),
        timing_repeats=(1 if args.trace is not None else 3) if repeats is None else repeats,
        request_rate=listed[0] if listed else None,
        rate_sweep="auto" if rates == "auto" else listed[1:],
        slo=common.slo_of(args),
        queue_order=args.policy,
        schedulers=args.scheduler,
        closed_loop=not args.open_loop,
        profile=profile,
        max_model_len=common.max_model_len(args, model),
    )
    return CompareOptions(**{k: v for k, v in fields.items() if v is not None})


_SAME_NAMED = (
    "trace", "block_size", "page_size", "capacity_sweep", "capacity_search", "max_pool_blocks",
    "concurrency", "boundary_accounting", "time_scale", "arrival", "max_num_seqs",
    "max_num_batched_tokens", "on_long_request", "seed",
)  # fmt: skip
"""The flags named as the :class:`CompareOptions` fields they set."""


def _compare_config(
    args: argparse.Namespace,
    argv: Sequence[str],
    compare: CompareSettings,
    caps: Sequence[int] | None,
) -> dict[str, Any]:
    """The run's configuration as ``results.json`` and ``report.md`` record it."""
    backends, repeats, settings = compare.backends, compare.timing_repeats, compare.time
    config: dict[str, Any] = {
        "command": shlex.join(["prefixkv", *argv]),
        "backends": ",".join(b.label for b in backends),
        "backends_described": [b.describe() for b in backends],
        "workloads": ",".join(args.workload) if args.workload else None,
        "trace": args.trace,
        "trace_format": args.trace_format,
        "capacity_tokens": None if caps is None else ",".join(str(c) for c in caps),
        "capacity_blocks": args.capacity_blocks,
        "capacity_rule": _capacity_rule(args, caps),
        "capacity_sweep": compare.capacity_sweep,
        "concurrency": args.concurrency,
        "max_requests": args.max_requests,
        "tokens_per_id": args.tokens_per_id,
        "seed": args.seed,
        "timing_repeats": repeats,
        "boundary_accounting": compare.boundary_accounting,
        "timing": (
            f"hits and accounting from a replay with boundary accounting; index times from "
            f"{repeats} more without it (garbage collected between requests only), each "
            "request's time the minimum over those"
            if repeats
            else "hits, accounting and index times from one replay (times include the "
            "accounting's own cost)"
        ),
    }
    if settings is not None:
        prof = settings.profile
        config.update(
            settings.row(),
            engines=[settings.describe_engine(b, s) for s in settings.schedulers for b in backends],
            schedulers=",".join(settings.schedulers),
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            policy=settings.queue_order,
            batching=settings.batching,
            profile_model=prof.model,
            profile_device=prof.device,
            profile_source=prof.source,
        )
    return config


def _capacity_rule(args: argparse.Namespace, caps: Sequence[int] | None) -> str:
    """How the capacities were chosen, as the report says it."""
    if args.capacity_tokens == "auto" and caps:
        return (
            f"auto: {caps[0]:,} tokens, what the profile's hardware holds at "
            f"--gpu-memory-utilization {common.memory_utilization(args):g}"
        )
    if args.capacity_gib is not None and caps:
        gib = ", ".join(f"{g:g}" for g in args.capacity_gib)
        return f"{gib} GiB of KV = {', '.join(f'{c:,}' for c in caps)} tokens"
    if listed := args.capacity_tokens:
        swept = ", ".join(f"{c:,}" for c in listed)
        sweep = f"; sweep at {swept} tokens" if len(listed) > 1 else ""
        return f"{listed[0]:,} tokens for every backend{sweep}"
    if args.capacity_blocks is not None:
        return (
            f"{args.capacity_blocks:,} blocks of {args.block_size} tokens = "
            f"{args.capacity_blocks * args.block_size:,} tokens for every backend"
        )
    return "roomy: every request's prompt and output plus two blocks, so nothing is evicted"


def _plots(
    results: list[WorkloadResult], out: Path, quiet: bool, interrupts: Interrupts
) -> dict[str, str]:
    """The plots, each whole or absent; held signals stop them between two."""
    from ..outputs import plots  # matplotlib only now, and only if plots are wanted

    bar = progress(plots.num_plots(results), "plots", quiet=quiet, unit="plot")

    def tick(n: int) -> None:
        bar.update(n)
        if interrupts.received:
            raise KeyboardInterrupt

    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".plots-", dir=out))
    try:
        written = plots.write_plots(results, staging, tick=tick)
        for f in staging.iterdir():
            install_file(f, out / f.name)
        return written
    finally:
        bar.close()
        shutil.rmtree(staging, ignore_errors=True)
