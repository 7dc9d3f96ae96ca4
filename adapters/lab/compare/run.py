"""A comparison's run: per planned workload each backend K-live (the table, the capacity
sweep, the anchors), then at arrival time through :func:`..sim.simulate` (the table's
capacity, the sweep's, the request rates). Ctrl-C keeps what finished, marked partial.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import warnings
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..backends import BackendSpec, Bars, CapacityError, Scalar
from ..extras import has_extra
from ..sim import ProfileRangeWarning, SimRequest, SimUnservableError, simulate, with_arrivals
from ..sim.load import LoadSummary, summarize_load
from ..sim.rate_sweep import rate_schedule, start_rate, sweep_rates
from ..sim.requests import from_trace
from ..sim.runs import RunRow, run_table
from ..workloads import Workload
from .anchors import CapacityAnchor, workload_anchors
from .k_live import run_backend, run_sweep, select_strip_requests
from .plan import CompareSettings, Scheduler, TimeSettings, WorkloadPlan

__all__ = ["Comparison", "ComparisonTables", "WorkloadResult", "run_comparison"]


@dataclass(slots=True)
class WorkloadResult:
    """Everything a comparison measured on one workload, ``partial`` when Ctrl-C stopped it:
    each backend's K-live run at the table's ``capacity_tokens`` (``backends``), the
    ``sweep``'s, the ``anchors``, the ``arrival_runs`` (the table's capacity first).
    ``num_requests`` excludes ``rejected_requests``; each backend uses the whole blocks that
    fit ``capacity_tokens``."""

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
    result: WorkloadResult, plan: WorkloadPlan, settings: CompareSettings, bars: Bars | None
) -> None:
    """Every backend on one planned workload, into ``result`` (Ctrl-C: what finished)."""
    w, backends, k = plan.workload, settings.backends, settings.concurrency
    for b in backends:
        result.backends.append(
            run_backend(
                w, b, plan.capacity_tokens, concurrency=k,
                timing_repeats=settings.timing_repeats,
                boundary_accounting=settings.boundary_accounting, bars=bars,
            )
        )  # fmt: skip
    if plan.sweep:
        result.sweep = run_sweep(w, backends, plan.sweep, concurrency=k, bars=bars)
    result.anchors = workload_anchors(
        w, backends, result.backends, result.sweep, plan.capacity_tokens, concurrency=k,
        search=settings.capacity_search, bars=bars,
        profile=settings.profile or (settings.time.profile if settings.time else None),
    )  # fmt: skip
    if settings.time is not None:
        _run_arrival_all(result.arrival_runs, plan, backends, settings.time, bars)


def _run_arrival_all(
    runs: list[RunRow],
    plan: WorkloadPlan,
    backends: Sequence[BackendSpec],
    time: TimeSettings,
    bars: Bars | None,
) -> None:
    """Per scheduler each backend at the table's capacity, then at each swept request rate
    (``auto``: a backend stops at its first overloaded rate); then each at the sweep's other
    capacities. Appended to ``runs`` as each finishes; a rate or a swept capacity at which
    a request cannot fit is left out."""
    workload, capacity_tokens = plan.workload, plan.capacity_tokens
    if time.auto_rates and time.request_rate is None:
        first = start_rate(workload.stats, time.profile, time.max_num_batched_tokens)
        time = dataclasses.replace(time, request_rate=first)
    by_label = {b.label: b for b in backends}

    def at_rate(scheduler: Scheduler, label: str, rate: float) -> RunRow | None:
        point = dataclasses.replace(time, request_rate=rate, rates=(), auto_rates=False)
        with contextlib.suppress(SimUnservableError):
            return run_arrival(
                workload, by_label[label], capacity_tokens, point, scheduler, role="rate", bars=bars
            )
        return None

    for scheduler in time.schedulers:
        made = {}
        for b in backends:
            try:
                run = run_arrival(workload, b, capacity_tokens, time, scheduler, bars=bars)
            except SimUnservableError as exc:
                raise CapacityError(
                    f"capacity {capacity_tokens:,} tokens is too small for {workload.name!r} "
                    f"with {b.label} in the arrival-time run: {exc}"
                ) from None
            made[b.label, run.labels["request_rate"] or 0.0] = run
            runs.append(run)
        if time.rates or time.auto_rates:
            rates = rate_schedule(time.request_rate or 1.0, time.rates, auto=time.auto_rates)
            run_at = functools.partial(at_rate, scheduler)
            auto = time.auto_rates
            runs.extend(
                sweep_rates(list(by_label), rates, run_at, _overloaded, auto=auto, done=made)
            )
    for cap, scheduler, b in itertools.product(plan.sweep, time.schedulers, backends):
        if cap == capacity_tokens:
            continue  # the table's run is that point
        with contextlib.suppress(SimUnservableError):
            runs.append(run_arrival(workload, b, cap, time, scheduler, role="sweep", bars=bars))


def _overloaded(run: RunRow) -> bool:
    return run.part(LoadSummary).overloaded


def run_arrival(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    settings: TimeSettings,
    scheduler: Scheduler,
    *,
    role: str = "table",
    bars: Bars | None = None,
) -> RunRow:
    """Simulate ``workload`` arriving at ``spec``'s replica of ``capacity_tokens`` under
    ``scheduler``.

    Raises:
        SimInputError: requests out of arrival order (a trace's timestamps).
        SimUnservableError: a request that cannot fit the pool even alone.
        KeyboardInterrupt: Ctrl-C (nothing of this run is kept).
    """
    engine, config = settings.engine(spec, scheduler)
    closed = settings.closed_loop and any(
        r.session is not None or r.parent is not None
        for r in itertools.islice(workload.requests, 64)
    )
    asked: list[float] = []  # the offered load, filled as the requests are read
    stamped = with_arrivals(
        from_trace(workload.requests, closed_loop=closed),
        request_rate=settings.request_rate,
        time_scale=settings.time_scale,
        process=settings.arrival,
        seed=settings.seed,
    )
    legend = f"{spec.label} as {engine}"
    labels = {"workload": workload.name, "backend": spec.label, "legend": legend}
    note = f" @ {capacity_tokens:,} tok" if role != "table" else ""
    if role == "rate":
        note = f" @ {settings.request_rate:g} req/s"
    bar = bars(f"{workload.name} {legend}{note}", workload.stats.prompt_tokens) if bars else None
    try:
        result = simulate(
            _tally(stamped, asked), spec.make, capacity_tokens, config, settings.profile,
            labels=labels, progress=None if bar is None else bar.update,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    row_labels: dict[str, Any] = {
        **spec.run_labels(workload.name, "arrival", role, capacity_tokens),
        "engine": engine,
        **config.as_dict(),
        **settings.row(),
        "scheduler": scheduler,
        "closed_loop": closed,
        "profile_range": result.labels.get("profile_range", ""),
    }
    load = summarize_load(
        result.requests, offered_arrivals=asked, slo=settings.slo, closed_loop=closed
    )
    return RunRow(row_labels, (result.run, load), result.requests, slo=settings.slo)


def _tally(requests: Iterator[SimRequest], arrivals: list[float]) -> Iterator[SimRequest]:
    for r in requests:
        if r.arrival is not None:
            arrivals.append(r.arrival)
        yield r


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
        if has_extra("pandas"):
            import pandas

            requests, runs = pandas.DataFrame(requests), pandas.DataFrame(runs)
        return ComparisonTables(requests, runs, self)


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
        for plan in plans:
            workload, stats = plan.workload, plan.workload.stats
            result = WorkloadResult(
                workload.name, workload.source, tuple(workload.notes), stats.num_requests,
                stats.prompt_tokens, stats.output_tokens, plan.capacity_tokens,
                settings.concurrency, rejected_requests=workload.rejected_requests,
            )  # fmt: skip
            try:
                _compare_workload(result, plan, settings, bars)
            except KeyboardInterrupt:
                comparison.partial = result.partial = True
            if result.backends:  # none when Ctrl-C came before the first run ended
                result.strip_requests = select_strip_requests(result.backends)
                comparison.workloads.append(result)
            if comparison.partial:
                break
    for w in caught:  # a profile's range once for the whole comparison; others as they were
        if not issubclass(w.category, ProfileRangeWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    comparison.warnings += _range_notes(comparison)
    return comparison


def _range_notes(comparison: Comparison) -> list[str]:
    """One line per profile a run took past its measured range, with the farthest each
    quantity went (a run's note: ``"<what> up to N, measured up to M (Fx)"``, ``; ``-joined)."""
    runs: Counter[str] = Counter()
    farthest: defaultdict[str, dict[str, tuple[int, str]]] = defaultdict(dict)
    for t in (t for w in comparison.workloads for t in w.arrival_runs):
        note, name = str(t.labels["profile_range"]), str(t.labels["profile"])
        if not note:
            continue
        runs[name] += 1
        for phrase in note.split("; "):
            what, _, rest = phrase.partition(" up to ")
            value = int("".join(ch for ch in rest.split(", measured")[0] if ch.isdigit()))
            if value > farthest[name].get(what, (-1, ""))[0]:
                farthest[name][what] = (value, phrase)
    return [
        f"profile {name!r} extrapolated beyond its measured range in {runs[name]} "
        f"arrival-time run(s): {'; '.join(p for _, p in farthest[name].values())}; "
        "its times there extrapolate the fit"
        for name in runs
    ]
