"""One replica of a cluster: a simulated :class:`~..sim.replica.Replica` plus an event
publisher.

Driven from outside, in virtual time. Each step publishes one batch stamped with its
start (vLLM publishes once per step); the events of the step after which the replica
goes idle, at its end.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from prefixkv.adapters.events.wire import BlockRemoved, KVEventBatch
from prefixkv.adapters.lab.sim.errors import SimUnservableError
from prefixkv.adapters.lab.sim.metrics import RequestRow
from prefixkv.adapters.lab.sim.replica import IndexFactory, Replica, pool_seat
from prefixkv.adapters.lab.sim.replica_scheduler import Chunk
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.sim.seats import Seat
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch

from .local_indexer import KVEvent, LocalIndexer
from .publisher import EventPublisher

if TYPE_CHECKING:
    from .fleet import ReplicaSpec

__all__ = ["ReplicaReport", "SimReplica", "replica_seat"]


def replica_seat(
    index_factory: IndexFactory, capacity_tokens: int, batching: str, *, events: bool
) -> Seat:
    """A replica's seat: its engine class over an index and a pool (shared by the pooled
    bound, which publishes no events); ClusterSettingsError for a capacity holding no block."""
    _, seat = pool_seat(
        batching, index_factory, capacity_tokens, events=events, error=ClusterSettingsError
    )
    return seat


class ReplicaReport(NamedTuple):
    """What a replica produced while advancing, and its state now (``kv_usage``: the
    usage its engine class reports; ``violations``: hits on blocks never announced)."""

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
    With ``settings.check`` (tests), each first admission's hit is checked against the
    blocks its events announced; ``seat`` is one shared with others (no events, no
    check). Raises :class:`ClusterSettingsError` for a capacity holding no block."""

    def __init__(self, spec: ReplicaSpec, replica_id: int, *, seat: Seat | None = None) -> None:
        cfg = spec.settings
        self.shared = seat is not None
        if seat is None:
            seat = replica_seat(
                spec.index_factory(), cfg.capacity_tokens, cfg.sim.batching, events=True
            )
        # Tokens reach the router at the step's end: no streaming front end.
        super().__init__(seat, cfg.sim, spec.profile, start_time=spec.start_time, stream=False)
        self.replica_id = replica_id
        self.publisher = EventPublisher(cfg.buffer_steps)
        self.local = LocalIndexer(seat.block_size, keep_tokens=cfg.keep_tokens)
        self.check_scheme = spec.scheme() if cfg.check and not self.shared else None
        self._batches: list[SeqBatch] = []
        self._first: list[tuple[str, float]] = []
        self._finished: list[RequestRow] = []
        self._violations: list[str] = []
        self._hashes: dict[str, list[int]] = {}
        self._drop_removals = spec.drop_removals
        self._rng = random.Random(cfg.seed * 1_000_003 + replica_id)

    def add(self, request: SimRequest, sent: float | None = None) -> RequestRow:
        """Queue a request sent at ``sent`` (default its arrival or now) for the next step;
        :class:`SimUnservableError` if it cannot fit this replica's pool even alone."""
        if sent is None:
            sent = request.arrival if request.arrival is not None else self.now
        idle = not self.has_unfinished()
        metrics = super().add(request, sent)
        if idle:
            self.idle_until(sent)
        if self.check_scheme is not None:
            self._hashes[request.id] = self.check_scheme.block_hashes(request.prompt)
        return metrics

    def advance(self, until: float) -> ReplicaReport:
        """Run every step that starts before ``until``; report what happened."""
        while self.has_unfinished() and self.now < until:
            self.step()
        report = ReplicaReport(
            self.replica_id,
            self.now,
            self._batches,
            self._first,
            self._finished,
            len(self.schedule.waiting),
            len(self.schedule.running),
            self.seat.usage,
            self.busy_s,
            self._violations,
        )
        self._batches, self._first, self._finished, self._violations = [], [], [], []
        return report

    def step(self) -> bool:
        """Run one step; False when, on a shared pool, the others hold the blocks."""
        start = self.now
        plan = self.plan()
        if not plan.chunks:
            if self.shared:
                return False
            raise SimUnservableError(  # pragma: no cover - add() checks servability
                f"replica {self.replica_id}: nothing schedulable at t={start:.6f}"
            )
        self._publish(start)
        if self.check_scheme is not None:
            self._check_admissions(plan.chunks, start)
        step = self.run(plan)
        self._first += [
            (seq.metrics.request_id, step.end)
            for seq, _, _ in plan.chunks
            if seq.metrics.first_token_s == step.end
        ]
        for seq in step.finished:
            self._finished.append(seq.metrics)
            self._hashes.pop(seq.metrics.request_id, None)
        if not self.has_unfinished():
            self._publish(step.end)
        return True

    def _check_admissions(self, chunks: Sequence[Chunk], now: float) -> None:
        # A first admission's hit must be announced by this step's batch or before.
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
        events: list[KVEvent] = self.seat.take_events()  # none from a shared seat
        if not events:
            return
        self.local.apply(events)
        if self._drop_removals:  # lost inside the engine: neither published nor buffered
            p, rng = self._drop_removals, self._rng
            events = [e for e in events if not (isinstance(e, BlockRemoved) and rng.random() < p)]
            if not events:
                return
        batch = KVEventBatch(ts=ts, events=events, data_parallel_rank=0)
        self._batches.append(self.publisher.publish(batch))

    def replay(self, start: int, until: float) -> list[SeqBatch]:
        """Buffered batches from ``start`` published at or before ``until``."""
        return self.publisher.replay(start, until)

    def dump(self) -> Dump:
        """The cache as ``BlockStored`` batches and the ``seq`` the stream goes on from."""
        events = self.local.dump_events()
        payloads = [
            self.publisher.encode(KVEventBatch(self.now, events[i : i + 256], 0))
            for i in range(0, len(events), 256)
        ]
        return Dump(self.publisher.next_seq, payloads)

    def reset_prefix_cache(self) -> None:
        """vLLM's ``reset_prefix_cache(reset_running_requests=True)``: preempt, clear,
        publish ``AllBlocksCleared``."""
        self.schedule.preempt_all()
        self.seat.reset()
        self._publish(self.now)

    def held(self) -> dict[int, int]:
        """Hash -> copies the replica's events say it holds now."""
        return self.local.held()
