"""One engine replica of a cluster, stepped in virtual time, publishing its KV events.

A :class:`~prefixkv.adapters.lab.sim.replica.Replica` (its seat, the engine class, the
schedule over it and the cost profile), with no serving front end, plus an event
publisher, driven from outside: the cluster adds requests as the router sends them and
advances every replica to the next routing decision. Each scheduler step publishes one
event batch, stamped with the step's start and numbered from 0 (vLLM collects
``take_events`` in ``schedule`` and publishes once per step); events left by a step
after which the replica goes idle are published when it ends.

The replica also keeps what Dynamo calls its local indexer (:class:`LocalIndexer`):
the blocks its own events say it holds, with parents and tokens, so it can answer a
router's request for a dump, and so a run can check, at every admission, that the
hit the engine serves is made of blocks its events announced.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from prefixkv.adapters.events.wire import (
    BlockRemoved,
    KVEventBatch,
)
from prefixkv.adapters.lab.sim.errors import SimUnservableError
from prefixkv.adapters.lab.sim.metrics import RequestRow
from prefixkv.adapters.lab.sim.replica import IndexFactory, Replica, pool_seat
from prefixkv.adapters.lab.sim.replica_scheduler import Chunk
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch
from prefixkv.indexes.base import SupportsEventSink

from .errors import ClusterSettingsError
from .local_indexer import KVEvent, LocalIndexer
from .publisher import EventPublisher

if TYPE_CHECKING:
    from .fleet import ReplicaSpec

__all__ = ["ReplicaReport", "SharedPool", "SimReplica"]


class SharedPool:
    """One replica's seat (its engine class over an index and a pool), or one shared
    by several (the pooled bound).

    Args:
        index_factory: makes the (empty) index.
        capacity_tokens: the pool in tokens.
        batching: the replicas' batching (it picks the engine class).
        events: the class queues KV events (a pooled cache publishes none).
        shared: several replicas schedule over it (one may have to wait for another).

    Raises:
        ClusterSettingsError: a capacity holding no block.
    """

    def __init__(
        self,
        index_factory: IndexFactory,
        capacity_tokens: int,
        batching: str,
        *,
        events: bool,
        shared: bool = False,
    ) -> None:
        self.index, self.seat = pool_seat(
            batching, index_factory, capacity_tokens, events=events, error=ClusterSettingsError
        )
        # An index that reports nothing (the ``none`` backend) publishes no events.
        self.events = events and isinstance(self.index, SupportsEventSink)
        self.shared = shared


class ReplicaReport(NamedTuple):
    """What a replica produced while advancing.

    Attributes:
        replica: its id.
        now: its clock (end of its last step, or of its idle wait).
        batches: event batches published, in ``seq`` order.
        first_tokens: ``(request id, time)`` of first tokens.
        finished: records of requests that finished.
        num_waiting: waiting requests now.
        num_running: running requests now.
        kv_usage: the KV-cache usage its engine reports (the seat's ``usage``):
            vLLM's ``KVCacheManager.usage`` (``BlockPool.get_usage``, 1 - free /
            usable blocks) or SGLang's ``token_usage`` (used / max_total_num_tokens),
            evictable cached blocks counting as free in both.
        busy_s: seconds spent in steps since the replica started.
        violations: admissions that hit blocks the replica never announced.
    """

    replica: int
    now: float
    batches: list[SeqBatch]
    first_tokens: list[tuple[str, float]]
    finished: list[RequestRow]
    num_waiting: int
    num_running: int
    kv_usage: float
    busy_s: float
    violations: list[str]


class SimReplica(Replica):
    """A replica in virtual time: ``add`` requests, ``advance`` to a time, read reports.

    Args:
        spec: how to build it (:class:`~.fleet.ReplicaSpec`): its index, pool, scheduler
            settings, profile, event buffer, event loss and start time; with
            ``settings.check``, each first admission's hit is checked against the
            blocks its events announced (hashing every prompt: for tests).
        replica_id: its id in the fleet (its event loss is seeded with it).
        pool: the seat shared with other replicas (the pooled bound: no events, no
            check); by default the replica has its own.

    Raises:
        ClusterSettingsError: a capacity holding no block.
    """

    def __init__(
        self, spec: ReplicaSpec, replica_id: int, *, pool: SharedPool | None = None
    ) -> None:
        cfg = spec.settings
        check = cfg.check and pool is None
        if pool is None:
            pool = SharedPool(
                spec.index_factory(), cfg.capacity_tokens, cfg.sim.batching, events=True
            )
        # Tokens reach the router at the step's end: no streaming front end.
        super().__init__(pool.seat, cfg.sim, spec.profile, start_time=spec.start_time, stream=False)
        self.pool = pool
        self.replica_id = replica_id
        self.publisher = EventPublisher(cfg.buffer_steps)
        self.local = LocalIndexer(pool.seat.block_size, keep_tokens=cfg.keep_tokens)
        self.data_parallel_rank = 0
        self.check_scheme = spec.scheme() if check else None
        self._batches: list[SeqBatch] = []
        self._first: list[tuple[str, float]] = []
        self._finished: list[RequestRow] = []
        self._violations: list[str] = []
        self._hashes: dict[str, list[int]] = {}
        self._drop_removals = spec.drop_removals
        self._rng = random.Random(cfg.seed * 1_000_003 + replica_id)

    # ------------------------------------------------------------ requests

    def add(self, request: SimRequest, sent: float | None = None) -> RequestRow:
        """Queue a request the router sent (at ``sent``, default its arrival or now);
        it waits for the next step. An idle replica's clock moves to it.

        Raises:
            SimUnservableError: it cannot fit this replica's pool even alone.
        """
        if sent is None:
            sent = request.arrival if request.arrival is not None else self.now
        idle = not self.has_unfinished()
        metrics = super().add(request, sent)
        if idle:
            self.now = max(self.now, sent)
        if self.check_scheme is not None:
            self._hashes[request.id] = self.check_scheme.block_hashes(request.prompt)
        return metrics

    def advance(self, until: float) -> ReplicaReport:
        """Run every step that starts before ``until``; report what happened."""
        while self.has_unfinished() and self.now < until:
            self.step()
        return self._report()

    def drain(self) -> ReplicaReport:
        """Run until every request has finished."""
        return self.advance(math.inf)

    def step(self) -> bool:
        """Run one step (the pooled fleet interleaves replicas step by step).

        Returns:
            False when nothing could be scheduled: on a shared pool, the other
            replicas hold the blocks; it waits for them.
        """
        start = self.now
        plan = self.plan()
        if not plan.chunks:
            if self.pool.shared:
                return False
            raise SimUnservableError(  # pragma: no cover - add() checks servability
                f"replica {self.replica_id}: nothing schedulable at t={start:.6f}"
            )
        self._publish(start)
        if self.check_scheme is not None:
            self._check_admissions(plan.chunks, start)
        step = self.run(plan)
        for seq, _, _ in plan.chunks:
            m = seq.metrics
            if m.first_token_s == step.end:
                self._first.append((m.request_id, step.end))
        for seq in step.finished:
            self._finished.append(seq.metrics)
            self._hashes.pop(seq.metrics.request_id, None)
        if not self.has_unfinished():
            self._publish(step.end)
        return True

    def _check_admissions(self, chunks: Sequence[Chunk], now: float) -> None:
        # Blocks hit at a first admission must have been announced by the time the
        # step runs: in this step's batch (published at schedule time) or before.
        for seq, _, _ in chunks:
            m = seq.metrics
            if m.first_scheduled_s != now or seq.num_admissions != 1:
                continue
            hit_blocks = m.hit_tokens // self.seat.block_size
            announced = self.local.prefix(self._hashes.get(m.request_id, []))
            if hit_blocks > announced:
                self._violations.append(
                    f"replica {self.replica_id}: request {m.request_id!r} hit {hit_blocks} "
                    f"blocks at t={now:.3f}, its events announced {announced}"
                )

    def _publish(self, ts: float) -> None:
        if not self.pool.events:
            return
        events: list[KVEvent] = self.seat.take_events()
        if not events:
            return
        self.local.apply(events)
        if self._drop_removals:
            # lost inside the engine: neither published nor buffered for replay
            p, rng = self._drop_removals, self._rng
            events = [e for e in events if not (isinstance(e, BlockRemoved) and rng.random() < p)]
            if not events:
                return
        batch = KVEventBatch(ts=ts, events=events, data_parallel_rank=self.data_parallel_rank)
        self._batches.append(self.publisher.publish(batch))

    def _report(self) -> ReplicaReport:
        report = ReplicaReport(
            self.replica_id,
            self.now,
            self._batches,
            self._first,
            self._finished,
            len(self.schedule.waiting),
            len(self.schedule.running),
            self.seat.usage,  # as its engine computes it, to the last bit
            self.busy_s,
            self._violations,
        )
        self._batches, self._first, self._finished, self._violations = [], [], [], []
        return report

    # ------------------------------------------------------------ control

    def replay(self, start: int, until: float) -> list[SeqBatch]:
        """Buffered batches from ``start`` published at or before ``until``."""
        return self.publisher.replay(start, until)

    def dump(self) -> Dump:
        """The cache as ``BlockStored`` batches and the ``seq`` the stream continues from."""
        events = self.local.dump_events()
        rank = self.data_parallel_rank
        payloads = [
            self.publisher.encode(KVEventBatch(self.now, events[i : i + 256], rank))
            for i in range(0, len(events), 256)
        ]
        return Dump(self.publisher.next_seq, payloads)

    def reset_prefix_cache(self) -> None:
        """vLLM's ``reset_prefix_cache(reset_running_requests=True)``: preempt every
        running request (recompute: back to the waiting queue's front), then drop the
        whole cache; publishes ``AllBlocksCleared``."""
        self.schedule.preempt_all()
        self.seat.reset()
        self._publish(self.now)

    def held(self) -> dict[int, int]:
        """Hash -> copies the replica's events say it holds now."""
        return self.local.held()

    def in_flight(self) -> list[str]:
        """Ids of the requests waiting or running."""
        sched = self.schedule
        return [s.request.id for s in (*sched.waiting, *sched.running)]
