"""A delegating base for index wrappers: a lock, a fault injector, a spy.

Every ``PrefixIndex`` call goes through one hook, :meth:`IndexWrapper._call`, and every
other attribute of the wrapped index — the optional capabilities ``evict_blocks``,
``num_common_prefix_blocks``, ``memory_bytes``, ``cached_blocks``, a backend's own
queries — is forwarded through the same hook, so a wrapper has exactly the
capabilities of what it wraps (``isinstance`` checks on the capability Protocols see
through it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from .base import CacheHandle, IndexStats, InsertResult, PrefixIndex, PrefixMatch
from .errors import PrefixKVError
from .tokens import TokenKey

__all__ = ["IndexWrapper"]

T = TypeVar("T")


class IndexWrapper:
    """Delegates every call to ``inner`` through :meth:`_call`; subclasses override a few.

    Args:
        inner: the index that does the real work.

    Raises:
        PrefixKVError: ``inner`` does not implement ``PrefixIndex``.
    """

    def __init__(self, inner: PrefixIndex) -> None:
        if not isinstance(inner, PrefixIndex):
            raise PrefixKVError(f"{inner!r:.80} does not implement the PrefixIndex protocol")
        self.inner = inner
        self.block_size = inner.block_size

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one call of the inner index (the hook: a lock, a counter)."""
        return fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only names this class does not define: the inner index's capabilities.
        if name == "inner":  # not set yet (during unpickling): no recursion
            raise AttributeError(name)
        attr = getattr(self.inner, name)
        return partial(self._call, attr) if callable(attr) else attr

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """See :meth:`PrefixIndex.match_prefix`."""
        return self._call(self.inner.match_prefix, key, max_num_tokens)

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """See :meth:`PrefixIndex.insert`."""
        return self._call(self.inner.insert, key, block_ids, num_tokens, prefix)

    def count_evictable(self, handle: CacheHandle) -> int:
        """See :meth:`PrefixIndex.count_evictable`."""
        return self._call(self.inner.count_evictable, handle)

    def lock(self, handle: CacheHandle) -> None:
        """See :meth:`PrefixIndex.lock`."""
        self._call(self.inner.lock, handle)

    def unlock(self, handle: CacheHandle) -> list[int]:
        """See :meth:`PrefixIndex.unlock`."""
        return self._call(self.inner.unlock, handle)

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """See :meth:`PrefixIndex.relock`."""
        return self._call(self.inner.relock, old, new)

    def evict(self, num_blocks: int) -> list[int]:
        """See :meth:`PrefixIndex.evict`."""
        return self._call(self.inner.evict, num_blocks)

    def reset(self) -> list[int]:
        """See :meth:`PrefixIndex.reset`."""
        return self._call(self.inner.reset)

    def stats(self) -> IndexStats:
        """See :meth:`PrefixIndex.stats`."""
        return self._call(self.inner.stats)

    def check_invariants(self) -> None:
        """See :meth:`PrefixIndex.check_invariants`."""
        self._call(self.inner.check_invariants)
