"""Many cluster runs on one request stream: policies x fleet sizes x capacities, and faults.

The fault-free runs cover every (replicas, capacity) pair for every policy; the fault
runs (when faults are given) repeat every policy, bounds excepted, at the first pair.
Requests are re-read for each run (a trace is streamed, never held). Ctrl-C keeps the
runs that finished (:class:`ClusterInterrupted`); a deadline skips the runs it leaves
no time for, and says which.

``prefixkv cluster --request-rate 1,2,4,8`` also runs every policy (bounds included) at
each further rate, on the first fleet size and capacity, without faults
(:func:`run_rate_sweep`): the walk over rates and the overload verdict are
:mod:`~prefixkv.adapters.lab.sim.rate_sweep`'s, one rule for a replica and a fleet. Each
run carries the labels ``request_rate`` and ``role`` (``table`` or ``rate``).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from prefixkv.adapters.lab.sim.rate_sweep import sweep_rates
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.routing import PolicySpec

from .faults import FaultPlan
from .fleet import Fleet
from .metrics import ClusterResult
from .run import ClusterSettings, run_cluster

__all__ = [
    "ClusterInterrupted",
    "PlannedRun",
    "arrival_span",
    "is_rate_run",
    "plan_experiment",
    "run_experiment",
    "run_rate_sweep",
]


class PlannedRun(NamedTuple):
    """One run of an experiment: the fleet settings, the policy and the faults."""

    config: ClusterSettings
    spec: PolicySpec
    faults: FaultPlan | None

    def describe(self) -> str:
        """``policy N=.. capacity=.. [faults]``, as the progress lines name a run."""
        cfg = self.config
        faults = f" faults={self.faults.text}" if self.faults is not None else ""
        return f"{self.spec.text} N={cfg.num_replicas} capacity={cfg.capacity_tokens:,}{faults}"


class ClusterInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during an experiment; ``results`` holds the runs that
    finished, ``planned`` how many there were to run.

    A ``KeyboardInterrupt``, so code that does not look for it still stops.
    """

    def __init__(self, results: list[ClusterResult], planned: int) -> None:
        super().__init__("cluster experiment interrupted")
        self.results = results
        self.planned = planned


def arrival_span(requests: Iterable[SimRequest]) -> float:
    """Seconds from the first arrival to the last (for faults at a percentage)."""
    first = last = None
    for r in requests:
        if r.arrival is None:
            continue
        first = r.arrival if first is None else first
        last = r.arrival
    return 0.0 if first is None or last is None else last - first


def plan_experiment(
    policies: Sequence[PolicySpec],
    config: ClusterSettings,
    *,
    replicas: Sequence[int] = (),
    capacities: Sequence[int] = (),
    faults: FaultPlan | None = None,
    fault_free: bool = True,
) -> list[PlannedRun]:
    """Every policy at every fleet size and capacity, then the fault runs: the runs
    :func:`run_experiment` makes, in order. Building each run's settings checks every
    value of a sweep before anything runs.

    Args:
        policies: the policy (and bound) specs.
        config: the base settings; ``replicas``/``capacities`` override its sizes.
        replicas: fleet sizes (default: the config's).
        capacities: per-replica capacities in tokens (default: the config's).
        faults: a resolved fault plan for the fault runs (every policy but the bounds,
            at the first size and capacity), or ``None``.
        fault_free: plan the fault-free runs (off: the fault runs only).
    """
    sizes = list(replicas) or [config.num_replicas]
    caps = list(capacities) or [config.capacity_tokens]
    plan: list[PlannedRun] = []
    if fault_free:
        plan += [
            PlannedRun(dataclasses.replace(config, num_replicas=n, capacity_tokens=c), spec, None)
            for n, c in itertools.product(sizes, caps)
            for spec in policies
        ]
    if faults is not None and faults.any:
        first = dataclasses.replace(config, num_replicas=sizes[0], capacity_tokens=caps[0])
        plan += [PlannedRun(first, spec, faults) for spec in policies if not spec.is_bound]
    return plan


