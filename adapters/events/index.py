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

    __slots__ = ("_count_copies", "_held", "_holders", "num_unknown_removals")

    def __init__(self, *, count_copies: bool = True) -> None:
        self._count_copies = count_copies
        self._held: dict[Source, dict[BlockHash, int]] = {}
        self._holders: dict[BlockHash, set[Source]] = {}
        self.num_unknown_removals = 0

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
        held = self._held.get(source)
        if held is None:
            held = self._held[source] = {}
        holders = self._holders
        step = 1 if self._count_copies else 0
        for h in block_hashes:
            n = held.get(h)
            if n is None:
                held[h] = 1
                who = holders.get(h)
                if who is None:
                    holders[h] = {source}
                else:
                    who.add(source)
            else:
                held[h] = n + step
        if not held:
            del self._held[source]

    def remove(self, source: Source, block_hashes: Iterable[BlockHash]) -> None:
        """Record that ``source`` dropped one copy of each hash; unknown ones are counted.

        Complexity: O(len(hashes)).
        """
        held = self._held.get(source)
        if held is None:
            held = {}
        holders = self._holders
        for h in block_hashes:
            n = held.get(h)
            if n is None:
                self.num_unknown_removals += 1
            elif n > 1:
                held[h] = n - 1
            else:
                del held[h]
                who = holders[h]
                who.discard(source)
                if not who:
                    del holders[h]
        if not held:
            self._held.pop(source, None)

    def clear(self, replica: Hashable, data_parallel_rank: int | None = None) -> None:
        """Forget what ``replica`` holds: every source of it, or of one rank when given.

        ``AllBlocksCleared`` clears one rank; a subscriber calls this on an engine
        restart or a resync. Complexity: O(hashes those sources held).
        """
        doomed = [
            s
            for s in self._held
            if s.replica == replica
            and (data_parallel_rank is None or s.data_parallel_rank == data_parallel_rank)
        ]
        for source in doomed:
            for h in self._held.pop(source):
                who = self._holders[h]
                who.discard(source)
                if not who:
                    del self._holders[h]

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
        first = self._holders.get(block_hashes[0])
        if not first:
            return {}
        active = set(first)
        out: dict[Source, int] = {}
        for i in range(1, len(block_hashes)):
            who = self._holders.get(block_hashes[i])
            if who is None or not active <= who:
                for source in active if who is None else active - who:
                    out[source] = i
                if who is None:
                    return out
                active &= who
                if not active:
                    return out
        for source in active:
            out[source] = len(block_hashes)
        return out

    def blocks(self, source: Source) -> dict[BlockHash, int]:
        """The hashes ``source`` holds and how many copies of each (a new dict). O(n)."""
        return dict(self._held.get(source, {}))

    def sources(self) -> list[Source]:
        """Every source holding at least one block."""
        return list(self._held)

    def __len__(self) -> int:
        """Number of distinct hashes held by any source."""
        return len(self._holders)
