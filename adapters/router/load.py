"""Per-worker load as the router books it: reservations at route time, gauges from engines.

The router's own view (Dynamo's ``ActiveSequences``, Ray 2.60's ``KVTokenTracker``):
each routed request reserves, on its worker, its predicted uncached prefill tokens
(and their cost-model seconds) and its decode blocks, *at the moment it is routed* —
a separate select-then-reserve "causes herding because concurrent requests can select
the same worker from stale load state" (Ray). The prefill part is released when the
first token comes back, the rest when the request finishes. A completion that never
comes back (a lost message, a crashed replica) is swept after ``ttl`` seconds (Ray's
``REQUEST_TRACKING_TTL_S``), so a reservation cannot leak load forever.

Beside the bookings, each worker's engine-reported gauges (waiting and running
requests, KV usage), which llm-d's scorers read, are kept as last reported.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .errors import ClusterSettingsError
from .keys import Worker

__all__ = ["REQUEST_TRACKING_TTL_S", "LoadTracker", "Reservation", "WorkerLoad"]

REQUEST_TRACKING_TTL_S = 3600.0
"""Ray 2.60's stale-request sweep (``REQUEST_TRACKING_TTL_S``)."""


@dataclass(slots=True)
class WorkerLoad:
    """One worker's booked load and last reported gauges.

    Attributes:
        active_requests: routed and not finished.
        prefill_tokens: predicted uncached prompt tokens not yet prefilled (Dynamo's
            ``active_prefill_tokens``).
        prefill_s: the same work in cost-model seconds (Mooncake's queue time).
        decode_blocks: blocks the active requests will hold (Dynamo's decode load).
        num_waiting: the engine's waiting queue, as last reported.
        num_running: the engine's running requests, as last reported.
        kv_usage: the engine's KV-cache usage in [0, 1], as last reported.
        reported_at: when the gauges were reported (virtual seconds).
    """

    active_requests: int = 0
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_blocks: int = 0
    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0
    reported_at: float = float("-inf")


@dataclass(slots=True)
class Reservation:
    """What one routed request booked on its worker."""

    request_id: str
    worker: Worker
    prefill_tokens: int
    prefill_s: float
    decode_blocks: int
    created: float
    prefilled: bool = False


class LoadTracker:
    """Reservations per worker, released on first token and on completion, swept by TTL.

    Args:
        ttl: seconds after which a reservation still open is dropped.

    Raises:
        ClusterSettingsError: a TTL that is not > 0.
    """

    def __init__(self, ttl: float = REQUEST_TRACKING_TTL_S) -> None:
        if not (isinstance(ttl, (int, float)) and ttl > 0):
            raise ClusterSettingsError(f"reservation ttl must be > 0 seconds, got {ttl!r}")
        self.ttl = float(ttl)
        self._loads: dict[Worker, WorkerLoad] = {}
        self._open: dict[str, Reservation] = {}
        self._order: deque[Reservation] = deque()  # by creation time
        self.num_swept = 0
        """Reservations dropped by the TTL sweep (lost completions)."""

    def load(self, worker: Worker) -> WorkerLoad:
        """The worker's load (created empty on first use). O(1)."""
        load = self._loads.get(worker)
        if load is None:
            load = self._loads[worker] = WorkerLoad()
        return load

    def reserve(
        self,
        request_id: str,
        worker: Worker,
        *,
        prefill_tokens: int,
        prefill_s: float,
        decode_blocks: int,
        now: float,
    ) -> None:
        """Book a routed request on ``worker`` (replacing an open booking of the same id,
        as when a request is routed again after its replica died). O(1)."""
        self.free(request_id)
        r = Reservation(request_id, worker, prefill_tokens, prefill_s, decode_blocks, now)
        self._open[request_id] = r
        self._order.append(r)
        load = self.load(worker)
        load.active_requests += 1
        load.prefill_tokens += prefill_tokens
        load.prefill_s += prefill_s
        load.decode_blocks += decode_blocks

    def prefill_complete(self, request_id: str) -> None:
        """The request's first token came back: release its prefill booking. O(1)."""
        r = self._open.get(request_id)
        if r is None or r.prefilled:
            return
        r.prefilled = True
        self._release_prefill(r)

    def _release_prefill(self, r: Reservation) -> None:
        load = self.load(r.worker)
        load.prefill_tokens -= r.prefill_tokens
        load.prefill_s -= r.prefill_s
        if not load.prefill_tokens:  # float sums drift: nothing is booked at zero tokens
            load.prefill_s = 0.0

    def free(self, request_id: str) -> bool:
        """The request finished (or left): release what it still books. O(1).

        Returns:
            Whether a booking was open.
        """
        r = self._open.pop(request_id, None)
        if r is None:
            return False
        if not r.prefilled:
            self._release_prefill(r)
        load = self.load(r.worker)
        load.active_requests -= 1
        load.decode_blocks -= r.decode_blocks
        return True

    def sweep(self, now: float) -> int:
        """Drop bookings older than ``ttl``. Amortized O(1) per booking ever made.

        Returns:
            How many were dropped now.
        """
        dropped = 0
        order, open_ = self._order, self._open
        while order:
            r = order[0]
            is_open = open_.get(r.request_id) is r
            if is_open and r.created + self.ttl > now:
                break
            order.popleft()
            if is_open:
                self.free(r.request_id)
                dropped += 1
        self.num_swept += dropped
        return dropped

    def report(
        self, worker: Worker, now: float, *, num_waiting: int, num_running: int, kv_usage: float
    ) -> None:
        """Record the engine's gauges for ``worker``."""
        load = self.load(worker)
        load.num_waiting = num_waiting
        load.num_running = num_running
        load.kv_usage = kv_usage
        load.reported_at = now

    def remove_worker(self, worker: Worker) -> list[str]:
        """Forget ``worker``: its bookings are dropped. Returns their request ids."""
        ids = [rid for rid, r in self._open.items() if r.worker == worker]
        for rid in ids:
            self.free(rid)
        self._loads.pop(worker, None)
        return ids

    def open_requests(self) -> int:
        """Bookings still open."""
        return len(self._open)
