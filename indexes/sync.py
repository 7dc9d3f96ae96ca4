"""A thread-safe wrapper for any prefix index.

Indexes are not thread-safe: engines call them from one scheduler thread. When an
index must be shared (a router probing hits while a scheduler inserts), wrap it: every
call then holds one lock, so calls from different threads never interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from .base import CacheHandle, IndexStats, InsertResult, PrefixIndex, PrefixMatch
from .tokens import TokenKey

__all__ = ["SynchronizedIndex"]


class SynchronizedIndex:
    """``inner`` behind a lock: each Protocol call is atomic with respect to the others.

    A match and the lock of its handle are two calls; to keep another thread from
    evicting in between, hold :attr:`mutex` (re-entrant) around both.

    Args:
        inner: the index to share.
    """

    def __init__(self, inner: PrefixIndex) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.mutex = threading.RLock()

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """See :meth:`PrefixIndex.match_prefix`."""
        with self.mutex:
            return self.inner.match_prefix(key, max_num_tokens)

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """See :meth:`PrefixIndex.insert`."""
        with self.mutex:
            return self.inner.insert(key, block_ids, num_tokens, prefix)

    def lock(self, handle: CacheHandle) -> None:
        """See :meth:`PrefixIndex.lock`."""
        with self.mutex:
            self.inner.lock(handle)

    def unlock(self, handle: CacheHandle) -> list[int]:
        """See :meth:`PrefixIndex.unlock`."""
        with self.mutex:
            return self.inner.unlock(handle)

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """See :meth:`PrefixIndex.relock`."""
        with self.mutex:
            return self.inner.relock(old, new)

    def evict(self, num_blocks: int) -> list[int]:
        """See :meth:`PrefixIndex.evict`."""
        with self.mutex:
            return self.inner.evict(num_blocks)

    def reset(self) -> list[int]:
        """See :meth:`PrefixIndex.reset`."""
        with self.mutex:
            return self.inner.reset()

    def stats(self) -> IndexStats:
        """See :meth:`PrefixIndex.stats`."""
        with self.mutex:
            return self.inner.stats()

    def check_invariants(self) -> None:
        """See :meth:`PrefixIndex.check_invariants`."""
        with self.mutex:
            self.inner.check_invariants()
