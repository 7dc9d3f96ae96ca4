"""A comparison's run: every planned workload, each backend K-live and at arrival time.

:func:`run_comparison` runs the plans of :mod:`.plan`; per workload,
:func:`compare_workload` gives each backend's K-live replay (:mod:`.k_live`), the
capacity sweep, and (with :class:`~.arrival.TimeSettings`) each backend's arrival-time
run (:mod:`.arrival`), with ``--request-rate 1,2,4,8`` (or ``auto``) every backend at
each rate too, at the table's capacity (role ``rate``; the walk over rates and the
overload verdict are :mod:`~..sim.rate_sweep`'s, which ``cluster`` shares). Ctrl-C keeps
what finished, marked partial. The typed records
give tidy tables: one row per request x backend x configuration, one per run, as
pandas DataFrames when pandas is installed.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..backends import BackendSpec, Bars, CapacityError, Scalar
from ..extras import has_extra
from ..replay import ReplayInterrupted
from ..sim import ProfileRangeWarning, SimUnservableError
from ..sim.load import LoadSummary
from ..sim.rate_sweep import Saturation, rate_schedule, saturation_of, start_rate, sweep_rates
from ..sim.runs import KLiveHits, RunRow, SweepHit, run_table
from ..workloads import Workload
from .anchors import CapacityAnchor, knee
from .arrival import Scheduler, TimeSettings, run_arrival
from .capacity_search import KNEE_SHARE, CapacitySearch
from .k_live import run_backend, run_sweep, select_strip_requests
from .plan import CompareSettings, WorkloadPlan, min_capacity, roomy_capacity

__all__ = [
    "CompareInterrupted",
    "Comparison",
    "ComparisonTables",
    "WorkloadResult",
    "compare_workload",
    "run_comparison",
    "saturation",
]


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C during a comparison; ``workload`` holds what finished so far."""

    def __init__(self, workload: WorkloadResult) -> None:
        super().__init__("comparison interrupted")
        self.workload = workload


@dataclass(slots=True)
class WorkloadResult:
    """Everything a comparison measured on one workload.

    Attributes:
        name, source, notes: the workload, where it came from, what the report
            must say about it.
        num_requests, prompt_tokens, output_tokens: its sizes.
        capacity_tokens: the capacity of the table (asked for; each backend uses
            the whole blocks that fit).
        concurrency: the K of the K-live schedule.
        backends: each backend's K-live replay at ``capacity_tokens``.
        sweep: K-live hit ratios at the sweep's capacities (empty: no sweep).
        strip_requests: positions of the requests the strip plot shows.
        arrival_runs: arrival-time runs, the table's capacity first, then the
            sweep's (empty without :class:`~.arrival.TimeSettings`).
        anchors: per backend, the infinite-cache hit ratio and the sweep's knee.
        partial: Ctrl-C stopped it; what is here finished.
        rejected_requests: requests left out for their length before any run, as
            vLLM refuses them (``num_requests`` are the others).
    """

    name: str
    source: str
    notes: tuple[str, ...]
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    capacity_tokens: int
    concurrency: int
    backends: list[RunRow] = field(default_factory=list)
    sweep: list[RunRow] = field(default_factory=list)
    strip_requests: list[int] = field(default_factory=list)
    arrival_runs: list[RunRow] = field(default_factory=list)
    anchors: list[CapacityAnchor] = field(default_factory=list)
    partial: bool = False
    rejected_requests: int = 0

    @property
    def sweep_capacities(self) -> list[int]:
        """The sweep's capacities, ascending."""
        return sorted({p.labels["capacity_tokens"] for p in self.sweep})

    def arrival_at_table(self) -> list[RunRow]:
        """The arrival-time runs at the table's capacity, one per backend and scheduler."""
        return [t for t in self.arrival_runs if t.labels["role"] == "table"]

    def row(self) -> dict[str, Scalar]:
        """The workload as one flat record."""
        return {
            "workload": self.name,
            "source": self.source,
            "notes": " ".join(self.notes),
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "capacity_tokens": self.capacity_tokens,
            "concurrency": self.concurrency,
            "partial": self.partial,
            "rejected_requests": self.rejected_requests,
        }

    @property
    def runs(self) -> list[RunRow]:
        """Every run, in the tables' order: K-live table, K-live sweep, arrival time."""
        return [*self.backends, *self.sweep, *self.arrival_runs]


