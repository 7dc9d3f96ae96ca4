"""A whole comparison: its options, its plan, its run, and its tables as DataFrames.

``prefixkv compare`` and the Python entry point :func:`compare_backends` share this:
options name the backends, the capacity (or a sweep), the K-live schedule and,
optionally, the arrival-time runs (:class:`~.timed.TimeSettings`); the plan fixes each
workload's capacities and refuses what cannot run before anything does; the run
gives typed records whose tidy rows load into pandas as one row per request x
backend x configuration, and one row per run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .compare import (
    MAX_POOL_BLOCKS,
    BackendSpec,
    Bars,
    CompareError,
    CompareInterrupted,
    WorkloadResult,
    check_pool,
    compare_workload,
    parse_backends,
    plan_capacities,
)
from .progress import progress
from .sim import ArrivalProcess, Batching, CostProfile, QueueOrder, load_profile
from .timed import Scalar, TimeSettings, check_arrivals
from .traces import ReadOptions
from .workload_sources import Workload, load_workloads

__all__ = [
    "SWEEP_POINTS",
    "CompareOptions",
    "Comparison",
    "ComparisonTables",
    "WorkloadPlan",
    "compare_backends",
    "default_boundary_accounting",
    "plan_comparison",
    "run_comparison",
]

SWEEP_POINTS = 7
"""Capacities of a sweep from tight to roomy, when none are listed."""


@dataclass(frozen=True)
class CompareOptions:
    """What a comparison runs.

    Attributes:
        backends: the backends, in table order.
        capacities: KV capacities in tokens; the first is the table's, and several
            are the sweep's. ``None``: roomy (nothing is evicted).
        capacity_sweep: also sweep capacities (the listed ones, or
            :data:`SWEEP_POINTS` from tight to roomy).
        concurrency: the K of the K-live schedule.
        timing_repeats: timed K-live replays per backend.
        boundary_accounting: count matched-but-recomputed tokens (SPEC BB-8).
        time: arrival-time runs (``None``: none).
        max_pool_blocks: refuse a capacity of more blocks than this.

    Raises:
        CompareError: no backend, a non-positive capacity, concurrency or limit.
    """

    backends: tuple[BackendSpec, ...]
    capacities: tuple[int, ...] | None = None
    capacity_sweep: bool = False
    concurrency: int = 1
    timing_repeats: int = 1
    boundary_accounting: bool = True
    time: TimeSettings | None = None
    max_pool_blocks: int = MAX_POOL_BLOCKS

    def __post_init__(self) -> None:
        if not self.backends:
            raise CompareError("no backend to compare")
        for name in ("concurrency", "max_pool_blocks"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise CompareError(f"{name} must be a positive int, got {value!r}")
        if self.capacities is not None and (
            not self.capacities or any(type(c) is not int or c < 1 for c in self.capacities)
        ):
            raise CompareError(f"capacities must be positive ints, got {self.capacities!r}")

    @property
    def listed_sweep(self) -> bool:
        """Whether the sweep's capacities are the listed ones."""
        return self.capacities is not None and len(self.capacities) > 1


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    """One workload's capacities, checked.

    Attributes:
        workload: the requests.
        capacity_tokens: the table's capacity.
        sweep: the sweep's capacities, ascending (empty: no sweep).
    """

    workload: Workload
    capacity_tokens: int
    sweep: list[int]


def default_boundary_accounting(workloads: Sequence[Workload]) -> bool:
    """On, except for hash-id traces (their sharing stops at block boundaries by
    construction, so the accounting's extra replay would only measure zeros)."""
    return all(w.tokens_per_id is None for w in workloads)


def plan_comparison(workloads: Sequence[Workload], options: CompareOptions) -> list[WorkloadPlan]:
    """Fix each workload's capacities and refuse, before anything runs, what cannot run.

    Raises:
        CapacityError: a capacity that holds no block or too many.
        SimConfigError: ``--time-scale`` for requests without a usable clock.
    """
    caps = options.capacities
    plans = []
    for w in workloads:
        cap, points = plan_capacities(
            w,
            options.backends,
            capacity_tokens=None if caps is None else caps[0],
            concurrency=options.concurrency,
            sweep_points=SWEEP_POINTS if options.capacity_sweep and not options.listed_sweep else 0,
        )
        if options.capacity_sweep and caps is not None and options.listed_sweep:
            points = sorted(caps)
        for c in [cap, *points]:
            check_pool(c, options.backends, options.max_pool_blocks)
        if options.time is not None:
            check_arrivals(w, options.time)
        plans.append(WorkloadPlan(w, cap, points))
    return plans


class ComparisonTables(NamedTuple):
    """A comparison's tidy tables.

    Attributes:
        requests: one row per request x backend x configuration (``schedule`` is
            ``k_live`` or ``arrival``; ``role`` is ``table`` or ``sweep``).
        runs: one row per run.
        comparison: the typed records behind them.

    ``requests`` and ``runs`` are pandas DataFrames when pandas is installed, lists
    of flat dicts otherwise.
    """

    requests: Any
    runs: Any
    comparison: Comparison


@dataclass
class Comparison:
    """What a comparison measured.

    Attributes:
        workloads: per workload, every run's records.
        partial: Ctrl-C stopped it; what is here finished.
    """

    workloads: list[WorkloadResult] = field(default_factory=list)
    partial: bool = False

    def run_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per run."""
        return [row for w in self.workloads for row in w.run_rows()]

    def request_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per request x backend x configuration."""
        return [row for w in self.workloads for row in w.request_rows()]

    def tables(self) -> ComparisonTables:
        """The tidy tables: DataFrames when pandas is installed, row lists otherwise."""
        requests: Any = self.request_rows()
        runs: Any = self.run_rows()
        try:
            import pandas
        except ImportError:
            return ComparisonTables(requests, runs, self)
        return ComparisonTables(pandas.DataFrame(requests), pandas.DataFrame(runs), self)