def run_experiment(
    requests: Callable[[ClusterSettings], Iterable[SimRequest]],
    plan: Sequence[PlannedRun],
    *,
    fleet: Callable[[], Fleet] | None = None,
    on_run: Callable[[ClusterResult], None] | None = None,
    deadline: float | None = None,
    on_skip: Callable[[PlannedRun], None] | None = None,
    labels: Mapping[str, Any] | None = None,
) -> list[ClusterResult]:
    """Make the runs of ``plan`` (:func:`plan_experiment`), in order.

    Args:
        requests: makes a fresh request stream for each run's settings (the arrivals
            may depend on the fleet size).
        plan: the runs.
        fleet: makes the fleet of each run (Ray); default in-process.
        on_run: called with each result as it finishes (progress).
        deadline: a ``time.monotonic()`` instant after which no run starts (a run
            under way finishes); ``None``: no limit.
        on_skip: called with each run the deadline skipped.
        labels: extra columns for every result (e.g. the request rate).

    Returns:
        Every result, in the plan's order (without the skipped runs).

    Raises:
        ClusterInterrupted: Ctrl-C; it holds the runs that finished.
    """
    out: list[ClusterResult] = []
    try:
        for planned in _before(plan, deadline, on_skip):
            res = _run_planned(planned, requests, fleet, labels)
            out.append(res)
            if on_run is not None:
                on_run(res)
    except KeyboardInterrupt:
        raise ClusterInterrupted(out, len(plan)) from None
    return out


def _before(
    plan: Sequence[PlannedRun],
    deadline: float | None,
    on_skip: Callable[[PlannedRun], None] | None,
) -> Iterator[PlannedRun]:
    """The runs of ``plan`` due to start before ``deadline`` (checked as each comes up);
    ``on_skip`` is called with each of the others."""
    for planned in plan:
        if deadline is not None and time.monotonic() >= deadline:
            if on_skip is not None:
                on_skip(planned)
            continue
        yield planned


def _run_planned(
    planned: PlannedRun,
    requests: Callable[[ClusterSettings], Iterable[SimRequest]],
    fleet: Callable[[], Fleet] | None,
    labels: Mapping[str, Any] | None,
) -> ClusterResult:
    """One run of the plan, on a fresh fleet (a bound runs in-process), with ``labels``."""
    cfg, spec, fault_plan = planned
    run_fleet = fleet() if fleet is not None and not spec.is_bound else None
    return run_cluster(requests(cfg), spec, cfg, fault_plan, fleet=run_fleet, labels=labels)


def is_rate_run(res: ClusterResult) -> bool:
    """Whether ``res`` is a point of the rate sweep beyond the experiment's own rate."""
    return res.labels.get("role") == "rate"


def run_rate_sweep(
    requests: Callable[[ClusterSettings, float], Iterable[SimRequest]],
    policies: Sequence[PolicySpec],
    config: ClusterSettings,
    rates: Sequence[float],
    *,
    auto: bool = False,
    fleet: Callable[[], Fleet] | None = None,
    on_run: Callable[[ClusterResult], None] | None = None,
    into: list[ClusterResult],
) -> None:
    """Every policy at every rate (ascending), fault-free, on ``config``'s fleet.

    Args:
        requests: a fresh request stream for a fleet and a Poisson rate.
        policies: the policy (and bound) specs.
        config: the fleet (its size and capacity).
        rates: the rates, ascending (:func:`~..sim.rate_sweep.rate_schedule`).
        auto: stop each policy after its first overloaded run.
        fleet: makes the fleet of each run (Ray); default in-process.
        on_run: called with each new result as it finishes.
        into: the runs already made, to which each new one is appended as it finishes
            (so Ctrl-C keeps the finished ones); those of this fleet, without faults,
            with a ``request_rate`` label are not run again but count for ``auto``.
    """
    specs = {s.text: s for s in policies}

    def run(name: str, rate: float) -> ClusterResult:
        planned = PlannedRun(config, specs[name], None)
        labels = {"request_rate": rate, "role": "rate"}
        res = _run_planned(planned, lambda cfg: requests(cfg, rate), fleet, labels)
        if on_run is not None:
            on_run(res)
        return res

    made = {
        (r.labels["policy"], float(r.labels["request_rate"])): r
        for r in into
        if r.labels.get("request_rate") is not None
        and not r.labels["faults"]
        and r.labels["num_replicas"] == config.num_replicas
        and r.labels["capacity_tokens"] == config.capacity_tokens
    }
    # extend appends each run as the sweep yields it: an interrupt keeps those made
    into.extend(
        sweep_rates(list(specs), rates, run, lambda r: r.run.overloaded, auto=auto, done=made)
    )
