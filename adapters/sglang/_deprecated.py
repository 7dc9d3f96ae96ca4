"""``SGLangRadixCache``, the facade's old name, kept for one release."""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.indexes.base import PrefixIndex

from ..observer import CacheObserver
from .prefix_cache import PrefixCache, simulated_parts

__all__ = ["MESSAGE", "SGLangRadixCache"]

MESSAGE = (
    "prefixkv.adapters.sglang.SGLangRadixCache is deprecated and goes in the next release: "
    "it is PrefixCache.create_simulated(index, capacity_tokens, page_size) now, the class "
    "that also runs inside SGLang. SGLang's scheduler-side helpers alloc_for_extend, "
    "alloc_for_decode and req_to_token are no longer methods: call "
    "prefixkv.adapters.lab.sglang_scheduler.alloc_for_extend(cache, req) (and the others)."
)
"""What the deprecation warning says."""

_MOVED = ("alloc_for_extend", "alloc_for_decode", "req_to_token", "manager", "allocator")


class SGLangRadixCache(PrefixCache):
    """Deprecated: :meth:`PrefixCache.create_simulated` with the old constructor."""

    def __init__(
        self,
        index: PrefixIndex | str = "radix",
        capacity_tokens: object = 65536,
        page_size: object = None,
        *,
        observers: Sequence[CacheObserver] = (),
        enable_kv_cache_events: object = False,
    ) -> None:
        parts = simulated_parts(index, capacity_tokens, page_size)
        super().__init__(*parts, observers=observers, enable_kv_cache_events=enable_kv_cache_events)

    def __getattr__(self, name: str) -> object:
        if name in _MOVED:
            raise AttributeError(f"SGLangRadixCache.{name} is gone: {MESSAGE}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
