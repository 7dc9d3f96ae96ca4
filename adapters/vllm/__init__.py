"""prefixkv inside vLLM: the ``KVCacheManager`` and the scheduler vLLM loads.

    vllm serve MODEL --scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler

* :mod:`.kv_cache_manager`: :class:`KVCacheManager`, vLLM 0.32/0.33's ``KVCacheManager``
  over a prefixkv index (engine-free; the class ``make test`` replays hit for hit
  against vLLM is the class that runs inside it).
* :mod:`.engine_types`: the block, block-list, stats and event types it answers with
  (:class:`EngineTypes`; prefixkv's look-alikes by default, vLLM's own inside vLLM).
* :mod:`.settings`: the ``"prefixkv"`` settings of ``--additional-config``, one rule
  (engine-free), and :mod:`.plugin`, vLLM's general plug-in that checks them as soon as
  vLLM has parsed its configuration, before the model loads.
* :mod:`.scheduler`: ``PrefixKVScheduler`` / ``PrefixKVAsyncScheduler``, vLLM's own
  schedulers with that manager. They import vLLM, so this package names them lazily:
  importing ``prefixkv.adapters.vllm`` never imports vLLM.

``VLLMKVCacheManager`` (the facade of earlier releases) still works for one release,
with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..observer import CacheObserver
from ..requests import RequestLike, SimpleRequest
from .engine_types import (
    PREFIXKV_TYPES,
    EngineTypes,
    KVCacheBlock,
    KVCacheBlocks,
    PrefixCacheStats,
)
from .kv_cache_manager import KVCacheManager

if TYPE_CHECKING:
    from prefixkv.indexes.base import PrefixIndex

    from .scheduler import PrefixKVAsyncScheduler, PrefixKVScheduler

__all__ = [
    "PREFIXKV_TYPES",
    "EngineTypes",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheManager",
    "PrefixCacheStats",
    "PrefixKVAsyncScheduler",
    "PrefixKVScheduler",
    "RequestLike",
    "SimpleRequest",
]

_SCHEDULERS = ("PrefixKVScheduler", "PrefixKVAsyncScheduler")


def __getattr__(name: str) -> object:
    if name in _SCHEDULERS:
        from . import scheduler

        return getattr(scheduler, name)
    if name == "VLLMKVCacheManager":
        warnings.warn(
            "prefixkv.adapters.vllm.VLLMKVCacheManager is deprecated: use KVCacheManager, "
            "whose num_blocks is vLLM's num_gpu_blocks (the null block 0 included, block "
            "ids as vLLM's) and whose get_computed_blocks returns vLLM's triple",
            DeprecationWarning,
            stacklevel=2,
        )
        return _DeprecatedVLLMKVCacheManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _DeprecatedVLLMKVCacheManager:
    """Deprecated: the facade of earlier releases, over :class:`KVCacheManager`.

    ``num_blocks`` counts usable blocks as it did (the null block is added), and
    ``get_computed_blocks`` returns ``(blocks, num_computed_tokens)``; block ids are
    now vLLM's (one higher than before). Everything else is the new class's.
    """

    def __init__(
        self,
        index: PrefixIndex | str = "hash_chain",
        num_blocks: object = 1024,
        block_size: object = None,
        *,
        enable_caching: object = True,
        observers: Sequence[CacheObserver] = (),
        enable_kv_cache_events: object = False,
    ) -> None:
        gpu_blocks = num_blocks + 1 if type(num_blocks) is int else num_blocks
        self.kv_cache_manager = KVCacheManager(
            index,
            gpu_blocks,
            block_size,
            enable_caching=enable_caching,
            observers=observers,
            enable_kv_cache_events=enable_kv_cache_events,
        )

    def get_computed_blocks(self, request: RequestLike) -> tuple[KVCacheBlocks, int]:
        """The hit blocks and hit tokens (the new class adds a third value)."""
        blocks, num_computed, _ = self.kv_cache_manager.get_computed_blocks(request)
        return blocks, num_computed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv_cache_manager, name)
