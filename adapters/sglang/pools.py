"""What SGLang's prefix cache sits on: a page pool and a request-to-page row store.

SGLang's ``RadixCache`` holds KV slot indices and reaches two pools its scheduler owns:
``token_to_kv_pool_allocator`` (free slots) and ``req_to_token_pool`` (one row of
slots per running request). :class:`~.prefix_cache.PrefixCache` does the same in
pages (a page is ``page_size`` consecutive slots, ``slot = page * page_size + offset``):

* :class:`PagePool` is prefixkv's :class:`~prefixkv.storage.BlockAllocator` API (a
  page is what vLLM calls a block), so an allocator is a pool as it is; inside SGLang
  the plug-in adapts SGLang's allocator to it;
* :class:`ReqToPagePool` is SGLang's ``req_to_token_pool`` in pages;
  :class:`~.page_rows.PageRows` is the engine-free one.

These live apart from the compiled cache because a ``@runtime_checkable`` protocol
must stay Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["PagePool", "ReqToPagePool"]


@runtime_checkable
class PagePool(Protocol):
    """Free pages of one KV pool (SGLang's ``token_to_kv_pool_allocator``, in pages).

    The cache only frees pages (duplicates, evicted leaves, a released request's
    private pages); allocating is the scheduler's.
    """

    @property
    def num_blocks(self) -> int:
        """Pages in the pool."""
        ...

    @property
    def num_free_blocks(self) -> int:
        """Pages free now."""
        ...

    def allocate(self, num_blocks: int) -> list[int] | None:
        """``num_blocks`` free pages, or ``None`` (nothing taken) when fewer are free."""
        ...

    def free(self, block_ids: Sequence[int]) -> None:
        """Give pages back."""
        ...

    def is_free(self, block_id: int) -> bool:
        """Whether ``block_id`` is free (not handed out)."""
        ...


@runtime_checkable
class ReqToPagePool(Protocol):
    """One row of pages per running request (SGLang's ``req_to_token_pool``, in pages).

    A request's row holds the pages of its tokens in order: the prefix the cache owns
    (the request's ``cache_protected_len`` tokens), then its private pages.
    """

    def alloc(self) -> int | None:
        """A free row (empty), or ``None`` when every row is taken."""
        ...

    def free(self, row: int) -> None:
        """Give a row back (its pages are the caller's to free first)."""
        ...

    def read(self, row: int, start: int, stop: int) -> list[int]:
        """Pages ``start .. stop - 1`` of ``row`` (a copy)."""
        ...

    def write(self, row: int, start: int, page_ids: Sequence[int]) -> None:
        """Set ``row``'s pages ``start .. start + len(page_ids) - 1``."""
        ...
