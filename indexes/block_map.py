"""The hash chain's records: a cached block, and the table from block hash to the
block(s) cached under it (vLLM's ``KVCacheBlock`` and ``BlockHashToBlockMap``), with
the functions that change it.
"""

from __future__ import annotations

from .tokens import ExtraKey

__all__ = [
    "BlockHashToBlockMap",
    "CachedBlock",
    "Entry",
    "add_blocks",
    "drop_block",
    "drop_blocks",
    "entry_members",
]


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

    # A plain class with every field set in __init__: a dataclass's defaults cost a
    # lookup each per record when compiled (a record per registered block).
    __slots__ = ("block_hash", "block_id", "extra_key", "next", "parent", "prev", "ref_cnt",
                 "tokens")  # fmt: skip

    def __init__(self, block_id: int, block_hash: bytes | None) -> None:
        self.block_id = block_id
        self.block_hash = block_hash
        self.ref_cnt = 0
        self.prev: CachedBlock | None = None
        self.next: CachedBlock | None = None
        self.tokens: bytes | None = None
        self.parent: CachedBlock | None = None
        self.extra_key: ExtraKey | None = None

    def __repr__(self) -> str:
        return (
            f"CachedBlock(block_id={self.block_id}, block_hash={self.block_hash!r}, "
            f"ref_cnt={self.ref_cnt})"
        )


Entry = CachedBlock | dict[int, CachedBlock]
"""What the table holds under one hash: a block, or several by block id."""

BlockHashToBlockMap = dict[bytes, Entry]
"""Block hash -> the block(s) cached under it (vLLM's ``BlockHashToBlockMap``).

NOTE: two requests that compute the same block at the same time both register it
(SPEC HC-13, vLLM's choice): the second registration must not replace the first,
which a running request may be reading. So a hash may map to several blocks; a
lookup takes the first registered one still cached, and each is evicted on its own.

NOTE: the common case, one block per hash, stores the block itself, not a dict of
one: most entries cost no extra object.

NOTE: a plain ``dict``, changed only by :func:`add_blocks`, :func:`drop_blocks` and
:func:`drop_block`: compiled, each probe is a direct dict call (a ``dict`` subclass's
methods were Python calls, a third of a registration's cost), and the hash chain still
probes a whole run with ``map(table.get, hashes)`` in one C pass.
"""


def add_blocks(table: BlockHashToBlockMap, blocks: list[CachedBlock]) -> None:
    """File each of ``blocks`` under its hash (a run of new blocks), each beside any
    duplicate. O(len(blocks))."""
    for block in blocks:
        block_hash = block.block_hash
        assert block_hash is not None
        entry = table.setdefault(block_hash, block)  # one probe for a new hash
        if entry is block:
            continue
        if type(entry) is CachedBlock:
            table[block_hash] = {entry.block_id: entry, block.block_id: block}
        else:
            entry[block.block_id] = block  # type: ignore[index]


def drop_blocks(table: BlockHashToBlockMap, blocks: list[CachedBlock]) -> None:
    """Remove the entries of ``blocks`` and mark them dropped. O(len(blocks))."""
    for block in blocks:
        block_hash = block.block_hash
        assert block_hash is not None
        if table[block_hash] is block:
            del table[block_hash]
            block.block_hash = None
        else:
            drop_block(table, block)


def drop_block(table: BlockHashToBlockMap, block: CachedBlock) -> None:
    """Remove ``block``'s entry (its duplicates stay) and mark it dropped. O(1)."""
    block_hash = block.block_hash
    assert block_hash is not None
    entry = table[block_hash]
    if entry is block:
        del table[block_hash]
    else:
        assert type(entry) is dict
        del entry[block.block_id]
        if len(entry) == 1:
            table[block_hash] = next(iter(entry.values()))
    block.block_hash = None


def entry_members(entry: Entry) -> list[CachedBlock]:
    """The blocks of one entry, first registered first."""
    return [entry] if type(entry) is CachedBlock else list(entry.values())  # type: ignore[union-attr]
