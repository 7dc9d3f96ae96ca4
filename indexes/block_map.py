"""The hash chain's records: a cached block, and the table from block hash to the
block(s) cached under it (vLLM's ``KVCacheBlock`` and ``BlockHashToBlockMap``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .tokens import ExtraKey

__all__ = ["BlockHashToBlockMap", "CachedBlock", "Entry"]


@dataclass(slots=True, eq=False)
class CachedBlock:
    """One block the hash chain owns.

    A record lives from the block's registration to its eviction (or the reset, or
    the last unlock after ``evict_blocks``) and is never reused: a block registered
    again gets a new record, so a handle holding an old record can tell it died.

    Attributes:
        block_id: the storage block.
        block_hash: its chained hash; ``None`` once its entry was dropped (the record
            is dead, or only waiting for its last unlock after ``evict_blocks``).
        ref_cnt: requests holding it; 0 means evictable (in the free queue), -1 dead.
        prev, next: free-queue links (``None`` when not queued).
        tokens, parent, extra_key: registration content (the block's token bytes,
            the block registered before it, block 0's namespace), kept only with
            ``verify=True`` to reject hash collisions.
    """

    block_id: int
    block_hash: bytes | None
    ref_cnt: int = 0
    prev: CachedBlock | None = None
    next: CachedBlock | None = None
    tokens: bytes | None = None
    parent: CachedBlock | None = None
    extra_key: ExtraKey | None = None


Entry = CachedBlock | dict[int, CachedBlock]
"""What the table holds under one hash: a block, or several by block id."""


class BlockHashToBlockMap(dict[bytes, Entry]):
    """Block hash -> the block(s) cached under it.

    NOTE: two requests that compute the same block at the same time both register it
    (SPEC HC-13, vLLM's choice): the second registration must not replace the first,
    which a running request may be reading. So a hash may map to several blocks; a
    lookup takes the first registered one still cached, and each is evicted on its own.

    NOTE: the common case, one block per hash, stores the block itself, not a dict of
    one: most entries cost no extra object.

    NOTE: it is a ``dict`` so the hash chain probes a whole run of hashes with
    ``map(table.get, hashes)`` in one C pass; only ``add`` and ``drop`` mutate it.
    """

    def add(self, block: CachedBlock) -> None:
        """File ``block`` under its hash, beside any duplicate. O(1)."""
        block_hash = block.block_hash
        assert block_hash is not None
        entry = self.get(block_hash)
        if entry is None:
            self[block_hash] = block
        elif type(entry) is CachedBlock:
            self[block_hash] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block  # type: ignore[index]

    def drop(self, block: CachedBlock) -> None:
        """Remove ``block``'s entry (its duplicates stay) and mark it dropped. O(1)."""
        block_hash = block.block_hash
        assert block_hash is not None
        entry = self[block_hash]
        if entry is block:
            del self[block_hash]
        else:
            assert type(entry) is dict
            del entry[block.block_id]
            if len(entry) == 1:
                self[block_hash] = next(iter(entry.values()))
        block.block_hash = None

    @staticmethod
    def members(entry: Entry) -> list[CachedBlock]:
        """The blocks of one entry, first registered first."""
        return [entry] if type(entry) is CachedBlock else list(entry.values())  # type: ignore[union-attr]