def compare_workload(
    plan: WorkloadPlan, settings: CompareSettings, *, bars: Bars | None = None
) -> WorkloadResult:
    """Every backend on one planned workload: :func:`run_backend` each at the plan's
    capacity, the plan's sweep, the capacity anchors (GiB by the settings' profile's KV
    bytes per token, else the arrival-time runs'; with ``capacity_search`` the working
    set and knee by bisection), then (with ``settings.time``) each backend's
    arrival-time run at the table's capacity and at each capacity of the sweep.

    Raises:
        CapacityError: the plan's capacity cannot hold the requests (the sweep's
            capacities never raise; a failed point is ``None``, a failed
            arrival-time point is left out).
        CompareInterrupted: Ctrl-C; it carries what finished so far.
    """
    workload, backends, k = plan.workload, settings.backends, settings.concurrency
    result = _empty_result(workload, plan.capacity_tokens, k)
    try:
        for b in backends:
            result.backends.append(
                run_backend(
                    workload,
                    b,
                    plan.capacity_tokens,
                    concurrency=k,
                    timing_repeats=settings.timing_repeats,
                    boundary_accounting=settings.boundary_accounting,
                    bars=bars,
                )
            )
        result.strip_requests = select_strip_requests(result.backends)
        if plan.sweep:
            result.sweep = run_sweep(workload, backends, plan.sweep, concurrency=k, bars=bars)
        result.anchors = _anchors(result, workload, settings, bars)
        if settings.time is not None:
            _run_arrival_all(result, plan, backends, settings.time, bars)
    except (ReplayInterrupted, KeyboardInterrupt):
        result.partial = True
        if result.backends:
            result.strip_requests = select_strip_requests(result.backends)
        raise CompareInterrupted(result) from None
    return result


def _empty_result(workload: Workload, capacity_tokens: int, concurrency: int) -> WorkloadResult:
    """The workload's result before any run: what it is and at which capacity."""
    return WorkloadResult(
        name=workload.name,
        source=workload.source,
        notes=tuple(workload.notes),
        num_requests=workload.stats.num_requests,
        prompt_tokens=workload.stats.prompt_tokens,
        output_tokens=workload.stats.output_tokens,
        capacity_tokens=capacity_tokens,
        concurrency=concurrency,
        rejected_requests=workload.rejected_requests,
    )


def _anchors(
    result: WorkloadResult, workload: Workload, settings: CompareSettings, bars: Bars | None
) -> list[CapacityAnchor]:
    backends, concurrency = settings.backends, settings.concurrency
    profile = settings.profile or (settings.time.profile if settings.time else None)
    roomy = roomy_capacity(workload.stats, backends)
    out = []
    for b, run in zip(backends, result.backends, strict=True):
        points = _sweep_points(result.sweep, b.label)
        at_roomy = [h for c, h in points if c >= roomy]
        table_hit = run.part(KLiveHits).hit_ratio
        if result.capacity_tokens >= roomy:
            infinite = table_hit
        elif at_roomy:
            infinite = at_roomy[-1]
        else:  # one more replay, with nothing evicted
            infinite = run_backend(
                workload, b, roomy, concurrency=concurrency, timing_repeats=0,
                boundary_accounting=False, bars=bars,
            ).part(KLiveHits).hit_ratio  # fmt: skip
        bend = knee(points)
        working_set: int | None = None
        rule, replays = "kneedle", 0
        if settings.capacity_search:
            finder = CapacitySearch(
                functools.partial(_hit_ratio, workload, b, concurrency=concurrency, bars=bars),
                [*points, (result.capacity_tokens, table_hit), (roomy, infinite)],
            )
            tight = min_capacity(workload.stats, backends, concurrency)
            working_set = finder.smallest(infinite, tight, roomy)
            knee_at = finder.smallest(KNEE_SHARE * infinite, tight, working_set)
            bend = (knee_at, finder.hit_at(knee_at) or 0.0)
            rule, replays = f"{KNEE_SHARE:.0%} of the infinite-cache hit ratio", finder.replays
        out.append(
            CapacityAnchor(
                workload=workload.name,
                backend=b.label,
                block_size=b.block_size,
                infinite_capacity_tokens=roomy,
                infinite_hit_ratio=infinite,
                knee_tokens=None if bend is None else bend[0],
                knee_hit_ratio=None if bend is None else bend[1],
                kv_bytes_per_token=None if profile is None else profile.kv_bytes_per_token,
                model="" if profile is None else profile.model,
                num_points=len(points),
                working_set_tokens=working_set,
                knee_rule=rule,
                search_replays=replays,
            )
        )
    return out


