"""The cluster index Protocol and its chained-hash implementation over :class:`EventIndex`.

A cluster index answers the router's one question, "how many leading blocks of this
request does each worker cache?", from what it has been told: the replicas' KV events
(event-fed: the chained-hash map here, the radix tree in :mod:`.block_tree`) or the router's
own decisions (:mod:`.approx`). Every implementation keys workers by (replica,
data-parallel rank, KV group) and checks each replica's stream before trusting it:

* a ``BlockStored`` whose ``block_size`` is not the router's is refused, and the
  replica is marked incompatible (Ray's ``_register_block_size`` check, Dynamo PR #2981);
* the chained-hash map also recomputes the first block hash of a replica's first chain
  from its tokens: a replica hashing differently (another seed or algorithm) would
  never match a request, silently; it is marked incompatible instead.

An incompatible replica's events are ignored until it is forgotten (a restart or a
removal); the router still sends it load, never predicted hits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, cast, runtime_checkable

from prefixkv.adapters.events.index import EventIndex, Source
from prefixkv.adapters.events.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
)

from .keys import HashScheme, RouteKeys, Worker

__all__ = ["ChainedHashIndex", "ClusterIndex", "StreamCheck", "wire_int"]


def wire_int(h: bytes | int) -> int:
    """A wire hash as vLLM's 64-bit int (raw digests: their low 64 bits)."""
    return h if isinstance(h, int) else int.from_bytes(h, "big") & 0xFFFF_FFFF_FFFF_FFFF


@runtime_checkable
class ClusterIndex(Protocol):
    """Which blocks each worker caches, as far as the router knows.

    Attributes:
        kind: ``"chained"``, ``"radix"`` or ``"approx"``.
        event_fed: whether it learns from KV events (``apply``) or from routing
            decisions (``on_routed``).
        incompatible: replica -> why its events are refused.
    """

    kind: str
    event_fed: bool
    incompatible: dict[int, str]

    def apply(self, replica: int, batch: EventBatch, now: float) -> None:
        """Apply one batch of ``replica``'s events, in stream order."""
        ...

    def match(self, keys: RouteKeys, now: float) -> dict[Worker, int]:
        """Leading blocks of the request each worker holds (only workers holding >= 1)."""
        ...

    def on_routed(self, worker: Worker, keys: RouteKeys, now: float) -> None:
        """The router sent the request to ``worker`` (an approximate index learns here)."""
        ...

    def clear(self, replica: int, data_parallel_rank: int | None = None) -> None:
        """Forget the blocks of ``replica`` (one rank when given): ``AllBlocksCleared``."""
        ...

    def forget(self, replica: int) -> None:
        """Forget ``replica`` entirely, checks included (it restarted, or left)."""
        ...

    def held(self, worker: Worker) -> dict[int, int]:
        """The block hashes the index says ``worker`` holds, with copies (a new dict)."""
        ...

    def num_blocks(self, worker: Worker) -> int:
        """How many blocks ``worker`` holds (the "smallest tree" of SGLang and Ray)."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters: block events applied, refused, unknown removals, entries."""
        ...


class StreamCheck:
    """Per-replica checks of an event stream: block size, and (optionally) hashes.

    Args:
        scheme: the router's hash scheme.
        verify_hashes: recompute the first block of a replica's first chain.
    """

    __slots__ = ("_verified", "incompatible", "scheme", "verify_hashes")

    def __init__(self, scheme: HashScheme, *, verify_hashes: bool) -> None:
        self.scheme = scheme
        self.verify_hashes = verify_hashes
        self.incompatible: dict[int, str] = {}
        self._verified: set[int] = set()

    def accepts(self, replica: int, event: BlockStored) -> bool:
        """Whether ``event`` may be applied; marks the replica incompatible when not."""
        if replica in self.incompatible:
            return False
        bs = self.scheme.block_size
        if event.block_size != bs:
            self.incompatible[replica] = f"block_size {event.block_size}, router {bs}"
            return False
        if (
            self.verify_hashes
            and replica not in self._verified
            and event.parent_block_hash is None
            and not event.lora_name
            and not any(event.extra_keys or ())
        ):
            expected = self.scheme.first_block_hash(event.token_ids)
            if expected is not None and event.block_hashes:
                got = wire_int(event.block_hashes[0])
                if expected != got:
                    self.incompatible[replica] = (
                        f"block hash {got:#x} for tokens the router "
                        f"hashes to {expected:#x}: another hash seed or algorithm"
                    )
                    return False
                self._verified.add(replica)
        return True

    def forget(self, replica: int) -> None:
        """Check the replica afresh (a new process)."""
        self.incompatible.pop(replica, None)
        self._verified.discard(replica)


