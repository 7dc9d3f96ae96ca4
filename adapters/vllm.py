"""A facade shaped like vLLM 0.33's ``KVCacheManager``, over any prefix index.

Driven the way vLLM's scheduler drives it (``get_computed_blocks`` then
``allocate_slots`` at admission, ``allocate_slots(request, 1)`` per decode step,
``free`` at the end), the hash chain behind it gives vLLM's hits request for
request (SPEC VL-1..VL-4). The logic lives in :class:`CacheManager`; this module
only translates names and shapes.

vLLM keeps block 0 as its null block, so ``num_blocks=N`` here matches vLLM's
``num_gpu_blocks=N+1``, with every block id one lower.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Final

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import PrefixKVError, RequestStateError
from prefixkv.indexes.registry import make_index, pool_owned_options
from prefixkv.indexes.tokens import ExtraKey, TokenKey, make_extra_key
from prefixkv.indexes.validation import check_count
from prefixkv.storage.allocator import BlockAllocator

from .accounting import CacheTotals
from .events.wire import KVEvent
from .manager import CacheManager, Lookup
from .observer import CacheObserver
from .requests import RequestLike, SimpleRequest

__all__ = ["KVCacheBlocks", "RequestLike", "SimpleRequest", "VLLMKVCacheManager"]


class KVCacheBlocks:
    """vLLM's boundary object between scheduler and cache: block ids, one group.

    A plain class like vLLM's dataclass, not a NamedTuple: every decode step that
    adds a block returns one, and a compiled class is built about ten times faster.
    """

    __slots__ = ("block_ids",)

    def __init__(self, block_ids: Sequence[int]) -> None:
        self.block_ids = block_ids

    def get_block_ids(self) -> tuple[list[int], ...]:
        """Block ids per KV-cache group (one group here), as vLLM returns them."""
        return (list(self.block_ids),)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return list(self.block_ids) == list(other.block_ids)

    __hash__ = None  # type: ignore[assignment]  # compared by value, like vLLM's dataclass

    def __repr__(self) -> str:
        return f"KVCacheBlocks(block_ids={list(self.block_ids)!r})"


_NO_BLOCKS: Final = KVCacheBlocks(())
"""Most decode steps add no block; one shared immutable answer saves an allocation."""


def _namespace(request: RequestLike) -> ExtraKey | None:
    # vLLM's extra keys: the LoRA (name and path hashed, id published) and the salt.
    lora = getattr(request, "lora_request", None)
    return make_extra_key(
        lora=None if lora is None else getattr(lora, "lora_name", None),
        lora_path=None if lora is None else getattr(lora, "lora_path", None),
        lora_id=None if lora is None else getattr(lora, "lora_int_id", None),
        cache_salt=getattr(request, "cache_salt", None),
    )


class VLLMKVCacheManager:
    """vLLM's ``KVCacheManager`` API on a prefixkv index and block pool.

    Args:
        index: a ``PrefixIndex`` or a registry name (``"hash_chain"`` default).
        num_blocks: usable blocks in the pool.
        block_size: tokens per block when ``index`` is a name (default 16).
        enable_caching: ``False`` uses the no-cache index, as vLLM does.
        observers: hooks for the manager (accounting, metrics); see ``observer.py``.
        enable_kv_cache_events: record KV events for ``take_events`` (vLLM's flag).

    Not modelled: speculative lookahead slots, KV-connector external tokens,
    hybrid (sliding-window, Mamba) groups.
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
        if isinstance(index, str):
            name = index if enable_caching else "none"
            size: Any = 16 if block_size is None else block_size  # make_index checks it
            index = make_index(name, block_size=size, **pool_owned_options(name))
        self.manager = CacheManager(
            index,
            BlockAllocator(num_blocks),
            observers=observers,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        self.block_size = index.block_size
        self._keys: dict[Hashable, TokenKey] = {}
        self._pending: dict[Hashable, Lookup] = {}

    def _key(self, request: RequestLike) -> TokenKey:
        # One key per request, from its lookup on: its block-hash memo lives as long
        # as the request, like vLLM's Request.block_hashes.
        key = self._keys.get(request.request_id)
        if key is None:
            key = TokenKey(request.all_token_ids, _namespace(request))
            self._keys[request.request_id] = key
        else:
            have = len(key.tokens)
            if request.num_tokens > have:
                key.append(request.all_token_ids[have:])
        return key

    def get_computed_blocks(self, request: RequestLike) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix, capped at ``num_tokens - 1`` (vLLM's cap). Locks nothing.

        Returns:
            The hit blocks and the number of computed (hit) tokens.
        """
        if request.request_id in self.manager:
            raise RequestStateError(f"request {request.request_id!r} is running already")
        key = self.manager.make_key(self._key(request))
        lookup = self.manager.match(key)
        self._pending[request.request_id] = lookup
        return KVCacheBlocks(list(lookup.block_ids)), lookup.num_tokens

    def allocate_slots(
        self,
        request: RequestLike,
        num_new_tokens: object,
        num_new_computed_tokens: object = 0,
        new_computed_blocks: object = None,
        num_lookahead_tokens: object = 0,
    ) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` more tokens; registers the full blocks (VL-1, VL-2).

        A new request takes its hit from the preceding ``get_computed_blocks``.
        A running one gets slots for ``num_computed_tokens + num_new_tokens``, as
        in vLLM even past ``num_tokens`` (tokens async scheduling has scheduled but
        not sampled yet). Full blocks are registered up to ``min(computed + new,
        num_tokens)`` before the KV is computed, exactly when vLLM does it.

        Returns:
            The newly allocated blocks, or ``None`` when they do not fit (nothing
            changes then).

        Raises:
            PrefixKVError: lookahead slots (speculative decoding) are asked for,
                or the counts disagree with the request.
        """
        if (
            type(num_new_tokens) is int
            and num_new_tokens >= 0
            and type(num_new_computed_tokens) is int
            and num_new_computed_tokens >= 0
            and type(num_lookahead_tokens) is int
            and num_lookahead_tokens == 0
        ):  # the decode step's arguments pass these tests and no call
            num_new, num_hit = num_new_tokens, num_new_computed_tokens
        else:  # one of them is wrong: the checks name it, in this order
            check_count("num_new_tokens", num_new_tokens)
            check_count("num_new_computed_tokens", num_new_computed_tokens)
            check_count("num_lookahead_tokens", num_lookahead_tokens)
            raise PrefixKVError("lookahead slots (speculative decoding) are not modelled")
        rid = request.request_id
        mgr = self.manager
        if rid in mgr:
            # A running request (decode, or the next chunk of a prefill): the hot path.
            # Slots for its computed and new tokens, as vLLM (tokens scheduled but not
            # sampled yet included); registration up to its tokens, which the key
            # learns only when a block fills, as vLLM hashes them.
            total: object = request.num_computed_tokens + num_new  # boxed once, passed twice
            grown = mgr.advance(
                rid, total, total, tokens=request.all_token_ids, swap_duplicates=False
            )
            if grown is None:
                return None
            return KVCacheBlocks(grown) if grown else _NO_BLOCKS
        key = mgr.make_key(self._key(request))
        lookup = self._pending.get(rid)
        if lookup is None or lookup.key is not key or lookup.num_tokens != num_hit:
            if num_hit:
                raise PrefixKVError(
                    f"request {rid!r}: {num_hit} computed tokens without "
                    "a matching get_computed_blocks"
                )
            lookup = Lookup(key, mgr.index.match_prefix(key, 0))  # computes everything
        total = min(request.num_computed_tokens + num_hit + num_new, len(key))
        adm = mgr.admit(rid, key, num_tokens=total, lookup=lookup)
        self._pending.pop(rid, None)
        if adm is None:
            return None
        mgr.commit(rid, total, swap_duplicates=False)
        return KVCacheBlocks(adm.block_table[len(lookup.block_ids) :])

    def free(self, request: RequestLike) -> None:
        """Release a finished or aborted request, tail block first (HC-7)."""
        rid = request.request_id
        self._pending.pop(rid, None)
        key = self._keys.pop(rid, None)
        if rid in self.manager:
            # The key learns tokens only when a block fills; tell the manager what the
            # request computed past it (every full block is registered already).
            if key is not None and request.num_tokens > len(key.tokens):
                key.append(request.all_token_ids[len(key.tokens) :])
            computed = min(request.num_computed_tokens, len(self.manager.key(rid).tokens))
            self.manager.advance(rid, computed, computed, swap_duplicates=False)
            self.manager.abort(rid)

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (vLLM ``KVCacheManager.take_events``)."""
        return self.manager.take_events()

    def get_block_ids(self, request_id: Hashable) -> tuple[list[int], ...]:
        """The request's block table, per group."""
        return (self.manager.block_table(request_id),)

    def get_num_common_prefix_blocks(self, running_request_id: Hashable) -> list[int]:
        """Blocks shared by every running request, per group (HC-11)."""
        return [self.manager.num_common_prefix_blocks(running_request_id)]

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache; ``False`` (nothing changes) while requests run."""
        if self.manager.running():
            return False
        self.manager.reset()
        return True

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop cache entries by block id (KV connectors, HC-10)."""
        self.manager.evict_blocks(block_ids)

    @property
    def usage(self) -> float:
        """Fraction of blocks neither free nor evictable (vLLM: 1 - free queue / total)."""
        return self.manager.usage

    @property
    def prefix_cache_stats(self) -> CacheTotals:
        """Requests, query tokens and hit tokens so far (vLLM ``PrefixCacheStats``)."""
        return self.manager.totals
