"""Many cluster runs on one request stream: policies x fleet sizes x capacities, and faults.

The fault-free runs cover every (replicas, capacity) pair for every policy; the fault
runs (when faults are given) repeat every policy, bounds excepted, at the first pair.
Requests are re-read for each run (a trace is streamed, never held).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence

from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.routing import PolicySpec

from .faults import FaultPlan
from .fleet import Fleet
from .metrics import ClusterResult
from .run import ClusterConfig, run_cluster

__all__ = ["arrival_span", "run_experiment"]


def arrival_span(requests: Iterable[SimRequest]) -> float:
    """Seconds from the first arrival to the last (for faults at a percentage)."""
    first = last = None
    for r in requests:
        if r.arrival is None:
            continue
        first = r.arrival if first is None else first
        last = r.arrival
    return 0.0 if first is None or last is None else last - first


def run_experiment(
    requests: Callable[[ClusterConfig], Iterable[SimRequest]],
    policies: Sequence[PolicySpec],
    config: ClusterConfig,
    *,
    replicas: Sequence[int] = (),
    capacities: Sequence[int] = (),
    faults: FaultPlan | None = None,
    fleet: Callable[[], Fleet] | None = None,
    on_run: Callable[[ClusterResult], None] | None = None,
    fault_free: bool = True,
) -> list[ClusterResult]:
    """Run every policy at every fleet size and capacity, then the fault runs.

    Args:
        requests: makes a fresh request stream for each run's settings (the arrivals
            may depend on the fleet size).
        policies: the policy (and bound) specs.
        config: the base settings; ``replicas``/``capacities`` override its sizes.
        replicas: fleet sizes (default: the config's).
        capacities: per-replica capacities in tokens (default: the config's).
        faults: a resolved fault plan for the fault runs, or ``None``.
        fleet: makes the fleet of each run (Ray); default in-process.
        on_run: called with each result as it finishes (progress).
        fault_free: run the fault-free runs (off: the fault runs only).

    Returns:
        Every result, fault-free first.
    """
    sizes = list(replicas) or [config.num_replicas]
    caps = list(capacities) or [config.capacity_tokens]
    out: list[ClusterResult] = []
    plan: list[tuple[ClusterConfig, PolicySpec, FaultPlan | None]] = []
    if fault_free:
        plan += [
            (dataclasses.replace(config, num_replicas=n, capacity_tokens=c), spec, None)
            for n, c in itertools.product(sizes, caps)
            for spec in policies
        ]
    if faults is not None and faults.any:
        first = dataclasses.replace(config, num_replicas=sizes[0], capacity_tokens=caps[0])
        plan += [(first, spec, faults) for spec in policies if not spec.is_bound]
    for cfg, spec, fault_plan in plan:
        res = run_cluster(
            requests(cfg),
            spec,
            cfg,
            fault_plan,
            fleet=fleet() if fleet is not None and not spec.is_bound else None,
        )
        out.append(res)
        if on_run is not None:
            on_run(res)
    return out
