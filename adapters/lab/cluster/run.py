"""A cluster run: requests routed over N replicas in virtual time, with faults."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from array import array
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prefixkv.adapters.lab.sim.profile import load_profile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.adapters.router.policies import POLICIES, policy_index
from prefixkv.adapters.router.routing import PolicySpec, parse_policy

from .config import ClusterSettings
from .driver import ClusterDriver
from .faults import FaultPlan, ScheduledFault, parse_faults
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
    """Route ``requests`` (streamed, in arrival order) over a fleet with one policy (or a
    bound), injecting ``faults`` (percentages resolved first); bounds run in-process,
    the others on ``fleet`` (default in this process).

    Raises:
        UnknownPolicyError, FaultSpecError, ClusterSettingsError: bad input.
        NoReplicaError: every replica dead while requests remain.
    """
    cfg = ClusterSettings() if config is None else config
    spec = policy if isinstance(policy, PolicySpec) else parse_policy(policy, tuple(POLICIES))
    plan = parse_faults(faults) if isinstance(faults, str) else (faults or FaultPlan())
    if plan.needs_relative:
        raise ClusterSettingsError("fault times given as percentages: resolve the plan first")
    plan.check(cfg.num_replicas)
    rspec = ReplicaSpec(cfg, cfg.profile or load_profile(), plan.drop_removals)
    if spec.is_bound:
        fleet = PooledFleet(rspec, cfg.num_replicas, infinite=spec.name == "infinite")
    elif fleet is None:
        fleet = LocalFleet()
    run = ClusterDriver(spec, cfg, plan, fleet, rspec)
    asked = array("d")  # the arrivals asked for: the offered rate, closed loop or not
    t_start = time.perf_counter()
    try:
        for r in range(cfg.num_replicas):
            run.start_replica(r, 0.0)
        pending = list(plan.scheduled)
        sessions = _Sessions(run, pending, cfg.closed_loop_tick_s)
        for req in requests:
            if req.arrival is None:
                raise ClusterSettingsError(f"request {req.id!r} has no arrival time")
            asked.append(req.arrival)
            sessions.advance(req.arrival)
            sessions.offer(req, req.arrival)
        sessions.finish()
        run.drain(pending)
        run.check_views()
    finally:
        fleet.close()
    wall = time.perf_counter() - t_start
    return _result(run, cfg, wall, labels, asked, sessions.closed)


class _Sessions:
    """Closed-loop turns: a request that follows another (``after``) is routed once that
    one finished, plus its think time; the fleet advances by ``tick_s`` while it waits."""

    def __init__(self, run: ClusterDriver, faults: list[ScheduledFault], tick_s: float) -> None:
        self.run = run
        self.faults = faults
        self.tick_s = tick_s
        self.now = 0.0
        self.seen: set[str] = set()
        self.held: dict[str, list[SimRequest]] = {}
        self.ready: list[tuple[float, int, SimRequest]] = []
        self.order = itertools.count()
        self.closed = False  # some turn waited for the one it follows

    def _to(self, t: float) -> None:
        while self.faults and self.faults[0].at <= t:
            self.run.apply(self.faults.pop(0))
        self.run.advance_to(t)
        self.now = max(self.now, t)

    def _ready(self, send: float, req: SimRequest) -> None:
        heapq.heappush(self.ready, (send, next(self.order), req))

    def _release(self) -> None:
        for parent in [p for p in self.held if p in self.run.done]:
            finish = self.run.done[parent].finish_s
            for r in self.held.pop(parent):
                self._ready(max(r.arrival or 0.0, finish + r.think_s), r)

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
            self._ready(max(t, self.run.done[after].finish_s + req.think_s), req)
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
    cfg: ClusterSettings,
    wall: float,
    labels: Mapping[str, Any] | None,
    asked: Sequence[float],
    closed_loop: bool,
) -> ClusterResult:
    requests = [run.done[rid] for rid in run.routes if rid in run.done]
    run.inv.lost_requests = [rid for rid in run.routes if rid not in run.done]
    per = {
        r: ReplicaSummary(r, busy_s=busy + run.busy_base.get(r, 0.0))
        for r, busy in sorted(run.busy_s.items())
    }
    for rr in requests:
        if rr.replica is None:  # never: the driver routes every request it finishes
            continue
        s = per.setdefault(rr.replica, ReplicaSummary(rr.replica))
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
    spec, plan = run.spec, run.plan
    all_labels: dict[str, Any] = {
        "policy": spec.text,
        "index": (None if spec.is_bound else policy_index(spec)[0]) or "none",
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
        requests, list(per.values()), swept=router.loads.num_swept if router is not None else 0,
        offered_arrivals=asked, slo=cfg.slo, closed_loop=closed_loop,
    )  # fmt: skip
    return ClusterResult(all_labels, requests, list(per.values()), summary, run.inv, stats)
