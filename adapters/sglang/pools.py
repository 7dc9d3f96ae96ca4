"""What SGLang's prefix cache sits on: a page pool and a request-to-page row store.

SGLang's ``RadixCache`` holds KV slot indices and reaches two pools its scheduler owns:
``token_to_kv_pool_allocator`` (free slots) and ``req_to_token_pool`` (one row of
slots per running request). :class:`~.prefix_cache.PrefixCache` does the same in
pages (a page is ``page_size`` consecutive slots, ``slot = page * page_size + offset``):

* :class:`PagePool` is prefixkv's :class:`~prefixkv.storage.BlockAllocator` API (a
  page is what vLLM calls a block), so an allocator is a pool as it is; inside SGLang
  the plug-in adapts SGLang's allocator to it;
* :class:`ReqToPagePool` is SGLang's ``req_to_token_pool`` in pages; :class:`PageRows`
  is the engine-free one.

These live apart from the compiled cache because a ``@runtime_checkable`` protocol
must stay Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from prefixkv.indexes.errors import PrefixKVError, RequestStateError
from prefixkv.indexes.validation import check_block_ids, check_count

__all__ = ["PagePool", "PageRows", "ReqToPagePool"]


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

    def read(self, row: int, num_pages: int) -> list[int]:
        """The first ``num_pages`` pages of ``row`` (a copy)."""
        ...

    def write(self, row: int, start: int, page_ids: Sequence[int]) -> None:
        """Set ``row``'s pages ``start .. start + len(page_ids) - 1``."""
        ...


class PageRows:
    """The engine-free :class:`ReqToPagePool`: rows of page ids, as Python lists.

    Args:
        max_rows: rows available at once (SGLang's ``max_running_requests``); ``None``
            for as many as asked.

    Raises:
        PrefixKVError: a bad row, range or page id (nothing changes).
    """

    def __init__(self, max_rows: object = None) -> None:
        self.max_rows = None if max_rows is None else check_count("max_rows", max_rows, lo=1)
        self._rows: list[list[int] | None] = []
        self._free: list[int] = []

    def alloc(self) -> int | None:
        """A free row; O(1)."""
        if self._free:
            row = self._free.pop()
            self._rows[row] = []
            return row
        if self.max_rows is not None and len(self._rows) >= self.max_rows:
            return None
        self._rows.append([])
        return len(self._rows) - 1

    def free(self, row: int) -> None:
        """Give ``row`` back; O(1)."""
        self._row(row)
        self._rows[row] = None
        self._free.append(row)

    def read(self, row: int, num_pages: int) -> list[int]:
        """The first ``num_pages`` pages of ``row``; O(num_pages)."""
        pages = self._row(row)
        if type(num_pages) is not int or not 0 <= num_pages <= len(pages):
            raise PrefixKVError(f"row {row} has {len(pages)} pages, asked for {num_pages!r}")
        return pages[:num_pages]

    def write(self, row: int, start: int, page_ids: Sequence[int]) -> None:
        """Set pages ``start ..`` of ``row`` (a row grows at its end only); O(len)."""
        pages = self._row(row)
        if type(start) is not int or not 0 <= start <= len(pages):
            raise PrefixKVError(f"row {row} has {len(pages)} pages; cannot write at {start!r}")
        ids = check_block_ids(page_ids, "write", unique=False)
        pages[start : start + len(ids)] = ids

    def pages(self, row: int) -> list[int]:
        """Every page of ``row`` (a copy)."""
        return list(self._row(row))

    def num_rows_in_use(self) -> int:
        """Rows handed out and not freed."""
        return len(self._rows) - len(self._free)

    def _row(self, row: object) -> list[int]:
        pages = None
        if type(row) is int and 0 <= row < len(self._rows):
            pages = self._rows[row]
        if pages is None:
            raise RequestStateError(f"row {row!r:.40} is not in use")
        return pages
