"""Measurement as optional hooks on the request lifecycle (vLLM's ``KVCacheMetricsCollector``).

The manager calls an observer at the few places where blocks change owner: a request
is admitted, its blocks become cached, cached blocks leave the index, a request ends,
the cache is reset. SGLang's prefix cache (``adapters/sglang``), which has a lifecycle of
its own, calls the same hooks at the same moments. Observers only watch: they never call
back into the cache, and with none attached a hook costs one ``is None`` test.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, runtime_checkable

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.tokens import TokenKey

__all__ = ["CacheObserver", "ObserverBase", "ObserverGroup", "combine_observers"]


@runtime_checkable
class CacheObserver(Protocol):
    """What a ``CacheManager`` tells an observer. Every hook does nothing here:
    subclass ``ObserverBase`` (or this protocol) to implement only those you need."""

    def on_admit(
        self, request_id: Hashable, key: TokenKey, hit_block_ids: Sequence[int], hit_tokens: int
    ) -> None:
        """A request was admitted; its first ``hit_tokens`` tokens come from the cache."""
        return None

    def on_register(self, key: TokenKey, block_ids: Sequence[int], start: int, stop: int) -> None:
        """Blocks ``block_ids[start:stop]`` now cache blocks ``start..stop-1`` of ``key``."""
        return None

    def on_release(self, block_ids: Sequence[int]) -> None:
        """These blocks' entries left the index outside eviction (``evict_blocks``, or
        blocks handed back at their last unlock); they are no longer matchable."""
        return None

    def on_evict(self, block_ids: Sequence[int]) -> None:
        """The index evicted these blocks."""
        return None

    def on_finish(
        self,
        request_id: Hashable,
        key: TokenKey,
        block_table: Sequence[int],
        num_registered_blocks: int,
        num_computed_tokens: int,
    ) -> None:
        """A request ends (finished or aborted) with this much computed KV."""
        return None

    def on_reset(self) -> None:
        """The whole cache was dropped."""
        return None


class ObserverBase(CacheObserver):
    """A ``CacheObserver`` whose hooks do nothing: override the ones you need."""


class ObserverGroup(ObserverBase):
    """Several observers as one, called in order."""

    def __init__(self, observers: Sequence[CacheObserver]) -> None:
        self.observers = tuple(observers)

    def on_admit(
        self, request_id: Hashable, key: TokenKey, hit_block_ids: Sequence[int], hit_tokens: int
    ) -> None:
        """Tells each observer."""
        for o in self.observers:
            o.on_admit(request_id, key, hit_block_ids, hit_tokens)

    def on_register(self, key: TokenKey, block_ids: Sequence[int], start: int, stop: int) -> None:
        """Tells each observer."""
        for o in self.observers:
            o.on_register(key, block_ids, start, stop)

    def on_release(self, block_ids: Sequence[int]) -> None:
        """Tells each observer."""
        for o in self.observers:
            o.on_release(block_ids)

    def on_evict(self, block_ids: Sequence[int]) -> None:
        """Tells each observer."""
        for o in self.observers:
            o.on_evict(block_ids)

    def on_finish(
        self,
        request_id: Hashable,
        key: TokenKey,
        block_table: Sequence[int],
        num_registered_blocks: int,
        num_computed_tokens: int,
    ) -> None:
        """Tells each observer."""
        for o in self.observers:
            o.on_finish(request_id, key, block_table, num_registered_blocks, num_computed_tokens)

    def on_reset(self) -> None:
        """Tells each observer."""
        for o in self.observers:
            o.on_reset()


def combine_observers(observers: object) -> CacheObserver | None:
    """The one observer a cache calls: ``None`` for none, the one given, or a group.

    Raises:
        PrefixKVError: ``observers`` is not a list or tuple of ``CacheObserver``.
    """
    if not isinstance(observers, (list, tuple)):
        raise PrefixKVError(
            f"observers must be a list or tuple of CacheObserver, got {observers!r:.80}"
        )
    bad = [o for o in observers if not isinstance(o, CacheObserver)]
    if bad:
        raise PrefixKVError(f"{bad[0]!r:.80} does not implement CacheObserver")
    if not observers:
        return None
    return observers[0] if len(observers) == 1 else ObserverGroup(observers)
