"""The virtual-time driver of a cluster run: the fleet, the lossy channel, the router, faults.

It advances the fleet to each arrival, delivers what happened by then, applies the faults
due and routes the request. A replica that dies voids the steps it had not finished; its
requests are routed again, their arrival unchanged.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
import time
from typing import Any

from prefixkv.adapters.lab.sim.metrics import RequestRow
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.keys import Worker
from prefixkv.adapters.router.policies import (
    LeastOutstanding,
    RoundRobin,
    make_cluster_index,
    make_policy,
)
from prefixkv.adapters.router.router import Decision, Router
from prefixkv.adapters.router.routing import PolicySpec, RoutingPolicy

from .config import ClusterSettings
from .faults import EventChannel, FaultPlan, ScheduledFault
from .fleet import Fleet, ReplicaDeadError, ReplicaSpec
from .metrics import Invariants
from .sim_replica import ReplicaReport

__all__ = ["ClusterDriver"]

_BATCH, _FIRST, _FINISH = -1, 0, 1


class ClusterDriver:
    """One run's state and its steps (see the module docstring)."""

    def __init__(
        self,
        spec: PolicySpec,
        config: ClusterSettings,
        plan: FaultPlan,
        fleet: Fleet,
        replica_spec: ReplicaSpec,
    ) -> None:
        self.spec = spec
        self.config = config
        self.plan = plan
        self.fleet = fleet
        self.replica_spec = replica_spec
        self.scheme = replica_spec.scheme()
        self.channel = EventChannel(plan, config.seed + 1)
        self.rng = random.Random(config.seed + 2)
        late = any(f.kind == "late_join" for f in plan.scheduled)
        self.router: Router | None = None if late else self._new_router()
        # Before a late router joins, a plain round-robin balancer sends requests.
        self.bootstrap = Router(
            RoundRobin(), None, self.scheme, replica_spec.profile, seed=config.seed
        )
        self.outputs: list[tuple[float, int, int, int, Any]] = []  # time, kind, order, replica, x
        self.order = itertools.count()
        self.live: set[int] = set()
        self.busy: set[int] = set()
        self.draining: set[int] = set()
        self.gone: set[int] = set()
        self.in_flight: dict[str, tuple[int, SimRequest]] = {}
        self.routes: dict[str, int] = {}  # times routed, keyed in arrival order
        self.decisions: dict[str, Decision] = {}
        self.done: dict[str, RequestRow] = {}
        self.busy_s: dict[int, float] = {}
        self.busy_base: dict[int, float] = {}
        self.inv = Invariants()
        self.warmups: list[dict[str, Any]] = []
        self.next_id = config.num_replicas
        self.stats: dict[str, int] = dict.fromkeys(
            ("batches", "dispatch_failures", "lost_completions", "stale_outputs"), 0
        )

    def _new_router(self) -> Router:
        bound = self.spec.is_bound
        policy: RoutingPolicy = LeastOutstanding(by="tokens") if bound else make_policy(self.spec)
        index = None if bound else make_cluster_index(self.spec, self.scheme)
        return Router(
            policy,
            index,
            self.scheme,
            self.replica_spec.profile,
            seed=self.config.seed,
            reservation_ttl=self.config.reservation_ttl,
        )

    def _start(self, replica: int, at: float) -> None:
        cfg = self.replica_spec.settings
        kind = self.plan.mismatch.get(replica)
        if kind == "block_size":
            cfg = dataclasses.replace(cfg, block_size=cfg.block_size * 2)
        elif kind == "hash":
            cfg = dataclasses.replace(cfg, hash_seed=cfg.hash_seed + 1)
        spec = dataclasses.replace(self.replica_spec, settings=cfg, start_time=at)
        self.fleet.start(replica, spec)

    def start_replica(self, replica: int, at: float) -> None:
        """Start ``replica`` at ``at`` and tell the routers."""
        self._start(replica, at)
        self.live.add(replica)
        self.busy_s.setdefault(replica, 0.0)
        for router in self._routers():
            self._join(router, replica)

    def _join(self, router: Router, replica: int) -> None:
        fleet = self.fleet
        router.add_replica(
            replica,
            replay=lambda start, until: fleet.replay(replica, start, until),
            dump=lambda: fleet.dump(replica),
        )

    def _routers(self) -> list[Router]:
        return [self.bootstrap] if self.router is None else [self.bootstrap, self.router]

    def advance_to(self, t: float) -> None:
        """Advance the fleet to ``t`` and deliver everything due by then."""
        ids = sorted(self.busy & self.live)
        if ids:
            reports, dead = self.fleet.advance(ids, t)
            for rep in reports:
                self._take(rep, t)
            for r in dead:
                self._replica_died(r, t, restart=False)
        self._deliver(t)

    def _take(self, rep: ReplicaReport, t: float) -> None:
        r = rep.replica
        if rep.num_waiting or rep.num_running:
            self.busy.add(r)
        else:
            self.busy.discard(r)
        self.busy_s[r] = rep.busy_s
        self.inv.unannounced_hits.extend(rep.violations)
        self.stats["batches"] += len(rep.batches)
        for b in rep.batches:
            self.channel.send(r, b)
        for rid, at in rep.first_tokens:
            self._output(at, _FIRST, r, rid)
        for m in rep.finished:
            self._output(m.finish_s, _FINISH, r, m)
        for router in self._routers():
            router.now = t
            router.gauges(
                r, num_waiting=rep.num_waiting, num_running=rep.num_running, kv_usage=rep.kv_usage
            )

    def _output(self, at: float, kind: int, replica: int, x: Any) -> None:
        heapq.heappush(self.outputs, (at, kind, next(self.order), replica, x))

    def _deliver(self, t: float) -> None:
        due: list[tuple[float, int, int, int, Any]] = [
            (at, _BATCH, i, r, b) for i, (at, r, b) in enumerate(self.channel.due(t))
        ]
        while self.outputs and self.outputs[0][0] <= t:
            due.append(heapq.heappop(self.outputs))
        for at, kind, _, r, x in sorted(due, key=lambda e: e[:3]):
            if kind == _BATCH:
                if self.router is not None:
                    self.router.now = at
                    self.router.receive(r, x.seq, x.payload)
            elif kind == _FIRST:
                for router in self._routers():
                    router.first_token(x)
            else:
                self._finish(r, x)
        for r in sorted(self.draining):
            if r not in self.busy and not any(rr == r for rr, _ in self.in_flight.values()):
                self._retire(r)

    def _finish(self, replica: int, m: RequestRow) -> None:
        rid = m.request_id
        holder = self.in_flight.get(rid)
        if holder is None or holder[0] != replica:
            if rid in self.done:
                self.inv.duplicate_completions.append(rid)
            self.stats["stale_outputs"] += 1
            return
        if replica not in self.live:
            self.inv.served_by_dead += 1
        del self.in_flight[rid]
        d = self.decisions[rid]
        blocks = d.predicted_blocks
        predicted = None if blocks is None else blocks * self.config.block_size
        self.done[rid] = m.route(
            replica, self.routes[rid], predicted,
            d.decision_s * 1e6, d.hash_s * 1e6, d.decision_cpu_s * 1e6,
        )  # fmt: skip
        if self.plan.lose_completions and self.rng.random() < self.plan.lose_completions:
            self.stats["lost_completions"] += 1
            return
        for router in self._routers():
            router.finished(rid)

    def route(self, request: SimRequest, t: float) -> None:
        """Route (and dispatch) one request at ``t``, retrying past dead replicas."""
        self.routes.setdefault(request.id, 0)
        while True:
            router = self.router or self.bootstrap
            decision = router.route(request, t)
            r = decision.worker.replica
            if r in router.dead:
                self.inv.routed_to_dead += 1
            self.routes[request.id] += 1
            try:
                self.fleet.add(r, request)
            except ReplicaDeadError:
                self.stats["dispatch_failures"] += 1
                self._replica_died(r, t, restart=False)
                continue
            self.decisions[request.id] = decision
            self.in_flight[request.id] = (r, request)
            self.busy.add(r)
            return

    def _void_after(self, replica: int, t: float) -> list[SimRequest]:
        """Discard what ``replica`` did after ``t``; return its unfinished requests."""
        self.channel.discard(replica, t)
        self.outputs = [o for o in self.outputs if not (o[3] == replica and o[0] > t)]
        heapq.heapify(self.outputs)
        self.busy.discard(replica)
        return [req for rid, (r, req) in sorted(self.in_flight.items()) if r == replica]

    def _replica_died(self, replica: int, t: float, *, restart: bool) -> None:
        lost = self._void_after(replica, t)
        if restart:  # the new process counts its busy time from 0: keep the old one's
            base = self.busy_base.get(replica, 0.0) + self.busy_s[replica]
            self.busy_base[replica], self.busy_s[replica] = base, 0.0
            self._start(replica, t)
            for router in self._routers():
                router.replica_restarted(replica)
        else:
            self._remove(replica, dead=True)
        for req in sorted(lost, key=lambda q: (q.arrival or 0.0, q.id)):
            del self.in_flight[req.id]
            self.route(req, t)

    def _remove(self, replica: int, *, dead: bool) -> None:
        for router in self._routers():
            router.remove_replica(replica, dead=dead)
        self.live.discard(replica)
        self.gone.add(replica)

    def _retire(self, replica: int) -> None:
        self._remove(replica, dead=False)
        self.draining.discard(replica)
        self.fleet.kill(replica)

    def apply(self, fault: ScheduledFault) -> None:
        """Apply a timed fault at its time (the fleet is advanced there first)."""
        t = fault.at
        self.advance_to(t)
        r, kind = fault.replica, fault.kind
        if kind == "scale_up":
            self.start_replica(self.next_id, t)
            self.next_id += 1
        elif kind in ("router_restart", "late_join"):
            self._warm_up(fault.mode, t, kind)
        elif r is None or r not in self.live:
            return  # already gone (every other fault names a replica)
        elif kind == "kill":
            self.fleet.kill(r)
            self._replica_died(r, t, restart=False)
        elif kind == "restart":
            self._replica_died(r, t, restart=True)
        elif kind == "clear":
            self.fleet.reset_prefix_cache(r)
            self.busy.add(r)
            self.advance_to(t)  # publish the clear
        elif kind == "gap":
            self.channel.blackout(r, self.config.buffer_steps + 1)
        elif kind == "scale_down":
            for router in self._routers():
                router.drain(r)
            self.draining.add(r)
            self._deliver(t)

    def _warm_up(self, mode: str, t: float, kind: str) -> None:
        self.router = router = self._new_router()
        router.now = t
        for r in sorted(self.live):
            self._join(router, r)
        for r in sorted(self.draining):
            router.drain(r)
        t0 = time.perf_counter()
        for tracker in router.trackers.values():
            if mode == "dump":
                tracker.resync()
            else:
                tracker.sync()
        stats = router.stream_stats()
        wall_ms = (time.perf_counter() - t0) * 1e3
        self.warmups.append(
            {"kind": kind, "mode": mode, "at_s": t, "wall_ms": wall_ms,
             "batches_replayed": stats.get("delivered", 0), "dumps": stats.get("resyncs", 0)}
        )  # fmt: skip

    def drain(self, faults: list[ScheduledFault]) -> None:
        """Apply the remaining faults, then run every replica dry and sync the streams."""
        for fault in faults:
            self.apply(fault)
        while self.busy & self.live or self.outputs or self.channel.pending:
            self.advance_to(math.inf)
        if self.router is not None:
            self.router.now = math.inf
            for tracker in self.router.trackers.values():
                tracker.sync()

    def check_views(self) -> None:
        """Compare the router's view of each live replica with what it holds, and the gone
        ones the index still holds."""
        router = self.router
        if router is None or router.cluster_index is None or not router.cluster_index.event_fed:
            return
        index = router.cluster_index
        for r in sorted(self.live):
            view = index.held(Worker(r))
            if r in index.incompatible:
                if view:
                    self.inv.diverged.append(f"replica {r} is incompatible yet indexed")
                continue
            truth = self.fleet.held(r)
            missing = set(truth) - set(view)
            phantom = {h for h in view if view[h] > truth.get(h, 0)}
            if self.plan.drop_removals:
                self.inv.phantom_blocks += len(phantom)
                phantom = set()
            if missing or phantom:
                self.inv.diverged.append(
                    f"replica {r}: {len(missing)} blocks held but not indexed, "
                    f"{len(phantom)} indexed but not held"
                )
        self.inv.stale_view += [r for r in sorted(self.gone) if index.held(Worker(r))]
