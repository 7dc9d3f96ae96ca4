"""SGLang 0.5.23's prefix cache backed by a prefixkv index: ``--radix-cache-backend``.

    pip install prefixkv   # into SGLang's environment; its entry point registers:
    python -m sglang.launch_server ... --radix-cache-backend prefixkv-radix
    python -m sglang.launch_server ... --radix-cache-backend prefixkv-hash-chain

SGLang loads every ``sglang.srt.plugins`` entry point in each of its processes
(``sglang.srt.plugins.load_plugins``) before it builds the tree cache; prefixkv's
entry point is :func:`register`, which calls SGLang's documented
``register_radix_cache_backend`` for each name in :data:`BACKENDS`. Calling
``register()`` yourself before starting an engine in-process works too.

:class:`PrefixKVPrefixCache` is a ``BasePrefixCache``: SGLang's scheduler matches,
locks, checkpoints (``cache_unfinished_req`` / ``cache_finished_req``), evicts and
frees through it exactly as through ``RadixCache``, while the index decides what is
cached. KV slots come from and go back to SGLang's own allocator; the index holds
page ids (``page = slot // page_size``). Hybrid (SWA, Mamba) models, hierarchical
caching, EAGLE bigram keys and eviction policies prefixkv lacks are refused.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    DecLockRefParams,
    DecLockRefResult,
    EvictParams,
    EvictResult,
    IncLockRefResult,
    MatchPrefixParams,
    MatchResult,
    TreeLock,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.registry import (
    TreeCacheBuildContext,
    get_radix_cache_factory,
    register_radix_cache_backend,
)

from prefixkv.indexes.base import CacheHandle, PrefixIndex
from prefixkv.indexes.registry import index_options, make_index, pool_owned_options
from prefixkv.indexes.tokens import TokenKey, make_extra_key
from prefixkv.indexes.validation import ceil_div

from ..events.codec import as_engine_events
from ..events.dialects import EventRecorder, attach_event_recorder
from ..events.sglang_recorder import SGLangEventRecorder
from .errors import UnsupportedEngineFeatureError

__all__ = ["BACKENDS", "PrefixKVPrefixCache", "make_prefix_cache", "register"]

BACKENDS = {"prefixkv-radix": "radix", "prefixkv-hash-chain": "hash_chain"}
"""``--radix-cache-backend`` name -> prefixkv index."""


def register() -> None:
    """Register :data:`BACKENDS` with SGLang (idempotent; the entry point's target)."""
    for name, index in BACKENDS.items():
        if get_radix_cache_factory(name) is None:
            register_radix_cache_backend(name, functools.partial(make_prefix_cache, index))


def make_prefix_cache(index_name: str, ctx: TreeCacheBuildContext) -> PrefixKVPrefixCache:
    """The factory SGLang calls with its build context.

    Raises:
        UnsupportedEngineFeatureError: a feature of the context the plug-in lacks.
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
    policy = (params.eviction_policy or "lru").lower()
    options = pool_owned_options(index_name)
    if "eviction" in index_options(index_name):  # the index picks its policy by name
        options["eviction"] = policy
    elif policy != "lru":  # an index without the option evicts in LRU order only
        refuse(f"--radix-eviction-policy {policy} with the {index_name} index")
    index = make_index(index_name, block_size=params.page_size, **options)
    return PrefixKVPrefixCache(params, index, disable=ctx.disable_radix_cache)


class _Node:
    """What SGLang holds as ``req.last_node``: an index handle and the slots it covers."""

    __slots__ = ("block_ids", "handle", "num_tokens")

    def __init__(self, handle: CacheHandle, block_ids: list[int], num_tokens: int) -> None:
        self.handle = handle
        self.block_ids = block_ids
        self.num_tokens = num_tokens

    def __repr__(self) -> str:
        return f"<prefixkv node: {self.num_tokens} tokens>"


class _EngineEvents:
    """SGLang's event-recorder interface (``take()``) over prefixkv's recorder.

    The radix tree records SGLang's own page events; any other index (the hash chain)
    records vLLM's, which carry the same fields. Either way SGLang gets its own
    structs, so its publisher and a router see what SGLang's RadixCache sends.
    """

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder

    def take(self) -> list[Any]:
        """The events since the last call, as ``sglang.srt.disaggregation.kv_events`` structs."""
        recorder = self.recorder
        events: list[Any] = (
            recorder.take_sglang_events()
            if isinstance(recorder, SGLangEventRecorder)
            else recorder.take_events()
        )
        if not events:
            return []
        from sglang.srt.disaggregation.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        return as_engine_events(events, BlockStored | BlockRemoved | AllBlocksCleared)


class PrefixKVPrefixCache(BasePrefixCache):  # type: ignore[misc]
    """SGLang's ``BasePrefixCache`` over a prefixkv index, on SGLang's own pools.

    Args:
        params: SGLang's ``CacheInitParams`` (allocator, req-to-token pool, page size).
        index: the prefix index; its ``block_size`` must be the page size.
        disable: SGLang's ``--disable-radix-cache``: every match misses, nothing is kept.

    Sizes are in tokens, as in SGLang. Thread safety: none (SGLang's scheduler thread).
    """

    def __init__(self, params: CacheInitParams, index: PrefixIndex, *, disable: bool = False):
        if index.block_size != params.page_size:
            raise UnsupportedEngineFeatureError(
                f"index block size {index.block_size} != SGLang page size {params.page_size}"
            )
        self.disable = disable or params.disable
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = params.token_to_kv_pool_allocator
        self.page_size: int = int(params.page_size)
        self.index = index
        device = getattr(self.token_to_kv_pool_allocator, "device", "cpu")
        self.device = torch.device(device if isinstance(device, (str, torch.device)) else "cpu")
        self.root_node = _Node(None, [], 0)
        # SGLang's base class reads self.kv_events (a recorder with take()).
        self.kv_events: _EngineEvents | None = None
        if params.enable_kv_cache_events and not self.disable:
            self.kv_events = _EngineEvents(attach_event_recorder(index))
        if params.enable_metrics:
            self.init_metrics_collector()

    # ---------------------------------------------------------------- helpers

    def _key(
        self, tokens: Sequence[int], extra_key: Any, cache_salt: Any, priority: int = 0
    ) -> TokenKey:
        # SGLang's RadixKey fields (extra_key, which carries the LoRA id, and the salt),
        # by the same rule as the SGLang-shaped facade.
        return TokenKey(tokens, make_extra_key(extra=extra_key, cache_salt=cache_salt), priority)

    def _slots(self, block_ids: Sequence[int]) -> torch.Tensor:
        pages = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        if self.page_size == 1:
            return pages
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def _free_pages(self, block_ids: Sequence[int]) -> None:
        if block_ids:
            self.token_to_kv_pool_allocator.free(self._slots(block_ids))

    def _sizes(self) -> int:
        return int(self.index.stats().num_evictable_blocks)

    # ------------------------------------------------------------- matching

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        """Longest cached prefix of the key, page-aligned; may split a radix node; locks nothing."""
        key = params.key
        root = self.root_node
        if self.disable or len(key) == 0:
            return MatchResult(0, root, root, root)
        m = self.index.match_prefix(self._key(key.raw_token_ids(), key.extra_key, key.cache_salt))
        node = _Node(m.handle, m.block_ids, m.num_tokens) if m.num_tokens else root
        return MatchResult(m.num_tokens, node, node, node)

    def supports_prefix_sharing(self) -> bool:
        return not self.disable

    def path_device_indices(self, node: _Node) -> torch.Tensor:
        """The KV slots of the prefix ``node`` covers (valid while it is locked)."""
        return self._slots(node.block_ids)

    def dfs_weight_order(self, node_handles: Sequence[Any]) -> list[int]:
        """Longest cached prefix first (the index keeps no walkable tree for SGLang)."""
        return sorted(range(len(node_handles)), key=lambda i: -node_handles[i].num_tokens)

    # -------------------------------------------------------------- locking

    def inc_lock_ref(self, node: _Node) -> IncLockRefResult:
        """Pin ``node``'s prefix; ``delta`` is minus the tokens that stopped being evictable."""
        if self.disable or node is self.root_node:
            return IncLockRefResult(delta=0)
        before = self._sizes()
        self.index.lock(node.handle)
        return IncLockRefResult(delta=(self._sizes() - before) * self.page_size)

    def dec_lock_ref(self, node: _Node, params: DecLockRefParams | None = None) -> DecLockRefResult:
        """Release one pin; ``delta`` is the tokens that became evictable."""
        if self.disable or node is self.root_node:
            return DecLockRefResult(delta=0)
        before = self._sizes()
        self._free_pages(self.index.unlock(node.handle))
        return DecLockRefResult(delta=(self._sizes() - before) * self.page_size)

    # ------------------------------------------------------------ insertion

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        """Insert the request's first ``up_to`` tokens (page-aligned), as ``RadixCache`` does.

        Frees the request's slots whose content the index already held, points the
        request's row at the index's copies, splits at the prompt's end, and moves
        the request's lock to the new prefix (SPEC SG-3, SG-4).
        """
        if self.disable:
            return
        ps = self.page_size
        tokens = req.full_untruncated_fill_ids[:up_to]
        n = len(tokens) // ps * ps
        if n == 0:
            return
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        table = (row[:n:ps].to(torch.int64) // ps).tolist()
        key = self._key(tokens, req.extra_key, req.cache_salt, req.priority or 0)
        old: _Node = req.last_node
        prefix = None if old is self.root_node else old.handle
        result = self.index.insert(key, table, n, prefix=prefix)
        theirs = table[: result.first_block] + result.block_ids
        protected = req.kv.cache_protected_len // ps
        self._free_pages([table[i] for i in range(protected, len(theirs)) if table[i] != theirs[i]])
        self.req_to_token_pool.write(
            (req.kv.req_pool_idx, slice(req.kv.cache_protected_len, n)),
            self._slots(theirs[protected:]).to(row.dtype),
        )
        req.kv.cache_protected_len = n
        req.kv.cache_inserted_len = max(req.kv.cache_inserted_len, n)
        new = _Node(result.handle, theirs, n)
        if prefix is None or req.lock is None or req.lock.node is not old:
            self.unlock(req.lock)
            req.lock = self.lock(new)
        else:
            self._free_pages(self.index.relock(prefix, new.handle))
            req.lock = TreeLock(new, DecLockRefParams())
        req.last_node = new
        prompt = len(req.origin_input_ids) // ps * ps
        if 0 < prompt < n:  # a node boundary at the prompt's end: outputs evict first
            self.index.insert(key, theirs, prompt)

    # -------------------------------------------------------------- eviction

    def evict(self, params: EvictParams) -> EvictResult:
        """Free at least ``num_tokens`` tokens of unlocked pages (whole leaves: may overshoot)."""
        if self.disable or params.num_tokens <= 0:
            return EvictResult()
        freed = self.index.evict(ceil_div(params.num_tokens, self.page_size))
        self._free_pages(freed)
        return EvictResult(num_tokens_evicted=len(freed) * self.page_size)

    def reset(self) -> None:
        """Drop every entry; their slots go back to the allocator.

        Raises:
            CacheInUseError: a request still holds a lock (nothing changes).
        """
        self._free_pages(self.index.reset())

    # ----------------------------------------------------------------- sizes

    def evictable_size(self) -> int:
        return self._sizes() * self.page_size

    def protected_size(self) -> int:
        return int(self.index.stats().num_locked_blocks) * self.page_size

    def total_size(self) -> int:
        return int(self.index.stats().num_cached_blocks) * self.page_size

    def pretty_print(self) -> None:
        stats = self.index.stats()
        print(f"prefixkv {type(self.index).__name__}: {stats}")

    def check_invariants(self) -> None:
        """The index's own invariants (pool-wide conservation needs the live rows).

        Raises:
            AssertionError: describing the broken state.
        """
        self.index.check_invariants()
