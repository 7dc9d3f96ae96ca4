"""Paged KV storage shared by every index: the block allocator and the KV tensor."""

from typing import TYPE_CHECKING

from .allocator import MAX_NUM_BLOCKS, BlockAllocator, Owner
from .block_table import PAD_SLOT, pad_block_tables, slot_mapping, token_slot
from .errors import StorageShapeError

if TYPE_CHECKING:
    from .paged_kv import PagedKVCache

__all__ = [
    "MAX_NUM_BLOCKS",
    "PAD_SLOT",
    "BlockAllocator",
    "Owner",
    "PagedKVCache",
    "StorageShapeError",
    "pad_block_tables",
    "slot_mapping",
    "token_slot",
]


def __getattr__(name: str) -> object:
    # PagedKVCache needs torch; the allocator and helpers do not.
    if name == "PagedKVCache":
        from .paged_kv import PagedKVCache

        return PagedKVCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
