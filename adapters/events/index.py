"""Which block hashes each engine replica holds, rebuilt from its KV events alone.

The consumer side of the KV-event stream, in the role of Dynamo's KV indexer and
llm-d's kv-cache index: a router feeds it every replica's batches and asks, for the
block hashes of a new request, how long a prefix each source already caches. A
*source* is one cache a replica publishes for: replica id, data-parallel rank, KV-cache
group and medium (a block offloaded to CPU is not a GPU hit).

NOTE: a hash is counted, not merely present. vLLM does not de-duplicate its cache: two
requests computing the same block before either cached it leave two blocks with one
hash, each announced by a ``BlockStored`` and each evicted by a ``BlockRemoved``. A set
would forget the hash at the first removal while the engine still holds the second
copy; the count follows the engine exactly (the recorded fixtures check it after every
batch). Re-announcements of blocks already held (vLLM's per-request
``kv_cache_report_mode="full"``) would inflate the counts; pass
``count_copies=False`` for such streams.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import NamedTuple

from .wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

__all__ = ["EventIndex", "Source"]

BlockHash = bytes | int


class Source(NamedTuple):
    """One cache a replica publishes events for."""

    replica: Hashable
    """The replica's id, as the caller names it (events do not carry one)."""
    data_parallel_rank: int | None
    """The batch's ``data_parallel_rank`` (SGLang: ``attn_dp_rank``)."""
    group_idx: int | None
    """The event's KV-cache group (``None`` when the engine does not say)."""
    medium: str | None
    """Where the blocks live: ``"GPU"``, ``"CPU"``, ... (``None`` when unsaid)."""


class EventIndex:
    """Block hashes per source, from ``BlockStored``/``BlockRemoved``/``AllBlocksCleared``.

    Args:
        count_copies: count each ``BlockStored`` of a hash (exact for vLLM and SGLang
            streams, see the module note); ``False`` treats a hash as held or not.

    Attributes:
        num_unknown_removals: removed hashes the source was not known to hold (events
            from before this index subscribed, or a stream resumed after a gap).
    """

    # NOTE: sources are numbered and the hash -> holders map stores a bare number for
    # the usual single holder (a set only when several share a hash): hashing a
    # Source tuple per block, and a set per block, cost more than the rest of an update.
    __slots__ = ("_count_copies", "_held", "_holders", "_ids", "_sources", "num_unknown_removals")

    def __init__(self, *, count_copies: bool = True) -> None:
        self._count_copies = count_copies
        self._ids: dict[Source, int] = {}
        self._sources: list[Source] = []
        self._held: list[dict[BlockHash, int]] = []  # by source id: hash -> copies
        self._holders: dict[BlockHash, int | set[int]] = {}
        self.num_unknown_removals = 0

    def _id(self, source: Source) -> int:
        sid = self._ids.get(source)
        if sid is None:
            sid = self._ids[source] = len(self._sources)
            self._sources.append(source)
            self._held.append({})
        return sid

    # ------------------------------------------------------------- updates

    def apply(self, batch: EventBatch, replica: Hashable) -> None:
        """Apply one batch of ``replica``'s events, in order.

        Complexity: O(block hashes in the batch), a few dict operations each.
        """
        rank = batch.data_parallel_rank
        for event in batch.events:
            if isinstance(event, BlockStored):
                source = Source(replica, rank, event.group_idx, event.medium)
                self.store(source, event.block_hashes)
            elif isinstance(event, BlockRemoved):
                source = Source(replica, rank, event.group_idx, event.medium)
                self.remove(source, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear(replica, rank)

    def store(self, source: Source, block_hashes: Iterable[BlockHash]) -> None:
        """Record that ``source`` now holds (another copy of) each hash. O(len(hashes))."""
        sid = self._id(source)
        held = self._held[sid]
        holders = self._holders
        step = 1 if self._count_copies else 0
        for h in block_hashes:
            n = held.get(h)
            if n is not None:
                held[h] = n + step
                continue
            held[h] = 1
            who = holders.get(h)
            if who is None:
                holders[h] = sid
            elif isinstance(who, int):
                holders[h] = {who, sid}
            else:
                who.add(sid)

    def remove(self, source: Source, block_hashes: Iterable[BlockHash]) -> None:
        """Record that ``source`` dropped one copy of each hash; unknown ones are counted.

        Complexity: O(len(hashes)).
        """
        sid = self._ids.get(source, -1)
        held = self._held[sid] if sid >= 0 else {}
        for h in block_hashes:
            n = held.get(h)
            if n is None:
                self.num_unknown_removals += 1
            elif n > 1:
                held[h] = n - 1
            else:
                del held[h]
                self._drop_holder(h, sid)

    def _drop_holder(self, h: BlockHash, sid: int) -> None:
        who = self._holders[h]
        if isinstance(who, int):
            del self._holders[h]
            return
        who.discard(sid)
        if len(who) == 1:
            self._holders[h] = next(iter(who))

    def clear(self, replica: Hashable, data_parallel_rank: int | None = None) -> None:
        """Forget what ``replica`` holds: every source of it, or of one rank when given.

        ``AllBlocksCleared`` clears one rank; a subscriber calls this on an engine
        restart or a resync. Complexity: O(hashes those sources held).
        """
        for sid, s in enumerate(self._sources):
            if s.replica == replica and (
                data_parallel_rank is None or s.data_parallel_rank == data_parallel_rank
            ):
                for h in self._held[sid]:
                    self._drop_holder(h, sid)
                self._held[sid] = {}

    # ------------------------------------------------------------- queries

    def match(self, block_hashes: Sequence[BlockHash]) -> dict[Source, int]:
        """The longest cached prefix of ``block_hashes`` per source, in blocks.

        Only sources holding at least the first block appear. A request's hashes are
        chained (each covers its whole prefix), so a source's run ends at the first
        hash it lacks.

        Complexity: O(prefix length x sources holding it), one dict probe per block.
        """
        if not block_hashes:
            return {}
        holders, n = self._holders, len(block_hashes)
        first = holders.get(block_hashes[0])
        if first is None:
            return {}
        if isinstance(first, int):  # one holder: walk until it lacks a block
            i = 1
            while i < n:
                who = holders.get(block_hashes[i])
                if who is None or (who != first if isinstance(who, int) else first not in who):
                    break
                i += 1
            return {self._sources[first]: i}
        active = set(first)
        out: dict[Source, int] = {}
        for i in range(1, n):
            who = holders.get(block_hashes[i])
            keep = active & ({who} if isinstance(who, int) else who or set())
            for sid in active - keep:
                out[self._sources[sid]] = i
            if not keep:
                return out
            active = keep
        for sid in active:
            out[self._sources[sid]] = n
        return out

    def blocks(self, source: Source) -> dict[BlockHash, int]:
        """The hashes ``source`` holds and how many copies of each (a new dict). O(n)."""
        sid = self._ids.get(source)
        return dict(self._held[sid]) if sid is not None else {}

    def sources(self) -> list[Source]:
        """Every source holding at least one block."""
        return [s for s, held in zip(self._sources, self._held, strict=True) if held]

    def __len__(self) -> int:
        """Number of distinct hashes held by any source."""
        return len(self._holders)
