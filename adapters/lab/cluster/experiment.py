"""Many cluster runs on one request stream: policies x fleet sizes x capacities, faults
and rates. Requests are re-read for each run; Ctrl-C keeps the runs that finished."""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    """Ctrl-C during an experiment: the runs that finished, of how many planned."""

    def __init__(self, results: list[ClusterResult], planned: int) -> None:
        super().__init__("cluster experiment interrupted")
        self.results = results
        self.planned = planned


def arrival_span(requests: Iterable[SimRequest]) -> float:
    """Seconds from the first arrival to the last (for faults at a percentage)."""
    first = last = None
    for r in requests:  # streamed: a trace is never held
        if r.arrival is not None:
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
    """Every policy at every fleet size and capacity (default: the config's), then, with
    ``faults``, every policy but the bounds at the first pair: the runs in order, each
    value of the sweep checked before anything runs.
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
    """Make the runs of ``plan`` in order, each on a fresh request stream and fleet
    (default in-process); none starts past ``deadline`` (``time.monotonic()``).

    Raises:
        ClusterInterrupted: Ctrl-C; it holds the runs that finished.
    """
    out: list[ClusterResult] = []
    try:
        for planned in plan:
            if deadline is not None and time.monotonic() >= deadline:
                if on_skip is not None:
                    on_skip(planned)
                continue
            out.append(_run_planned(planned, requests, fleet, labels))
            if on_run is not None:
                on_run(out[-1])
    except KeyboardInterrupt:
        raise ClusterInterrupted(out, len(plan)) from None
    return out


def _run_planned(
    planned: PlannedRun,
    requests: Callable[[ClusterSettings], Iterable[SimRequest]],
    fleet: Callable[[], Fleet] | None,
    labels: Mapping[str, Any] | None,
) -> ClusterResult:
    cfg, spec, fault_plan = planned
    run_fleet = fleet() if fleet is not None and not spec.is_bound else None  # bounds: in-process
    return run_cluster(requests(cfg), spec, cfg, fault_plan, fleet=run_fleet, labels=labels)


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
    """Every policy at every rate (ascending), fault-free, on ``config``'s fleet; with
    ``auto``, each policy stops after its first overloaded run. Each run is appended to
    ``into`` as it finishes; those already there for this fleet are not run again.
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
    into.extend(
        sweep_rates(list(specs), rates, run, lambda r: r.run.overloaded, auto=auto, done=made)
    )