class ChainedHashIndex:
    """vLLM-hash -> holders map: llm-d's kv-block index, built on :class:`EventIndex`.

    Holds every (replica, rank, group, medium) source's hashes with copy counts;
    matches a request's chained wire hashes, GPU medium only.

    Args:
        scheme: the fleet's hash scheme (block size, hashes for the check).
        verify_hashes: check each replica's first chain (see the module docstring).
    """

    kind = "chained"
    event_fed = True

    def __init__(self, scheme: HashScheme, *, verify_hashes: bool = True) -> None:
        self.scheme = scheme
        self._events = EventIndex()
        self._check = StreamCheck(scheme, verify_hashes=verify_hashes)
        self.incompatible = self._check.incompatible
        self._ranks: dict[int, set[tuple[int | None, int | None]]] = {}
        self._stats = dict.fromkeys(("block_events", "refused_block_events", "cleared"), 0)

    def apply(self, replica: int, batch: EventBatch, now: float) -> None:
        """Apply one batch. Complexity: O(block hashes in it), one dict probe each."""
        rank = batch.data_parallel_rank
        idx = self._events
        stats = self._stats
        for event in batch.events:
            if isinstance(event, BlockStored):
                n = len(event.block_hashes)
                if not self._check.accepts(replica, event):
                    stats["refused_block_events"] += n
                    continue
                self._ranks.setdefault(replica, set()).add((rank, event.group_idx))
                idx.store(Source(replica, rank, event.group_idx, event.medium), event.block_hashes)
                stats["block_events"] += n
            elif isinstance(event, BlockRemoved):
                n = len(event.block_hashes)
                if replica in self.incompatible:
                    stats["refused_block_events"] += n
                    continue
                idx.remove(Source(replica, rank, event.group_idx, event.medium), event.block_hashes)
                stats["block_events"] += n
            elif isinstance(event, AllBlocksCleared):
                self.clear(replica, rank)

    def match(self, keys: RouteKeys, now: float) -> dict[Worker, int]:
        """Longest cached prefix per worker. Complexity: O(prefix x holders)."""
        out: dict[Worker, int] = {}
        for source, n in self._events.match(keys.block_hashes).items():
            if source.medium not in (MEDIUM_GPU, None):
                continue
            replica = cast(int, source.replica)
            worker = Worker(replica, source.data_parallel_rank or 0, source.group_idx or 0)
            if n > out.get(worker, 0):
                out[worker] = n
        return out

    def on_routed(self, worker: Worker, keys: RouteKeys, now: float) -> None:
        """Nothing: this index learns from events only."""

    def clear(self, replica: int, data_parallel_rank: int | None = None) -> None:
        """Drop the replica's blocks (one rank when given). O(blocks dropped)."""
        self._stats["cleared"] += 1
        self._events.clear(replica, data_parallel_rank)

    def forget(self, replica: int) -> None:
        """Drop the replica's blocks and checks."""
        self.clear(replica)
        self._check.forget(replica)
        self._ranks.pop(replica, None)

    def _sources(self, worker: Worker) -> Iterable[Source]:
        for rank, group in self._ranks.get(worker.replica, ()):
            if (rank or 0) == worker.data_parallel_rank and (group or 0) == worker.group_idx:
                for medium in (MEDIUM_GPU, None):
                    yield Source(worker.replica, rank, group, medium)

    def held(self, worker: Worker) -> dict[int, int]:
        """The worker's GPU hashes with copies. O(blocks held)."""
        out: dict[int, int] = {}
        for source in self._sources(worker):
            for h, n in self._events.blocks(source).items():
                if isinstance(h, int):
                    out[h] = out.get(h, 0) + n
        return out

    def num_blocks(self, worker: Worker) -> int:
        """Distinct hashes the worker holds. O(blocks held): the map keeps no count."""
        return sum(len(self._events.blocks(s)) for s in self._sources(worker))

    def stats(self) -> dict[str, int]:
        """Counters, plus ``unknown_removals`` and ``entries`` (distinct hashes)."""
        return {
            **self._stats,
            "unknown_removals": self._events.num_unknown_removals,
            "entries": len(self._events),
        }
