"""The engine-free request-to-page row store: SGLang's ``req_to_token_pool``, in pages.

One row of page ids per running request, as Python lists; the scheduler takes a row at
admission and gives it back at release, the prefix cache reads and rewrites it at
each checkpoint (:class:`~.pools.ReqToPagePool`). Compiled with the cache: a decode
step writes one page here.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.indexes.errors import PrefixKVError, RequestStateError
from prefixkv.indexes.validation import MAX_BLOCKS, check_block_ids, check_count

__all__ = ["PageRows"]


class PageRows:
    """The engine-free :class:`~.pools.ReqToPagePool`: rows of page ids, as Python lists.

    Args:
        max_rows: rows available at once (SGLang's ``max_running_requests``); ``None``
            for as many as asked.

    Raises:
        PrefixKVError: a bad row, range or page id (``RequestStateError`` for a row not
            in use); nothing changes.
    """

    def __init__(self, max_rows: int | None = None) -> None:
        self.max_rows = None if max_rows is None else check_count("max_rows", max_rows, lo=1)
        self._rows: list[list[int] | None] = []
        self._free: list[int] = []

    def alloc(self) -> int | None:
        """A free row, empty; ``None`` when ``max_rows`` are in use. O(1)."""
        if self._free:
            row = self._free.pop()
            self._rows[row] = []
            return row
        if self.max_rows is not None and len(self._rows) >= self.max_rows:
            return None
        self._rows.append([])
        return len(self._rows) - 1

    def free(self, row: int) -> None:
        """Give ``row`` back. O(1)."""
        i = self._index(row)
        self._rows[i] = None
        self._free.append(i)

    def read(self, row: int, start: int, stop: int) -> list[int]:
        """Pages ``start .. stop - 1`` of ``row`` (a copy). O(stop - start)."""
        pages = self._pages(row)
        if type(start) is not int or type(stop) is not int or not 0 <= start <= stop <= len(pages):
            raise PrefixKVError(
                f"row {row} has {len(pages)} pages, asked for {start!r:.40}..{stop!r:.40}"
            )
        return pages[start:stop]

    def write(self, row: int, start: int, page_ids: Sequence[int]) -> None:
        """Set pages ``start ..`` of ``row`` (a row grows at its end only). O(len)."""
        pages = self._pages(row)
        if (
            type(start) is int
            and start == len(pages)
            and type(page_ids) is list
            and len(page_ids) == 1
        ):
            page = page_ids[0]  # a decode step's new page: the row grows by one
            if type(page) is int and 0 <= page < MAX_BLOCKS:
                pages.append(page)
                return
        if type(start) is not int or not 0 <= start <= len(pages):
            raise PrefixKVError(f"row {row} has {len(pages)} pages; cannot write at {start!r:.40}")
        ids = check_block_ids(page_ids, "write", unique=False)
        pages[start : start + len(ids)] = ids

    def append_page(self, row: int, index: int, page: int) -> None:
        """Add ``page`` as page ``index`` of ``row``, its next one (a decode step's new
        page: ``write(row, index, [page])`` without the list). O(1).

        Raises:
            PrefixKVError: ``index`` is not the row's length, or ``page`` not a page id
                (``RequestStateError`` for a row not in use); nothing changes.
        """
        pages = self._pages(row)
        if index != len(pages) or not 0 <= page < MAX_BLOCKS:
            raise PrefixKVError(
                f"row {row} has {len(pages)} pages; cannot add page {page} at {index}"
            )
        pages.append(page)

    def adopt(self, row: int, page_ids: list[int]) -> None:
        """Make ``page_ids`` the pages of the empty ``row``: the list itself, neither
        copied nor checked, so only for pages the pool and the index have just handed
        the scheduler (an admission's row, a page per token at page size 1). O(1).
        Anything but a list is checked and copied (``check_block_ids``).

        Raises:
            PrefixKVError: ``row`` is not in use or holds pages already
                (``BlockOwnershipError``: ``page_ids`` is not a list of page ids).
        """
        if type(page_ids) is not list:
            page_ids = check_block_ids(page_ids, "adopt")
        pages = self._pages(row)
        if pages:
            raise PrefixKVError(f"row {row} holds {len(pages)} pages; adopt fills an empty row")
        self._rows[self._index(row)] = page_ids

    def pages(self, row: int) -> list[int]:
        """Every page of ``row`` (a copy)."""
        return list(self._pages(row))

    def num_rows_in_use(self) -> int:
        """Rows handed out and not freed."""
        return len(self._rows) - len(self._free)

    def _index(self, row: object) -> int:
        self._pages(row)
        assert type(row) is int
        return row

    def _pages(self, row: object) -> list[int]:
        if type(row) is int and 0 <= row < len(self._rows):
            pages = self._rows[row]
            if pages is not None:
                return pages
        raise RequestStateError(f"row {row!r:.40} is not in use")
