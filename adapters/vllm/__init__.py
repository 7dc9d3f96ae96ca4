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
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
