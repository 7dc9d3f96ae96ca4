"""The router: one policy over a cluster index, a load tracker and the replicas' streams.

What Ray 2.60 moved into its ingress and Dynamo runs in its frontend, in one object:
per replica a :class:`~.stream_tracker.StreamTracker` (event-fed indexes only) applying the
replica's batches to the index in order; the :class:`~.load.LoadTracker`; the worker
set (serving, draining); and :meth:`Router.route`, which computes the request's block
keys, asks the index, lets the policy choose among the serving workers, then reserves
the load and tells the index in the same call (an atomic select-and-reserve, so a
burst of equal requests does not herd on stale load).

The router never holds a replica it knows to be dead among its candidates; a replica
the driver reports dead or gone is forgotten by the index and the load tracker.
"""

from __future__ import annotations

import random
import time
from array import array
from collections.abc import Callable
from typing import NamedTuple, Protocol

from prefixkv.adapters.events.wire import EventBatch

from .cluster_index import ClusterIndex
from .errors import NoReplicaError
from .keys import HashScheme, RouteKeys, Worker, request_extra_key
from .load import REQUEST_TRACKING_TTL_S, LoadTracker
from .routing import CostModel, RouteContext, RoutingPolicy
from .stream_tracker import Dump, SeqBatch, StreamTracker

__all__ = ["Decision", "RouteRequest", "Router"]

SWEEP_INTERVAL_S = 60.0
"""How often (virtual seconds) open reservations are swept, at most (and at least as
often as their TTL)."""


class RouteRequest(Protocol):
    """What :meth:`Router.route` reads of a request: any object with these three
    (the simulator's request is one), and its namespace when it has one: an
    ``extra_key`` attribute (``None``, a str, or ``(kind, value)`` pairs as
    :func:`~prefixkv.indexes.tokens.make_extra_key` builds them from a LoRA name, a
    cache salt, a tenant or SGLang's extra key). Its block keys are hashed in that
    namespace, as the engines hash its blocks, so it is never predicted to hit
    another namespace's blocks."""

    @property
    def id(self) -> str:
        """Unique among the requests in flight (the load booking's key)."""
        ...

    @property
    def prompt(self) -> array[int]:
        """The prompt's token ids, ``array('I')``."""
        ...

    @property
    def output_len(self) -> int:
        """Tokens it may generate (``max_tokens``): its decode load."""
        ...


class Decision(NamedTuple):
    """One routing decision.

    Attributes:
        worker: where the request goes.
        predicted_blocks: blocks the index predicted cached there (capped as
            admission caps), or ``None`` for a policy that reads no index.
        decision_s: wall seconds of the decision (index match, policy, booking).
        hash_s: wall seconds computing the request's block keys.
        decision_cpu_s: the decision's CPU seconds in this thread (hashing excluded):
            its cost without the waits a busy machine adds to the wall clock.
    """

    worker: Worker
    predicted_blocks: int | None
    decision_s: float
    hash_s: float
    decision_cpu_s: float


