"""A cluster run: requests routed over N replicas in virtual time, with faults.

:func:`run_cluster` builds the fleet (in-process, pooled for the bounds, or the one
given, e.g. Ray's), the router and the fault plan, drives the requests through
:class:`~.driver.ClusterDriver`, and folds the outcome into a
:class:`~.metrics.ClusterResult`. A run is a pure function of its requests, settings,
seed and faults: the in-process fleet gives the same results on every run, and the
Ray fleet the same decisions too.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefixkv.adapters.lab.sim.profile import load_profile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.policies import POLICIES, policy_index
from prefixkv.adapters.router.routing import PolicySpec, parse_policy

from .config import ClusterSettings
from .driver import ClusterDriver
from .errors import ClusterSettingsError
from .faults import FaultPlan, parse_faults
from .fleet import Fleet, LocalFleet, PooledFleet, ReplicaSpec
from .metrics import ClusterResult, ReplicaSummary, summarize_run

__all__ = ["ClusterSettings", "run_cluster"]


def run_cluster(
    requests: Iterable[SimRequest],
    policy: str | PolicySpec,
    config: ClusterSettings | None = None,
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
        ClusterSettingsError: bad settings.
    """
    cfg = ClusterSettings() if config is None else config
    spec = policy if isinstance(policy, PolicySpec) else parse_policy(policy, tuple(POLICIES))
    plan = parse_faults(faults) if isinstance(faults, str) else (faults or FaultPlan())
    if plan.needs_relative:
        raise ClusterSettingsError("fault times given as percentages: resolve the plan first")
    plan.check(cfg.num_replicas)
    rspec = _replica_spec(cfg, plan)
    if spec.is_bound:
        fleet = PooledFleet(rspec, cfg.num_replicas, infinite=spec.name == "infinite")
    elif fleet is None:
        fleet = LocalFleet()
    run = ClusterDriver(spec, cfg, plan, fleet, rspec)
    asked = array("d")  # the arrivals asked for: the offered rate, closed loop or not
    t_start = time.perf_counter()
    try:
        closed_loop = _drive(run, requests, plan, cfg, asked)
    finally:
        fleet.close()
    wall = time.perf_counter() - t_start
    return _result(run, spec, cfg, plan, wall, labels, asked, closed_loop)


def _drive(
    run: ClusterDriver,
    requests: Iterable[SimRequest],
    plan: FaultPlan,
    cfg: ClusterSettings,
    asked: array[float],
) -> bool:
    """Start the replicas, route each request at its arrival (sessions closed loop;
    each arrival asked for is appended to ``asked``), apply the faults on the way,
    drain, and compare the router's views with the truth; whether sessions ran
    closed loop."""
    for r in range(cfg.num_replicas):
        run.start_replica(r, 0.0)
    pending = list(plan.scheduled)
    sessions = _Sessions(run, pending, cfg.closed_loop_tick_s)
    for req in requests:
        t = req.arrival
        if t is None:
            raise ClusterSettingsError(f"request {req.id!r} has no arrival time")
        asked.append(t)
        sessions.advance(t)
        sessions.offer(req, t)
    sessions.finish()
    run.drain(pending)
    run.check_views()
    return sessions.closed


def _replica_spec(cfg: ClusterSettings, plan: FaultPlan) -> ReplicaSpec:
    """Each replica of the fleet, as the settings and the fault plan make it."""
    return ReplicaSpec(cfg, cfg.profile or load_profile(), plan.drop_removals)


