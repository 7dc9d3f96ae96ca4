"""A comparison's run: per planned workload each backend K-live (the table, the capacity
sweep, the anchors), then at arrival time (the table's capacity, the sweep's, the request
rates). Ctrl-C keeps what finished, marked partial.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..backends import BackendSpec, Bars, CapacityError, Scalar
from ..extras import has_extra
from ..replay import ReplayInterrupted
from ..sim import ProfileRangeWarning, SimUnservableError
from ..sim.load import LoadSummary
from ..sim.rate_sweep import rate_schedule, start_rate, sweep_rates
from ..sim.runs import RunRow, run_table
from ..workloads import Workload
from .anchors import CapacityAnchor, workload_anchors
from .arrival import Scheduler, TimeSettings, run_arrival
from .k_live import run_backend, run_sweep, select_strip_requests
from .plan import CompareSettings, WorkloadPlan

__all__ = ["Comparison", "ComparisonTables", "WorkloadResult", "run_comparison"]


class _Interrupted(KeyboardInterrupt):
    """Ctrl-C during a workload; ``workload`` holds what finished."""

    def __init__(self, workload: WorkloadResult) -> None:
        super().__init__("comparison interrupted")
        self.workload = workload


@dataclass(slots=True)
class WorkloadResult:
    """Everything a comparison measured on one workload: each backend's K-live run at the
    table's ``capacity_tokens`` (``backends``), the ``sweep``'s, the ``anchors``, the
    ``arrival_runs`` (the table's capacity first); ``partial`` when Ctrl-C stopped it.

    Attributes:
        num_requests: the requests run; ``rejected_requests`` excluded.
        capacity_tokens: the capacity asked for (each backend uses the whole blocks that fit).
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


def _compare_workload(
    plan: WorkloadPlan, settings: CompareSettings, bars: Bars | None
) -> WorkloadResult:
    """Every backend on one planned workload.

    Raises:
        CapacityError: the plan's capacity cannot hold the requests.
        _Interrupted: Ctrl-C, with what finished.
    """
    w, backends, k = plan.workload, settings.backends, settings.concurrency
    stats = w.stats
    result = WorkloadResult(
        w.name, w.source, tuple(w.notes), stats.num_requests, stats.prompt_tokens,
        stats.output_tokens, plan.capacity_tokens, k, rejected_requests=w.rejected_requests,
    )  # fmt: skip
    try:
        for b in backends:
            result.backends.append(
                run_backend(
                    w, b, plan.capacity_tokens, concurrency=k,
                    timing_repeats=settings.timing_repeats,
                    boundary_accounting=settings.boundary_accounting, bars=bars,
                )
            )  # fmt: skip
        result.strip_requests = select_strip_requests(result.backends)
        if plan.sweep:
            result.sweep = run_sweep(w, backends, plan.sweep, concurrency=k, bars=bars)
        result.anchors = workload_anchors(
            w, backends, result.backends, result.sweep, plan.capacity_tokens, concurrency=k,
            search=settings.capacity_search, bars=bars,
            profile=settings.profile or (settings.time.profile if settings.time else None),
        )  # fmt: skip
        if settings.time is not None:
            _run_arrival_all(result, plan, backends, settings.time, bars)
    except (ReplayInterrupted, KeyboardInterrupt):
        result.partial = True
        if result.backends:
            result.strip_requests = select_strip_requests(result.backends)
        raise _Interrupted(result) from None
    return result


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
    for cap, scheduler, b in itertools.product(plan.sweep, time.schedulers, backends):
        if cap == capacity_tokens:
            continue  # the table's run is that point
        try:
            run = run_arrival(workload, b, cap, time, role="sweep", bars=bars, scheduler=scheduler)
        except SimUnservableError:
            continue  # left out (plotted as a gap)
        result.arrival_runs.append(run)


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
    """Each backend at each rate of the sweep (role ``rate``), appended to ``into`` as it
    finishes; ``auto`` stops a backend at its first overloaded rate. The ``table``'s runs
    are not made again; a rate at which a request cannot fit is left out."""
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


class ComparisonTables(NamedTuple):
    """A comparison's tidy tables: ``requests`` (one row per request x backend x
    configuration) and ``runs`` (one per run), pandas DataFrames when pandas is installed
    (else lists of flat dicts), and the typed records behind them."""

    requests: Any
    runs: Any
    comparison: Comparison


@dataclass
class Comparison:
    """What a comparison measured: per workload every run's records; ``partial`` when
    Ctrl-C stopped it; ``warnings`` the reader must know, once each."""

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
                comparison.workloads.append(_compare_workload(plan, settings, bars))
        except _Interrupted as exc:
            comparison.partial = True
            if exc.workload.backends:
                comparison.workloads.append(exc.workload)
    for w in caught:  # a profile's range once for the whole comparison; others as they were
        if not issubclass(w.category, ProfileRangeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    comparison.warnings += _range_notes(comparison)
    return comparison


def _range_notes(comparison: Comparison) -> list[str]:
    """One line per profile a run took past its measured range, with the farthest each
    quantity went (a run's note: ``"<what> up to N, measured up to M (Fx)"``, ``; ``-joined)."""
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
