"""An approximate cluster index built from the router's own decisions, with a TTL.

The design of SGLang's router (``cache_aware``: "an approximate radix tree for each
worker based on request history"), Ray's ``PrefixCacheAffinityRouter`` (a prefix tree
"updated from routing decisions only") and Dynamo's ``--no-kv-events`` mode ("predicts
cache state based on routing decisions with TTL-based expiration (default 120s) and
pruning"): when a request is sent to a worker, its blocks are assumed cached there
for ``ttl`` seconds, and refreshed by each later request that carries them. No event
is read, so the index cannot see evictions, restarts or other routers' decisions: its
errors are what the event-fed indexes are measured against.

Keys are the request's chained block hashes (any router-side hash works). Per worker,
entries are kept in expiry order (an ``OrderedDict``: the TTL is fixed, so refreshing
moves an entry to the end), which makes expiry and the optional size cap (Dynamo's
``PruneManager``, SGLang's ``max_tree_size``) O(1) per entry dropped.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from prefixkv.adapters.events.wire import EventBatch

from .bitmask import WorkerBitmasks
from .errors import ClusterSettingsError
from .keys import RouteKeys, Worker

__all__ = ["DYNAMO_APPROX_TTL_S", "ApproxIndex"]

DYNAMO_APPROX_TTL_S = 120.0
"""Dynamo's ``router_ttl_secs`` for its approximate (no-events) indexer."""


class ApproxIndex(WorkerBitmasks):
    """Blocks assumed cached where the router sent them, for ``ttl`` seconds.

    Args:
        ttl: seconds an entry lives after the last request that carried it; ``None``
            keeps entries forever (Ray's prefix tree with eviction off, its default).
        max_blocks: most entries per worker (the oldest go first), or ``None``.

    Raises:
        ClusterSettingsError: a TTL or cap that is not positive.
    """

    kind = "approx"
    event_fed = False

    def __init__(
        self, ttl: float | None = DYNAMO_APPROX_TTL_S, max_blocks: int | None = None
    ) -> None:
        if ttl is not None and not (isinstance(ttl, (int, float)) and ttl > 0):
            raise ClusterSettingsError(f"ttl must be None or > 0 seconds, got {ttl!r}")
        if max_blocks is not None and (type(max_blocks) is not int or max_blocks < 1):
            raise ClusterSettingsError(
                f"max_blocks must be None or an int >= 1, got {max_blocks!r}"
            )
        super().__init__()
        self.ttl = math.inf if ttl is None else float(ttl)
        self.max_blocks = max_blocks
        self.incompatible: dict[int, str] = {}
        self._holders: dict[int, int] = {}  # hash -> worker bitmask
        self._entries: dict[int, OrderedDict[int, float]] = {}  # bit -> hash -> expiry
        self._stats = dict.fromkeys(("inserted", "expired", "capped"), 0)

    def _new_worker(self, bit: int) -> None:
        self._entries[bit] = OrderedDict()

    def _drop(self, h: int, bit: int) -> None:
        mask = self._holders[h] & ~bit
        if mask:
            self._holders[h] = mask
        else:
            del self._holders[h]

    def _expire(self, now: float) -> None:
        if self.ttl == math.inf:
            return
        for bit, entries in self._entries.items():
            while entries:
                h, expiry = next(iter(entries.items()))
                if expiry > now:
                    break
                del entries[h]
                self._drop(h, bit)
                self._stats["expired"] += 1

    # ------------------------------------------------------------ updates

    def apply(self, replica: int, batch: EventBatch, now: float) -> None:
        """Nothing: this index reads no events."""

    def on_routed(self, worker: Worker, keys: RouteKeys, now: float) -> None:
        """Assume ``worker`` caches the request's blocks until ``now + ttl``.

        Complexity: O(request blocks), plus O(1) per entry the cap drops.
        """
        bit = self._bit(worker)
        entries = self._entries[bit]
        holders = self._holders
        expiry = now + self.ttl
        for h in keys.block_hashes:
            if h in entries:
                entries.move_to_end(h)
            else:
                holders[h] = holders.get(h, 0) | bit
                self._stats["inserted"] += 1
            entries[h] = expiry
        cap = self.max_blocks
        while cap is not None and len(entries) > cap:
            h, _ = entries.popitem(last=False)
            self._drop(h, bit)
            self._stats["capped"] += 1

    def clear(self, replica: int, data_parallel_rank: int | None = None) -> None:
        """Forget what was assumed of ``replica`` (one rank when given)."""
        for bit in self._bits_of(replica, data_parallel_rank):
            entries = self._entries[bit]
            for h in entries:
                self._drop(h, bit)
            entries.clear()

    def forget(self, replica: int) -> None:
        """Forget ``replica`` and free its worker bits."""
        self.clear(replica)
        for bit in self._forget_workers(replica):
            del self._entries[bit]

    # ------------------------------------------------------------ queries

    def match(self, keys: RouteKeys, now: float) -> dict[Worker, int]:
        """Leading blocks each worker was sent (and not expired) for this request.

        Complexity: O(matched blocks) plus the expiries due since the last call.
        """
        self._expire(now)
        holders = self._holders
        drop_out = self._drop_out
        active = -1
        depth = 0
        out: dict[Worker, int] = {}
        for h in keys.block_hashes:
            keep = holders.get(h, 0) & active
            gone = active & ~keep if depth else 0
            if gone:
                drop_out(out, gone, depth)
            if not keep:
                return out
            active = keep
            depth += 1
        if depth:
            drop_out(out, active, depth)
        return out

    def held(self, worker: Worker) -> dict[int, int]:
        """The hashes assumed cached on ``worker`` (not expired as of the last query)."""
        bit = self._bits.get(worker)
        return dict.fromkeys(self._entries[bit], 1) if bit is not None else {}

    def num_blocks(self, worker: Worker) -> int:
        """Entries assumed on ``worker``. O(1)."""
        bit = self._bits.get(worker)
        return len(self._entries[bit]) if bit is not None else 0

    def stats(self) -> dict[str, int]:
        """Counters, plus ``entries`` (distinct hashes)."""
        return {**self._stats, "entries": len(self._holders)}