class Router:
    """Routes requests over the replicas it knows.

    Args:
        policy: the routing policy.
        cluster_index: the cluster index it reads (``None`` for load-only policies).
        scheme: the fleet's hash scheme.
        profile: the cost model (prefill seconds booked per request), e.g. the
            lab's ``CostProfile``.
        seed: seeds ties and sampling.
        reservation_ttl: seconds before an open booking is swept.
    """

    def __init__(
        self,
        policy: RoutingPolicy,
        cluster_index: ClusterIndex | None,
        scheme: HashScheme,
        profile: CostModel,
        *,
        seed: int = 0,
        reservation_ttl: float = REQUEST_TRACKING_TTL_S,
    ) -> None:
        self.policy = policy
        self.cluster_index = cluster_index
        self.scheme = scheme
        self.block_size = scheme.block_size
        self.profile = profile
        self.rng = random.Random(seed)
        self.loads = LoadTracker(reservation_ttl)
        self.now = 0.0
        self.serving: dict[Worker, None] = {}
        self.draining: set[Worker] = set()
        self.dead: set[int] = set()
        self.trackers: dict[int, StreamTracker] = {}
        self._candidates: list[Worker] | None = None
        self._next_sweep = min(SWEEP_INTERVAL_S, reservation_ttl)
        self.num_decisions = 0

    # ------------------------------------------------------------ membership

    def add_replica(
        self,
        replica: int,
        replay: Callable[[int, float], list[SeqBatch] | None] | None = None,
        dump: Callable[[], Dump | None] | None = None,
    ) -> None:
        """Start routing to ``replica``.

        For an event-fed index, its stream is followed through ``replay`` and ``dump``
        (a simulated replica); without them the caller feeds the index itself, e.g.
        with :func:`~.event_feed.subscribe` on a real engine's ZeroMQ stream.
        """
        self.dead.discard(replica)
        self.serving[Worker(replica)] = None
        self._candidates = None
        if (
            replay is not None
            and dump is not None
            and self.cluster_index is not None
            and self.cluster_index.event_fed
        ):
            self.trackers[replica] = StreamTracker(
                on_batch=lambda seq, batch: self._apply(replica, batch),
                replay=lambda start: replay(start, self.now),
                dump=dump,
                on_restart=lambda: self._forget(replica),
                on_resync=lambda: self._forget(replica),
            )

    def drain(self, replica: int) -> None:
        """Stop sending ``replica`` new requests (scale down); it finishes what it has."""
        for w in list(self.serving):
            if w.replica == replica:
                del self.serving[w]
                self.draining.add(w)
        self._candidates = None

    def remove_replica(self, replica: int, *, dead: bool) -> None:
        """Forget ``replica``: a dead one, or a drained one that left."""
        for w in [*self.serving, *self.draining]:
            if w.replica == replica:
                self.serving.pop(w, None)
                self.draining.discard(w)
                self.loads.remove_worker(w)
        self.trackers.pop(replica, None)
        self._forget(replica)
        if dead:
            self.dead.add(replica)
        self._candidates = None

    def replica_restarted(self, replica: int) -> None:
        """Membership says ``replica`` came back empty. An event-fed index learns it from
        the stream (the sequence restarts); a decision-history index only from here."""
        if self.cluster_index is not None and not self.cluster_index.event_fed:
            self.cluster_index.forget(replica)

    def _forget(self, replica: int) -> None:
        if self.cluster_index is not None:
            self.cluster_index.forget(replica)

    def _apply(self, replica: int, batch: EventBatch) -> None:
        if self.cluster_index is not None:
            self.cluster_index.apply(replica, batch, self.now)

    # ------------------------------------------------------------ feedback

    def receive(self, replica: int, seq: int, payload: bytes) -> None:
        """A batch of ``replica``'s stream arrived (ignored for unknown replicas)."""
        tracker = self.trackers.get(replica)
        if tracker is not None:
            tracker.receive(seq, payload)

    def first_token(self, request_id: str) -> None:
        """The request's first token came back: its prefill booking is released."""
        self.loads.prefill_complete(request_id)

    def finished(self, request_id: str) -> None:
        """The request finished: its booking is released."""
        self.loads.free(request_id)

    def gauges(self, replica: int, *, num_waiting: int, num_running: int, kv_usage: float) -> None:
        """The replica's engine metrics (llm-d scrapes them)."""
        self.loads.report(
            Worker(replica),
            self.now,
            num_waiting=num_waiting,
            num_running=num_running,
            kv_usage=kv_usage,
        )

    # ------------------------------------------------------------ routing

    def candidates(self) -> list[Worker]:
        """Serving workers in fleet order."""
        if self._candidates is None:
            self._candidates = sorted(self.serving)
        return self._candidates

    def route(self, request: RouteRequest, now: float) -> Decision:
        """Choose a worker for ``request`` and book it there.

        Raises:
            NoReplicaError: no worker is serving.
            InvalidTokenError: the request's ``extra_key`` is not a namespace.
        """
        self.now = now
        if now >= self._next_sweep:
            self.loads.sweep(now)
            self._next_sweep = now + min(SWEEP_INTERVAL_S, self.loads.ttl)
        t0 = time.perf_counter()
        keys = RouteKeys(request.prompt, self.scheme, request_extra_key(request))
        index = self.cluster_index
        if index is not None:
            _ = keys.local_hashes if index.kind == "radix" else keys.block_hashes
        t1 = time.perf_counter()
        c1 = time.thread_time_ns()
        cands = self.candidates()
        if not cands:
            raise NoReplicaError(f"no replica to route {request.id!r} to at t={now:.3f} s")
        overlap = index.match(keys, now) if index is not None else {}
        ctx = RouteContext(
            now=now,
            request_id=request.id,
            keys=keys,
            num_tokens=len(request.prompt),
            output_len=request.output_len,
            candidates=cands,
            overlap=overlap,
            loads=self.loads,
            cluster_index=index,
            block_size=self.block_size,
            profile=self.profile,
            rng=self.rng,
        )
        worker = self.policy.choose(ctx)
        cached = ctx.cached_tokens(worker)
        uncached = ctx.num_tokens - cached
        bs = self.block_size
        self.loads.reserve(
            request.id,
            worker,
            prefill_tokens=uncached,
            prefill_s=self.profile.prefill_s(uncached, cached),
            decode_blocks=-(-(ctx.num_tokens + request.output_len) // bs),
            now=now,
        )
        if index is not None:
            index.on_routed(worker, keys, now)
        c2 = time.thread_time_ns()
        t2 = time.perf_counter()
        self.num_decisions += 1
        predicted = cached // bs if index is not None else None
        return Decision(worker, predicted, t2 - t1, t1 - t0, (c2 - c1) / 1e9)

    def stream_stats(self) -> dict[str, int]:
        """Tracker counters summed over replicas."""
        out: dict[str, int] = {}
        for tracker in self.trackers.values():
            for k, v in tracker.stats.items():
                out[k] = out.get(k, 0) + v
        return out