def _sweep_points(sweep: Sequence[RunRow], label: str) -> list[tuple[int, float]]:
    """The sweep's (capacity, hit ratio) points of backend ``label`` that fit."""
    return [
        (p.labels["capacity_tokens"], hit)
        for p in sweep
        if p.labels["backend"] == label and (hit := p.part(SweepHit).hit_ratio) is not None
    ]


def _hit_ratio(
    workload: Workload, spec: BackendSpec, capacity: int, *, concurrency: int, bars: Bars | None
) -> float | None:
    (point,) = run_sweep(workload, [spec], [capacity], concurrency=concurrency, bars=bars)
    return point.part(SweepHit).hit_ratio


def _run_arrival_all(
    result: WorkloadResult,
    plan: WorkloadPlan,
    backends: Sequence[BackendSpec],
    time: TimeSettings,
    bars: Bars | None,
) -> None:
    workload, capacity_tokens = plan.workload, plan.capacity_tokens
    if time.auto_rates and time.request_rate is None:
        first = start_rate(workload.stats, time.profile, time.max_num_batched_tokens)
        time = dataclasses.replace(time, request_rate=first)
    for scheduler in time.schedulers:
        table = []
        for b in backends:
            try:
                run = run_arrival(
                    workload, b, capacity_tokens, time, bars=bars, scheduler=scheduler
                )
            except SimUnservableError as exc:
                raise CapacityError(
                    f"capacity {capacity_tokens:,} tokens is too small for {workload.name!r} "
                    f"with {b.label} in the arrival-time run: {exc}"
                ) from None
            table.append(run)
            result.arrival_runs.append(run)
        if time.rates or time.auto_rates:
            args = (workload, backends, capacity_tokens, time, scheduler)
            _run_rate_sweep(*args, table, bars, into=result.arrival_runs)
    for cap in plan.sweep:
        if cap == capacity_tokens:
            continue  # the table's run is that point
        for scheduler in time.schedulers:
            for b in backends:
                try:
                    result.arrival_runs.append(
                        run_arrival(
                            workload, b, cap, time, role="sweep", bars=bars, scheduler=scheduler
                        )
                    )
                except SimUnservableError:
                    continue  # a point that does not fit is left out (plotted as a gap)


