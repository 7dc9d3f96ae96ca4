"""A cluster run: requests routed over N replicas in virtual time, with faults.

:func:`run_cluster` builds the fleet (in-process, pooled for the bounds, or the one
given, e.g. Ray's), the router and the fault plan, drives the requests through
:class:`~.driver.ClusterDriver`, and folds the outcome into a
:class:`~.metrics.ClusterResult`. A run is a pure function of its requests, settings,
seed and faults: the in-process fleet gives the same results on every run, and the
Ray fleet the same decisions too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from prefixkv.adapters.lab.sim.profile import load_profile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.policies import POLICIES, policy_index
from prefixkv.adapters.router.routing import PolicySpec, parse_policy

from .config import ClusterConfig
from .driver import ClusterDriver
from .errors import ClusterConfigError
from .faults import FaultPlan, parse_faults
from .fleet import Fleet, LocalFleet, PooledFleet, ReplicaSpec
from .metrics import ClusterResult, ReplicaSummary, summarize_run

__all__ = ["ClusterConfig", "run_cluster"]


def run_cluster(
    requests: Iterable[SimRequest],
    policy: str | PolicySpec,
    config: ClusterConfig | None = None,
    faults: FaultPlan | str | None = None,
    *,
    fleet: Fleet | None = None,
    labels: Mapping[str, Any] | None = None,
) -> ClusterResult:
    """Route ``requests`` over a fleet of replicas with one policy (or a bound).

    Args:
        requests: in arrival order, each with an arrival (streamed).
        policy: a policy spec (``"dynamo"``, ``"sglang@radix"``, ``"pooled"`` ...).
        config: the fleet and router settings.
        faults: what to inject (a plan or a ``--faults`` string); times given as
            percentages need :meth:`FaultPlan.resolve` first.
        fleet: where replicas run (default: in this process; a
            :class:`~.ray_fleet.RayFleet` for Ray). Bounds always run in-process.
        labels: extra columns for the result.

    Returns:
        Per-request records, per-replica summaries, the run summary, the checked
        invariants and the event-path counters.

    Raises:
        UnknownPolicyError: an unknown policy, index or parameter.
        FaultSpecError: a bad fault spec.
        ClusterConfigError: bad settings.
    """
    cfg = ClusterConfig() if config is None else config
    spec = policy if isinstance(policy, PolicySpec) else parse_policy(policy, tuple(POLICIES))
    plan = parse_faults(faults) if isinstance(faults, str) else (faults or FaultPlan())
    if plan.needs_relative:
        raise ClusterConfigError("fault times given as percentages: resolve the plan first")
    plan.check(cfg.num_replicas)
    profile = cfg.profile or load_profile()
    rspec = ReplicaSpec(
        backend=cfg.backend,
        block_size=cfg.block_size,
        hash_seed=cfg.hash_seed,
        capacity_tokens=cfg.capacity_tokens,
        config=cfg.sim,
        profile=profile,
        buffer_steps=cfg.buffer_steps,
        keep_tokens=cfg.keep_tokens,
        check_hits=cfg.check,
        drop_removals=plan.drop_removals,
        seed=cfg.seed,
    )
    if spec.is_bound:
        fleet = PooledFleet(rspec, cfg.num_replicas, infinite=spec.name == "infinite")
    elif fleet is None:
        fleet = LocalFleet()
    run = ClusterDriver(spec, cfg, plan, fleet, rspec)
    t_start = time.perf_counter()
    try:
        for r in range(cfg.num_replicas):
            run.start_replica(r, 0.0)
        pending = list(plan.scheduled)
        for req in requests:
            t = req.arrival
            if t is None:
                raise ClusterConfigError(f"request {req.id!r} has no arrival time")
            while pending and pending[0].at <= t:
                run.apply(pending.pop(0))
            run.advance_to(t)
            run.route(req, t)
        run.drain(pending)
        run.check_views()
    finally:
        fleet.close()
    wall = time.perf_counter() - t_start
    return _result(run, spec, cfg, plan, wall, labels)


def _result(
    run: ClusterDriver,
    spec: PolicySpec,
    cfg: ClusterConfig,
    plan: FaultPlan,
    wall: float,
    labels: Mapping[str, Any] | None,
) -> ClusterResult:
    inv = run.inv
    requests = [run.done[rid] for rid in run.arrival_order if rid in run.done]
    inv.lost_requests = [rid for rid in run.arrival_order if rid not in run.done]
    per: dict[int, ReplicaSummary] = {
        r: ReplicaSummary(r, 0, 0, 0, 0, busy + run.busy_base.get(r, 0.0))
        for r, busy in sorted(run.busy_s.items())
    }
    for rr in requests:
        s = per.setdefault(rr.replica, ReplicaSummary(rr.replica, 0, 0, 0, 0, 0.0))
        s.requests += 1
        s.prompt_tokens += rr.metrics.prompt_tokens
        s.hit_tokens += rr.metrics.hit_tokens
        s.computed_prefill_tokens += rr.metrics.computed_prefill_tokens
    router = run.router
    stats: dict[str, Any] = dict(run.stats)
    stats["dropped_batches"] = run.channel.num_dropped
    if router is not None:
        stats.update(router.stream_stats())
        if router.index is not None:
            stats.update({f"index_{k}": v for k, v in router.index.stats().items()})
            stats["incompatible"] = dict(router.index.incompatible)
    stats["warmups"] = run.warmups
    swept = router.loads.num_swept if router is not None else 0
    index_kind = policy_index(spec)[0] if not spec.is_bound else None
    all_labels: dict[str, Any] = {
        "policy": spec.text,
        "index": index_kind or "none",
        "num_replicas": cfg.num_replicas,
        "capacity_tokens": cfg.capacity_tokens,
        "backend": cfg.backend,
        "block_size": cfg.block_size,
        "faults": plan.text,
        "seed": cfg.seed,
        "wall_s": wall,
        **(labels or {}),
    }
    summary = summarize_run(requests, list(per.values()), block_size=cfg.block_size, swept=swept)
    return ClusterResult(all_labels, requests, list(per.values()), summary, inv, stats)
