"""A facade shaped like SGLang 0.5.23's prefix cache (``RadixCache``), over any index.

Driven the way SGLang's scheduler drives it — match and lock at admission,
allocate (evicting when short), ``cache_unfinished_req`` after prefill, one slot
per decode step, ``cache_finished_req`` at the end — the radix tree behind it gives
SGLang's hits request for request (SPEC SG-1..SG-6). The logic lives in
:class:`CacheManager`; this module translates names, units (tokens) and shapes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple, cast

from prefixkv.indexes.base import CacheHandle, PrefixIndex, SupportsCachedBlocks
from prefixkv.indexes.errors import BlockOwnershipError, PrefixKVError, RequestStateError
from prefixkv.indexes.registry import make_index, pool_owned_options
from prefixkv.indexes.tokens import ExtraKey, TokenKey, make_extra_key, normalize_extra_key
from prefixkv.indexes.validation import MAX_BLOCKS, ceil_div, check_count
from prefixkv.storage.allocator import BlockAllocator, Owner
from prefixkv.storage.block_table import slot_mapping

from .accounting import CacheTotals
from .events.wire import KVEvent
from .manager import CacheManager
from .observer import CacheObserver
from .requests import ReqLike, SimpleReq

__all__ = ["MatchResult", "ReqLike", "SGLangRadixCache", "SimpleReq"]


class MatchResult(NamedTuple):
    """SGLang's ``MatchResult``: the hit's blocks, its length and its last node.

    ``device_indices`` are token slots at page size 1 (SGLang's KV indices) and
    page (block) ids at page size > 1 (slot = page * page_size + offset).
    """

    device_indices: list[int]
    last_node: CacheHandle
    prefix_len: int


def _namespace(req: object) -> ExtraKey | None:
    # The same rule as the tree API's ``extra_key``/``cache_salt`` (make_extra_key).
    return make_extra_key(
        extra=getattr(req, "extra_key", None) or None,
        cache_salt=getattr(req, "cache_salt", None) or None,
        lora=getattr(req, "lora_id", None),
    )


def _tree_namespace(extra_key: object, cache_salt: object) -> ExtraKey | None:
    if cache_salt is None:
        return normalize_extra_key(extra_key)
    if extra_key is not None and not isinstance(extra_key, str):
        raise PrefixKVError("give cache_salt with a str extra_key (SGLang's RadixKey), or neither")
    return make_extra_key(extra=extra_key, cache_salt=cache_salt)


class SGLangRadixCache:
    """SGLang's prefix-cache API on a prefixkv index and block pool.

    Args:
        index: a ``PrefixIndex`` or a registry name (``"radix"`` default).
        capacity_tokens: pool size in tokens (whole pages are used).
        page_size: tokens per page when ``index`` is a name (default 1).
        observers: hooks for the manager (accounting, metrics); see ``observer.py``.
        enable_kv_cache_events: record KV events for ``take_events``.

    Sizes (``evictable_size``, ``evict``) are in tokens, as in SGLang.
    """

    def __init__(
        self,
        index: PrefixIndex | str = "radix",
        capacity_tokens: object = 65536,
        page_size: object = None,
        *,
        observers: Sequence[CacheObserver] = (),
        enable_kv_cache_events: object = False,
    ) -> None:
        if isinstance(index, str):
            size: Any = 1 if page_size is None else page_size  # make_index checks it
            index = make_index(index, block_size=size, **pool_owned_options(index))
        self.page_size: int = index.block_size
        num_pages = capacity_tokens // self.page_size if type(capacity_tokens) is int else 0
        if num_pages <= 0:
            raise PrefixKVError(
                f"capacity_tokens must hold at least one page of {self.page_size}, "
                f"got {capacity_tokens!r}"
            )
        self.manager = CacheManager(
            index,
            BlockAllocator(num_pages),
            observers=observers,
            enable_kv_cache_events=enable_kv_cache_events,
        )

    # ------------------------------------------------------- the tree's own API

    @property
    def allocator(self) -> BlockAllocator:
        """The page pool (SGLang's ``token_to_kv_pool_allocator``)."""
        return self.manager.allocator

    def match_prefix(
        self,
        token_ids: Sequence[int],
        extra_key: object = None,
        cache_salt: object = None,
    ) -> MatchResult:
        """Longest cached prefix of ``token_ids`` (page-aligned, uncapped); may split a node.

        ``extra_key`` and ``cache_salt`` are SGLang's ``RadixKey`` fields; a request
        filed through the scheduler flow with the same fields is in the same namespace.
        """
        key = TokenKey(token_ids, _tree_namespace(extra_key, cache_salt))
        m = self.manager.index.match_prefix(key)
        return MatchResult(m.block_ids, m.handle, m.num_tokens)

    def insert(
        self,
        token_ids: Sequence[int],
        value: Sequence[int],
        extra_key: object = None,
        cache_salt: object = None,
    ) -> int:
        """Insert ``token_ids`` held in pages ``value``; returns the already cached length.

        ``value`` holds one page per whole page of ``token_ids``: pages the caller holds
        (``allocator.allocate``), or, for a cached prefix, the tree's own pages for
        exactly those tokens (SGLang re-inserts its matched prefix this way). Pages
        the index adopts become the cache's; as in SGLang, the caller frees its own
        copies of pages that were cached already (those ``allocator.owner_of`` still
        says are the caller's).

        Raises:
            BlockOwnershipError: a page the pool never handed out, out of range, given
                twice, held by a running request, or cached for other tokens;
                nothing changes then.
        """
        key = TokenKey(token_ids, _tree_namespace(extra_key, cache_salt))
        alloc = self.manager.allocator
        pages = len(key) // self.page_size
        ids: list[object] = list(value)  # checked below, one by one, by the pool
        if len(ids) < pages:
            raise BlockOwnershipError(f"{pages} pages to insert but only {len(ids)} page ids given")
        ids = ids[:pages]
        for i, page in enumerate(ids):
            if alloc.owner_of(page) is Owner.MANAGER:
                self._check_own_prefix(key, ids, i)
                break
        mine = [p for p in ids if alloc.owner_of(p) is not Owner.MANAGER]
        alloc.check_held(cast("list[int]", mine), Owner.CALLER, "insert")  # checks they are
        if len(set(ids)) != len(ids):
            raise BlockOwnershipError(f"insert: a page id appears twice in {ids[:16]}")
        # Every page is the cache's own (owner_of said so) or one of ``mine``: all ids.
        result = self.manager.index.insert(key, cast("list[int]", ids))
        adopted = [p for p in result.block_ids if alloc.owner_of(p) is Owner.CALLER]
        alloc.transfer(adopted, src=Owner.CALLER, dst=Owner.MANAGER)
        return result.num_cached_tokens

    def _check_own_prefix(self, key: TokenKey, ids: list[object], first: int) -> None:
        # Pages the cache holds may be given only as the tree's own pages for exactly
        # these tokens (a re-insert of a matched prefix), never a request's pages.
        index = self.manager.index
        own = index.cached_blocks(key) if isinstance(index, SupportsCachedBlocks) else []
        alloc = self.manager.allocator
        for i in range(first, len(ids)):
            if alloc.owner_of(ids[i]) is Owner.MANAGER and (i >= len(own) or own[i] != ids[i]):
                raise BlockOwnershipError(
                    f"insert: page {ids[i]} is held by a running request or cached for other "
                    "tokens; pass pages you allocated, or the tree's own pages for these tokens"
                )

    def evict(self, num_tokens: object) -> int:
        """Evict unlocked leaves until ``num_tokens`` tokens are free; returns tokens freed."""
        n = check_count("num_tokens", num_tokens, MAX_BLOCKS * self.page_size)
        pages = min(ceil_div(n, self.page_size), self.manager.allocator.num_blocks)
        return self.manager.evict(pages) * self.page_size

    def inc_lock_ref(self, node: CacheHandle) -> None:
        """Lock ``node`` and its ancestors."""
        self.manager.index.lock(node)

    def dec_lock_ref(self, node: CacheHandle) -> None:
        """Release one lock on ``node`` and its ancestors."""
        released = self.manager.index.unlock(node)
        self.manager.allocator.free(released, owner=Owner.MANAGER)

    def evictable_size(self) -> int:
        """Evictable tokens."""
        return self.manager.index.stats().num_evictable_blocks * self.page_size

    def protected_size(self) -> int:
        """Locked tokens."""
        return self.manager.index.stats().num_locked_blocks * self.page_size

    def total_size(self) -> int:
        """Cached tokens."""
        return self.manager.index.stats().num_cached_blocks * self.page_size

    def available_size(self) -> int:
        """Free tokens in the pool."""
        return self.manager.allocator.num_free_blocks * self.page_size

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call, SGLang's page events as vLLM wire structs."""
        return self.manager.take_events()

    def reset(self) -> None:
        """Drop the whole cache (only with no request running)."""
        self.manager.reset()

    # ----------------------------------------------------- the scheduler's flow

    def alloc_for_extend(self, req: ReqLike) -> int | None:
        """Admission (SG-1): match capped at ``len - 1``, lock, allocate the extend.

        At page size > 1 it evicts for one page more than the extend needs, as
        SGLang's ``alloc_paged_token_slots_extend`` does.

        Returns:
            The prefix (hit) length, or ``None`` when the pool cannot hold the
            extend (nothing changes).
        """
        rid = req.rid
        if rid in self.manager:
            raise RequestStateError(f"request {rid!r} is running already")
        key = TokenKey(req.origin_input_ids, _namespace(req), getattr(req, "priority", 0) or 0)
        adm = self.manager.admit(rid, key, reserve_blocks=1 if self.page_size > 1 else 0)
        return None if adm is None else adm.hit_tokens

    def cache_unfinished_req(self, req: ReqLike) -> None:
        """After prefill (SG-3): insert the prompt, free duplicates, move the lock."""
        rid = req.rid
        self.manager.commit(rid, self._committed_len(rid))

    def alloc_for_decode(self, req: ReqLike) -> bool:
        """One decode step: a slot for the last sampled token (the one fed now).

        Evicts to keep one page free, as SGLang's decode allocation does.

        Returns:
            ``False`` when no slot can be had (SGLang would retract the request).
        """
        rid = req.rid
        pos = self._committed_len(rid)
        prompt = len(req.origin_input_ids)
        output = req.output_ids
        if not prompt <= pos < prompt + len(output):
            raise RequestStateError(f"request {rid!r} has no sampled token to feed at {pos}")
        ps = self.page_size
        reserve = 0 if ps == 1 or pos % ps == 0 else 1
        return self.manager.append(
            rid, output[pos - prompt : pos - prompt + 1], reserve_blocks=reserve
        )

    def cache_finished_req(self, req: ReqLike) -> None:
        """At finish (SG-4): insert prompt + fed output, split at the prompt, unlock."""
        rid = req.rid
        self.manager.commit(rid, self._committed_len(rid))
        self.manager.finish(rid)

    def req_to_token(self, req: ReqLike) -> list[int]:
        """The request's token slots (SGLang's ``req_to_token_pool`` row)."""
        rid = req.rid
        n = self._committed_len(rid)
        return slot_mapping(self.manager.block_table(rid), 0, n, self.page_size)

    def _committed_len(self, rid: Hashable) -> int:
        # SGLang's kv_committed_len: the prompt and every fed token, i.e. the key.
        return len(self.manager.key(rid).tokens)  # RequestStateError when not running

    @property
    def totals(self) -> CacheTotals:
        """Requests, query tokens and hit tokens so far."""
        return self.manager.totals
