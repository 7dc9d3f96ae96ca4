"""SGLang 0.5.23's prefix cache, backed by any prefixkv index: one class, two homes.

:class:`PrefixCache` (``prefix_cache.py``) is SGLang's ``RadixCache`` API on a prefixkv
index, a page pool and request rows, engine-free and compiled; ``make test`` replays it
hit for hit against SGLang's recorded hits and events. ``plugin.py`` is what SGLang
loads by ``--radix-cache-backend prefixkv-radix|prefixkv-hash-chain``: the same class
on SGLang's own pools (imported only when SGLang loads it; it imports SGLang and
torch). ``simulated.py`` holds SGLang's scheduler-side steps (admission, decode
allocation, retraction) that drive the cache without an engine, and
``prefill_adder.py`` SGLang's ``PrefillAdder`` arithmetic (which requests a prefill
step takes), beside it as SGLang keeps ``create_simulated`` beside ``RadixCache``.

    from prefixkv.adapters.sglang import PrefixCache, SimpleReq
    cache = PrefixCache.create_simulated("radix", capacity_tokens=4096, page_size=1)
"""

from __future__ import annotations

from ..requests import ReqKvInfo, ReqKvLike, ReqLike, SimpleReq
from .page_rows import PageRows
from .pools import PagePool, ReqToPagePool
from .prefix_cache import MatchResult, PrefixCache, PrefixNode

__all__ = [
    "MatchResult",
    "PagePool",
    "PageRows",
    "PrefixCache",
    "PrefixNode",
    "ReqKvInfo",
    "ReqKvLike",
    "ReqLike",
    "ReqToPagePool",
    "SimpleReq",
]