def _run_rate_sweep(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacity_tokens: int,
    settings: TimeSettings,
    scheduler: Scheduler,
    table: Sequence[RunRow],
    bars: Bars | None,
    *,
    into: list[RunRow],
) -> None:
    """Each backend at each rate of the sweep (role ``rate``), under ``scheduler``.

    Listed rates all run; ``auto`` doubles from ``settings.request_rate`` and stops a
    backend at its first overloaded rate. The ``table``'s runs are not made again, but
    count for ``auto``. A rate at which a request cannot fit is left out. Each run is
    appended to ``into`` as it finishes, so Ctrl-C keeps the finished ones.
    """
    first = settings.request_rate
    rates = rate_schedule(first or 1.0, auto=True) if settings.auto_rates else sorted(
        {*settings.rates, *([] if first is None else [first])}
    )  # fmt: skip
    by_label = {b.label: b for b in backends}

    def run(label: str, rate: float) -> RunRow | None:
        point = dataclasses.replace(settings, request_rate=rate, rates=(), auto_rates=False)
        try:
            return run_arrival(
                workload, by_label[label], capacity_tokens, point, role="rate", bars=bars,
                scheduler=scheduler,
            )  # fmt: skip
        except SimUnservableError:
            return None

    made = {(r.labels["backend"], r.labels["request_rate"] or 0.0): r for r in table}
    into.extend(
        sweep_rates(
            list(by_label), rates, run, lambda r: r.part(LoadSummary).overloaded,
            auto=settings.auto_rates, done=made,
        )
    )  # fmt: skip


def saturation(runs: Sequence[RunRow]) -> list[Saturation]:
    """Per backend and engine, where the sweep's runs (any roles) saturate it."""
    return saturation_of(
        (f"{r.labels['backend']} as {r.labels['engine']}", rate, r.part(LoadSummary))
        for r in runs
        if (rate := r.labels["request_rate"]) is not None
    )


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
        warnings: what the reader must know, once each (a profile extrapolated past
            its measured range, a capacity no hardware of the profile holds).
    """

    workloads: list[WorkloadResult] = field(default_factory=list)
    partial: bool = False
    warnings: list[str] = field(default_factory=list)

    def run_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per run."""
        return run_table(r for w in self.workloads for r in w.runs)

    def request_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per request x backend x configuration."""
        return [row for w in self.workloads for r in w.runs for row in r.request_rows()]

    def tables(self) -> ComparisonTables:
        """The tidy tables: DataFrames when pandas is installed, row lists otherwise."""
        requests: Any = self.request_rows()
        runs: Any = self.run_rows()
        if not has_extra("pandas"):
            return ComparisonTables(requests, runs, self)
        import pandas

        return ComparisonTables(pandas.DataFrame(requests), pandas.DataFrame(runs), self)


def run_comparison(
    plans: Sequence[WorkloadPlan], settings: CompareSettings, *, bars: Bars | None = None
) -> Comparison:
    """Run every planned workload; Ctrl-C ends it early with what finished, marked partial.

    Raises:
        CapacityError: a table capacity too small for a workload's requests.
    """
    comparison = Comparison()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ProfileRangeWarning)
        try:
            for plan in plans:
                comparison.workloads.append(compare_workload(plan, settings, bars=bars))
        except CompareInterrupted as exc:
            comparison.partial = True
            if exc.workload.backends:
                comparison.workloads.append(exc.workload)
    for w in caught:  # a profile's range once for the whole comparison; others as they were
        if not issubclass(w.category, ProfileRangeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    comparison.warnings += _range_notes(comparison)
    return comparison


def _range_notes(comparison: Comparison) -> list[str]:
    """One line per profile that a run took past its measured range, with the
    farthest each quantity went (a run's note: ``"<what> up to N, measured up to M
    (Fx)"`` per quantity, ``; ``-joined)."""
    runs: dict[str, int] = {}
    farthest: dict[str, dict[str, tuple[int, str]]] = {}
    for w in comparison.workloads:
        for t in w.arrival_runs:
            note = str(t.labels["profile_range"])
            if not note:
                continue
            name = str(t.labels["profile"])
            runs[name] = runs.get(name, 0) + 1
            for phrase in note.split("; "):
                what, _, rest = phrase.partition(" up to ")
                value = int("".join(ch for ch in rest.split(", measured")[0] if ch.isdigit()))
                best = farthest.setdefault(name, {}).get(what)
                if best is None or value > best[0]:
                    farthest[name][what] = (value, phrase)
    return [
        f"profile {name!r} extrapolated beyond its measured range in {runs[name]} "
        f"arrival-time run(s): {'; '.join(p for _, p in farthest[name].values())}; "
        "its times there extrapolate the fit"
        for name in runs
    ]