def run_comparison(
    plans: Sequence[WorkloadPlan], options: CompareOptions, *, bars: Bars | None = None
) -> Comparison:
    """Run every planned workload; Ctrl-C ends it early with what finished, marked partial.

    Raises:
        CapacityError: a table capacity too small for a workload's requests.
    """
    comparison = Comparison()
    try:
        for plan in plans:
            comparison.workloads.append(
                compare_workload(
                    plan.workload,
                    options.backends,
                    plan.capacity_tokens,
                    plan.sweep,
                    concurrency=options.concurrency,
                    timing_repeats=options.timing_repeats,
                    boundary_accounting=options.boundary_accounting,
                    time=options.time,
                    bars=bars,
                )
            )
    except CompareInterrupted as exc:
        comparison.partial = True
        if exc.workload.backends:
            comparison.workloads.append(exc.workload)
    return comparison


def compare_backends(
    workloads: Sequence[str] | None = None,
    *,
    trace: str | os.PathLike[str] | None = None,
    indexes: str = "hash_chain,radix,none",
    capacity_tokens: int | Sequence[int] | None = None,
    capacity_sweep: bool | None = None,
    concurrency: int = 1,
    request_rate: float | None = None,
    time_scale: float | None = None,
    arrival: ArrivalProcess = "poisson",
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    policy: QueueOrder | None = None,
    batching: Batching | None = None,
    profile: str | os.PathLike[str] | CostProfile | None = None,
    block_size: int = 16,
    page_size: int = 1,
    index_options: Mapping[str, Mapping[str, Any]] | None = None,
    max_requests: int | None = None,
    tokens_per_id: int | None = None,
    seed: int = 0,
    timing_repeats: int = 1,
    boundary_accounting: bool | None = None,
    progress_bars: bool = False,
) -> ComparisonTables:
    """Compare backends on built-in workloads or a trace; return the tidy tables.

    What ``prefixkv compare`` runs, without files: each backend's K-live replay at
    equal capacity and, with ``request_rate`` or ``time_scale``, its arrival-time
    run on its natural engine (hash chain as vLLM, radix as SGLang).

    Args:
        workloads: built-in workload names (default: the CLI's default set when no
            trace is given).
        trace: a trace file or folder instead (any format ``prefixkv`` reads).
        indexes: comma-separated backends, ``NAME`` or ``NAME:SIZE``.
        capacity_tokens: the KV capacity in tokens, or several (a sweep, the first
            being the table's); default roomy.
        capacity_sweep: also sweep capacities (default: when several are given).
        concurrency: the K of the K-live schedule.
        request_rate: arrival-time runs at this many requests per second.
        time_scale: arrival-time runs at the trace's timestamps times this.
        arrival: ``"poisson"`` or ``"fixed"`` (with ``request_rate``).
        max_num_seqs: most running requests.
        max_num_batched_tokens: most tokens a step computes.
        policy: force ``"fcfs"`` or ``"lpm"`` (default: each engine's, fcfs).
        batching: force ``"mixed"`` or ``"prefill_first"`` (default: each
            backend's natural engine's).
        profile: a cost profile, a shipped profile's name or a profile file
            (default: the shipped default).
        block_size: the hash chain's (and ``none``'s) block size.
        page_size: the radix tree's page size.
        index_options: per registry name, options for ``make_index``.
        max_requests: use the first this many requests of each workload.
        tokens_per_id: hash-id traces: tokens each id expands to.
        seed: workload, token and arrival seed.
        timing_repeats: timed K-live replays per backend.
        boundary_accounting: BB-8 accounting (default: on, off for hash-id traces).
        progress_bars: show progress bars on stderr (tqdm).

    Returns:
        The tables (DataFrames when pandas is installed) and the typed records.

    Raises:
        PrefixKVError: a bad option, workload, trace or capacity (a named subclass).
        KeyboardInterrupt: Ctrl-C.
    """
    backends = parse_backends(
        indexes, block_size=block_size, page_size=page_size, options=index_options
    )
    time: TimeSettings | None = None
    if request_rate is not None or time_scale is not None:
        if isinstance(profile, CostProfile):
            prof = profile
        else:
            prof = load_profile() if profile is None else load_profile(profile)
        time = TimeSettings(
            request_rate=request_rate,
            time_scale=time_scale,
            arrival=arrival,
            seed=seed,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            policy=policy,
            batching=batching,
            profile=prof,
        )
    loaded = load_workloads(
        list(workloads) if workloads else None,
        None if trace is None else os.fspath(trace),
        max_requests=max_requests,
        tokens_per_id=tokens_per_id,
        seed=seed,
        options=ReadOptions(seed=seed),
        quiet=not progress_bars,
    )
    caps = None
    if capacity_tokens is not None:
        caps = (capacity_tokens,) if isinstance(capacity_tokens, int) else tuple(capacity_tokens)
    options = CompareOptions(
        backends=tuple(backends),
        capacities=caps,
        capacity_sweep=(caps is not None and len(caps) > 1)
        if capacity_sweep is None
        else capacity_sweep,
        concurrency=concurrency,
        timing_repeats=timing_repeats,
        boundary_accounting=default_boundary_accounting(loaded)
        if boundary_accounting is None
        else boundary_accounting,
        time=time,
    )
    plans = plan_comparison(loaded, options)

    def bars(desc: str, total: int) -> Any:
        return progress(total, desc, quiet=not progress_bars, unit="tok")

    comparison = run_comparison(plans, options, bars=bars)
    if comparison.partial:
        raise KeyboardInterrupt("comparison interrupted")
    return comparison.tables()
