"""prefixkv's prefix cache inside SGLang 0.5.23: ``--radix-cache-backend prefixkv-*``.

    pip install prefixkv   # into SGLang's environment; its entry point registers:
    python -m sglang.launch_server ... --radix-cache-backend prefixkv-radix
    python -m sglang.launch_server ... --radix-cache-backend prefixkv-hash-chain

SGLang loads every ``sglang.srt.plugins`` entry point in each of its processes
(``sglang.srt.plugins.load_plugins``) before it builds the tree cache; prefixkv's is
:func:`register`, which calls SGLang's ``register_radix_cache_backend`` for each name
in :data:`BACKENDS`. Calling ``register()`` yourself before starting an engine
in-process works too.

The cache SGLang gets is :class:`~.prefix_cache.PrefixCache` itself, the class
``make test`` replays hit for hit, with SGLang's ``BasePrefixCache`` as a second base:
:class:`PrefixKVPrefixCache` only converts SGLang's types (its params and result
objects, KV slot tensors to page ids: ``page = slot // page_size``). Hybrid (SWA,
Mamba) models, DeepSeek sparse attention, hierarchical caching, EAGLE bigram keys and
eviction policies the index lacks are refused at start-up, each with its flag.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, cast

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.registry import index_options, make_index, pool_owned_options

from ..errors import UnsupportedEngineFeatureError, engine_imports
from ..events.codec import as_engine_events
from ..events.sglang_recorder import SGLangEventRecorder
from .prefix_cache import PrefixCache, PrefixNode

SUPPORTED_VERSIONS = ("0.5.23",)
"""The SGLang releases whose scheduler and tree-cache API this was checked in."""

# SGLang (and the torch it runs on) last, once its installed version is known to be one
# of these: otherwise one EngineNotInstalledError (an ImportError) naming them.
with engine_imports(
    __name__, "sglang", SUPPORTED_VERSIONS, "prefixkv.adapters.sglang.PrefixCache (engine-free)"
):
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import (
        BasePrefixCache,
        DecLockRefResult,
        EvictParams,
        EvictResult,
        IncLockRefResult,
        MatchPrefixParams,
        MatchResult,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.registry import (
        TreeCacheBuildContext,
        get_radix_cache_factory,
        register_radix_cache_backend,
    )

__all__ = [
    "BACKENDS",
    "SUPPORTED_VERSIONS",
    "PrefixKVPrefixCache",
    "make_prefix_cache",
    "register",
]

BACKENDS = {"prefixkv-radix": "radix", "prefixkv-hash-chain": "hash_chain"}
"""``--radix-cache-backend`` name -> prefixkv index."""


def register() -> None:
    """Register :data:`BACKENDS` with SGLang (idempotent; the entry point's target)."""
    for name, index in BACKENDS.items():
        if get_radix_cache_factory(name) is None:
            register_radix_cache_backend(name, functools.partial(make_prefix_cache, index))


def make_prefix_cache(index_name: str, ctx: TreeCacheBuildContext) -> PrefixKVPrefixCache:
    """The factory SGLang calls with its build context.

    ``--disable-radix-cache`` gives the ``none`` index: every match misses, nothing
    is kept, and SGLang sees a cache that does not share prefixes.

    Raises:
        UnsupportedEngineFeatureError: a feature of the context the cache lacks.
    """

    def refuse(feature: str) -> None:
        raise UnsupportedEngineFeatureError(
            f"prefixkv's SGLang cache does not support {feature}; run without it or "
            "without --radix-cache-backend prefixkv-*"
        )

    params = ctx.params
    if ctx.is_hybrid_swa:
        refuse("sliding-window (hybrid SWA) models")
    if ctx.is_hybrid_ssm:
        refuse("Mamba (hybrid SSM) models")
    if ctx.is_dsa:
        refuse("DeepSeek sparse attention pools")
    if ctx.enable_hierarchical_cache:
        refuse("hierarchical caching (--enable-hierarchical-cache)")
    if params.is_eagle:
        refuse("EAGLE speculative decoding (bigram keys)")
    if ctx.disable_radix_cache or params.disable:
        return PrefixKVPrefixCache(params, make_index("none", block_size=params.page_size))
    policy = (params.eviction_policy or "lru").lower()
    options = pool_owned_options(index_name)
    if "eviction" in index_options(index_name):  # the index picks its policy by name
        options["eviction"] = policy
    elif policy != "lru":  # an index without the option evicts in LRU order only
        refuse(f"--radix-eviction-policy {policy} with the {index_name} index")
    index = make_index(index_name, block_size=params.page_size, **options)
    return PrefixKVPrefixCache(params, index)


class _SlotPages:
    """SGLang's ``token_to_kv_pool_allocator`` as a :class:`~.pools.PagePool`.

    Page ``p`` is slots ``p * page_size .. p * page_size + page_size - 1``; SGLang never
    hands out page 0 (its padding slots), so ids run ``1 .. size // page_size``.
    """

    def __init__(self, allocator: Any, page_size: int, device: torch.device) -> None:
        self.allocator = allocator
        self.page_size = page_size
        self.device = device
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=device)

    @property
    def num_blocks(self) -> int:
        """Page ids are below this (page 0 included, never free)."""
        return int(self.allocator.size) // self.page_size + 1

    @property
    def num_free_blocks(self) -> int:
        """Free pages."""
        return int(self.allocator.available_size()) // self.page_size

    def slots(self, page_ids: Sequence[int]) -> torch.Tensor:
        """The KV slots of ``page_ids``, in order."""
        pages = torch.tensor(page_ids, dtype=torch.int64, device=self.device)
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self._offsets).reshape(-1)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """``num_blocks`` pages from SGLang's allocator, or ``None``."""
        slots = self.allocator.alloc(num_blocks * self.page_size)
        if slots is None:
            return None
        return (slots[:: self.page_size] // self.page_size).tolist()  # type: ignore[no-any-return]

    def free(self, block_ids: Sequence[int]) -> None:
        """Give pages back to SGLang's allocator."""
        if block_ids:
            self.allocator.free(self.slots(block_ids))

    def is_free(self, block_id: int) -> bool:
        """Whether ``block_id`` is in the allocator's free list (O(free pages))."""
        free = self.allocator.get_all_free_pages()
        return free is not None and bool((free == block_id).any())


class _SlotRows:
    """SGLang's ``req_to_token_pool`` (rows of slots) as a :class:`~.pools.ReqToPagePool`."""

    def __init__(self, pool: Any, pages: _SlotPages) -> None:
        self.pool = pool
        self.pages = pages

    def alloc(self) -> int | None:
        """A free row."""
        rows = self.pool.alloc_rows(1)
        return None if rows is None else int(rows[0])

    def free(self, row: int) -> None:
        """Give a row back."""
        self.pool.free_rows([row])

    def read(self, row: int, start: int, stop: int) -> list[int]:
        """The row's pages ``start .. stop - 1`` (each page's first slot // page size)."""
        ps = self.pages.page_size
        slots = self.pool.req_to_token[row, start * ps : stop * ps : ps].to(torch.int64)
        return (slots // ps).tolist()  # type: ignore[no-any-return]

    def write(self, row: int, start: int, page_ids: Sequence[int]) -> None:
        """Point the row's slots of pages ``start ..`` at ``page_ids``."""
        ps = self.pages.page_size
        slots = self.pages.slots(page_ids).to(self.pool.req_to_token.dtype)
        self.pool.write((row, slice(start * ps, (start + len(page_ids)) * ps)), slots)


class PrefixKVPrefixCache(PrefixCache, BasePrefixCache):  # type: ignore[misc]
    """:class:`PrefixCache` on SGLang's own pools, seen by SGLang as a ``BasePrefixCache``.

    Args:
        params: SGLang's ``CacheInitParams`` (allocator, req-to-token pool, page size).
        index: the prefix index; its ``block_size`` must be the page size.

    The methods SGLang calls with its own types (``match_prefix``, ``touch_prefix``,
    ``inc_lock_ref``, ``dec_lock_ref``, ``checkpoint``, ``evict``, ``take_events``)
    convert and call :class:`PrefixCache`'s; everything else is :class:`PrefixCache`'s
    own.
    """

    def __init__(self, params: CacheInitParams, index: PrefixIndex) -> None:
        if index.block_size != params.page_size:
            raise UnsupportedEngineFeatureError(
                f"index block size {index.block_size} != SGLang page size {params.page_size}"
            )
        allocator = params.token_to_kv_pool_allocator
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = allocator
        device = getattr(allocator, "device", "cpu")
        self.device = torch.device(device if isinstance(device, (str, torch.device)) else "cpu")
        pages = _SlotPages(allocator, int(params.page_size), self.device)
        PrefixCache.__init__(
            self,
            index,
            pages,
            _SlotRows(params.req_to_token_pool, pages),
            enable_kv_cache_events=bool(params.enable_kv_cache_events),
            fold_lora=True,  # SGLang's lookups carry the LoRA id inside extra_key only
        )
        self.disable = not self.supports_prefix_sharing()
        if params.enable_metrics:
            self.init_metrics_collector()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:  # type: ignore[override]
        """SGLang's ``match_prefix``: its ``RadixKey`` (tokens, ``limit``, namespace) in."""
        key = params.key
        m = PrefixCache.match_prefix(
            self, key.token_ids, key.extra_key, key.cache_salt, max_prefix_len=key.limit
        )
        node = m.last_node
        return MatchResult(m.prefix_len, node, node, node)

    def touch_prefix(self, key: Any) -> None:
        """SGLang's ``touch_prefix``: a match that only refreshes the path's recency (its
        scheduler touches waiting requests' prefixes so LRU evicts them last)."""
        PrefixCache.match_prefix(
            self, key.token_ids, key.extra_key, key.cache_salt, max_prefix_len=key.limit
        )

    def inc_lock_ref(self, node: object) -> IncLockRefResult:
        """SGLang's ``inc_lock_ref``: the delta in its result."""
        return IncLockRefResult(delta=PrefixCache.inc_lock_ref(self, cast(Any, node)))

    def dec_lock_ref(self, node: object, params: Any = None) -> DecLockRefResult:
        """SGLang's ``dec_lock_ref``: the delta in its result."""
        return DecLockRefResult(delta=PrefixCache.dec_lock_ref(self, cast(Any, node)))

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """SGLang's ``checkpoint``; the one at release (``req.finished()``) is final."""
        PrefixCache.checkpoint(self, req, up_to=up_to, final=req.finished())

    def evict(self, params: EvictParams) -> EvictResult:
        """SGLang's ``evict``: tokens in its params and result; SGLang's metrics told."""
        if params.num_tokens <= 0:
            return EvictResult()
        start = time.perf_counter()
        n = PrefixCache.evict(self, params.num_tokens)
        self.update_eviction_metrics(n, start)
        return EvictResult(num_tokens_evicted=n)

    def take_events(self) -> list[Any]:
        """The events since the last call as SGLang's ``kv_events`` structs.

        The radix tree records SGLang's own page events; any other index (the hash
        chain) records vLLM's, which carry the same fields.
        """
        recorder = self.event_recorder
        if recorder is None:
            return []
        events: list[Any] = (
            recorder.take_sglang_events()
            if isinstance(recorder, SGLangEventRecorder)
            else recorder.take_events()
        )
        if not events:
            return []
        from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        return as_engine_events(events, BlockStored | BlockRemoved | AllBlocksCleared)

    def path_device_indices(self, node: PrefixNode) -> torch.Tensor:
        """The KV slots of the prefix ``node`` covers (valid while it is locked)."""
        pages = self.pool
        assert isinstance(pages, _SlotPages)
        return pages.slots(node.page_ids[: node.num_tokens // self.page_size])

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """Longest cached prefix first (the index keeps no walkable tree for SGLang)."""
        return sorted(range(len(node_handles)), key=lambda i: -node_handles[i].num_tokens)