class _Sessions:
    """Closed-loop turns of a cluster run: a request that names the one it follows
    (``after``) is routed once that one finished, plus its think time, never before
    its own arrival.

    The driver learns a finish only by advancing the fleet, so while a turn waits
    the fleet advances in steps of at most ``tick_s``: a turn is routed at most that
    late, never early. Scheduled faults are applied on the way.
    """

    def __init__(self, run: ClusterDriver, faults: list[Any], tick_s: float) -> None:
        self.run = run
        self.faults = faults
        self.tick_s = tick_s
        self.now = 0.0
        self.seen: set[str] = set()
        self.held: dict[str, list[SimRequest]] = {}
        self.ready: list[tuple[float, int, SimRequest]] = []
        self.order = 0
        self.closed = False  # some turn waited for the one it follows

    def _to(self, t: float) -> None:
        while self.faults and self.faults[0].at <= t:
            self.run.apply(self.faults.pop(0))
        self.run.advance_to(t)
        self.now = max(self.now, t)

    def _release(self) -> None:
        for parent in [p for p in self.held if p in self.run.done]:
            finish = self.run.done[parent].finish_s
            for r in self.held.pop(parent):
                send = max(r.arrival or 0.0, finish + r.think_s)
                heapq.heappush(self.ready, (send, self.order, r))
                self.order += 1

    def _route_due(self, t: float) -> None:
        while self.ready and self.ready[0][0] <= t:
            send, _, r = heapq.heappop(self.ready)
            at = max(send, self.now)
            self._to(at)
            self.run.route(dataclasses.replace(r, arrival=at), at)

    def advance(self, t: float) -> None:
        """Move to ``t``, routing every released turn due by then, in time order."""
        while True:
            self._release()
            self._route_due(t)
            if not self.held or self.now >= t:
                break
            self._to(min(t, self.now + self.tick_s))
        self._to(t)

    def offer(self, req: SimRequest, t: float) -> None:
        """A request of the stream at its arrival ``t``: routed, or held for its turn."""
        self.seen.add(req.id)
        after = req.after
        self.closed = self.closed or after is not None
        if after is None or after not in self.seen:
            self.run.route(req, t)
        elif after not in self.run.done:
            self.held.setdefault(after, []).append(req)
        else:
            send = max(t, self.run.done[after].finish_s + req.think_s)
            heapq.heappush(self.ready, (send, self.order, req))
            self.order += 1
            self._route_due(t)

    def finish(self) -> None:
        """Route every turn still waiting (the stream has ended)."""
        while self.held or self.ready:
            self._release()
            if self.ready:
                self._route_due(self.ready[0][0])
                continue
            if not self.run.in_flight or not self.run.busy & self.run.live:
                # Nothing runs, so a predecessor still waited on will never finish
                # (a lost request): its turns go now.
                for r in (r for rs in self.held.values() for r in rs):
                    self.run.route(dataclasses.replace(r, arrival=self.now), self.now)
                self.held.clear()
                break
            self._to(self.now + self.tick_s)


def _result(
    run: ClusterDriver,
    spec: PolicySpec,
    cfg: ClusterSettings,
    plan: FaultPlan,
    wall: float,
    labels: Mapping[str, Any] | None,
    asked: Sequence[float],
    closed_loop: bool,
) -> ClusterResult:
    inv = run.inv
    requests = [run.done[rid] for rid in run.arrival_order if rid in run.done]
    inv.lost_requests = [rid for rid in run.arrival_order if rid not in run.done]
    per: dict[int, ReplicaSummary] = {
        r: ReplicaSummary(r, 0, 0, 0, 0, busy + run.busy_base.get(r, 0.0))
        for r, busy in sorted(run.busy_s.items())
    }
    for rr in requests:
        if rr.replica is None:  # never: the driver routes every request it finishes
            continue
        s = per.setdefault(rr.replica, ReplicaSummary(rr.replica, 0, 0, 0, 0, 0.0))
        s.requests += 1
        s.prompt_tokens += rr.prompt_tokens
        s.hit_tokens += rr.hit_tokens
        s.computed_prefill_tokens += rr.computed_prefill_tokens
    router = run.router
    stats: dict[str, Any] = dict(run.stats)
    stats["dropped_batches"] = run.channel.num_dropped
    if router is not None:
        stats.update(router.stream_stats())
        if router.cluster_index is not None:
            stats.update({f"index_{k}": v for k, v in router.cluster_index.stats().items()})
            stats["incompatible"] = dict(router.cluster_index.incompatible)
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
    summary = summarize_run(
        requests, list(per.values()), swept=swept,
        offered_arrivals=asked, slo=cfg.slo, closed_loop=closed_loop,
    )  # fmt: skip
    return ClusterResult(all_labels, requests, list(per.values()), summary, inv, stats)
