"""vLLM 0.33's ``KVCacheManager`` API over a prefixkv index, for vLLM's own scheduler.

:class:`PrefixKVCacheManager` is what :class:`~.vllm.PrefixKVScheduler` puts in
``scheduler.kv_cache_manager``: every method vLLM's ``Scheduler`` and ``AsyncScheduler``
call on a single full-attention group, answering with vLLM's own ``KVCacheBlocks`` and
``KVCacheBlock`` objects. The request lifecycle is prefixkv's :class:`CacheManager`
(block tables, pool, index); this module translates vLLM's calls, counts and block ids.

Ids: vLLM keeps block 0 as its null block, so prefixkv's pool has ``num_gpu_blocks - 1``
blocks and vLLM's id of prefixkv block ``b`` is ``b + 1``. Block tables are append-only
(the model runner holds them), so a block the index already had under another id stays
in the request's table until it finishes (``swap_duplicates=False``), as in vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.metrics.stats import PrefixCacheStats
from vllm.v1.request import Request, RequestStatus

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.tokens import ExtraKey, TokenKey, make_extra_key
from prefixkv.indexes.validation import ceil_div
from prefixkv.storage.allocator import BlockAllocator

from ..events.codec import as_engine_events
from ..manager import CacheManager, Lookup

__all__ = ["PrefixKVCacheManager"]

_ADMITTING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def _namespace(request: Request) -> ExtraKey | None:
    # vLLM puts the LoRA name and the cache salt into block 0's hash; so does prefixkv.
    lora = request.lora_request
    return make_extra_key(
        lora=lora.lora_name if lora is not None else None, cache_salt=request.cache_salt
    )


class PrefixKVCacheManager:
    """The KV-cache manager of one full-attention group, backed by a prefixkv index.

    Args:
        index: the prefix index; its ``block_size`` must be vLLM's block size.
        num_gpu_blocks: vLLM's block count, null block included.
        max_model_len: slots are never allocated past it (as vLLM caps them).
        enable_caching: ``False`` answers every lookup with a miss.
        log_stats: keep vLLM's ``PrefixCacheStats`` (the ``vllm:prefix_cache_*`` metrics).
        watermark: ``SchedulerConfig.watermark``, the fraction of blocks an admission
            leaves free while other requests run.

    Thread safety: none; vLLM calls it from its scheduler thread only.
    """

    def __init__(
        self,
        index: PrefixIndex,
        num_gpu_blocks: int,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        log_stats: bool = False,
        watermark: float = 0.0,
        enable_kv_cache_events: bool = False,
    ) -> None:
        if num_gpu_blocks < 2:
            raise PrefixKVError(
                f"num_gpu_blocks must be >= 2 (block 0 is null), got {num_gpu_blocks}"
            )
        self.manager = CacheManager(
            index, BlockAllocator(num_gpu_blocks - 1), enable_kv_cache_events=enable_kv_cache_events
        )
        self.block_size = index.block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.num_kv_cache_groups = 1
        # vLLM's block objects, made once: the scheduler and model runner read ids only.
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.blocks[0].is_null = True
        self.empty_kv_cache_blocks = KVCacheBlocks(((),))
        self._keys: dict[str, TokenKey] = {}
        self._lookups: dict[str, Lookup] = {}

    # ------------------------------------------------------------------ helpers

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        """vLLM's wrapper, sharing one empty answer as vLLM does."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def _wrap(self, block_ids: list[int]) -> KVCacheBlocks:
        if not block_ids:
            return self.empty_kv_cache_blocks
        table = self.blocks
        return KVCacheBlocks(([table[b + 1] for b in block_ids],))

    def _key(self, request: Request, num_tokens: int) -> TokenKey:
        """The request's key, holding at least its first ``num_tokens`` tokens."""
        key = self._keys.get(request.request_id)
        if key is None:
            key = TokenKey(request.all_token_ids, _namespace(request))
            self._keys[request.request_id] = key
        have = len(key.tokens)
        if num_tokens > have:
            key.append(request.all_token_ids[have:num_tokens])
        return key

    def _blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def _available(self, hit: Lookup | None) -> int:
        # Free plus evictable blocks, less the hit's own evictable ones now (locking
        # them takes them off vLLM's free queue too); a stale hit raises here.
        index = self.manager.index
        pinned = 0 if hit is None else index.count_evictable(hit.match.handle)
        return self.manager.allocator.num_free_blocks + index.stats().num_evictable_blocks - pinned

    # ------------------------------------------------------------------ lookup

    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether a local lookup may run (off for prompt-logprob and pooling requests)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The cached prefix, capped at ``num_tokens - 1`` (or ``max_cache_hit_length``).

        Locks nothing: ``allocate_slots`` takes the hit. O(prompt blocks).

        Returns:
            The hit blocks, the hit length in tokens, and 0 (no shared-prefix boundary:
            there is no sparse-retention group).
        """
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        cap = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        key = self._key(request, request.num_tokens)
        m = Lookup(key, self.manager.index.match_prefix(key, max(0, cap)))
        self._lookups[request.request_id] = m
        return self._wrap(m.block_ids), m.num_tokens, 0

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """``get_computed_blocks`` plus ``hit_diverged=False`` (one group never diverges)."""
        return (*self.get_computed_blocks(request, max_cache_hit_length), False)

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count an admitted lookup, as vLLM does (preempted requests apart)."""
        if self.prefix_cache_stats is None or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens, num_hits=num_hits, preempted=request.num_preemptions > 0
        )

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take (and reset) the stats; ``None`` when stats are off."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    # -------------------------------------------------------------- allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Slots for ``num_new_tokens`` (plus lookahead); registers the full blocks.

        A waiting request takes its hit from the ``get_computed_blocks`` just before
        (vLLM's admission); a running one grows (a prefill chunk or a decode step,
        O(1) when no block is added). Full blocks of the tokens whose KV this step
        computes are registered before the forward pass, up to ``num_tokens``, as
        vLLM does; tokens sampled after this step (async scheduling schedules them
        before they exist) are registered by ``cache_blocks``.

        Returns:
            The newly allocated blocks, or ``None`` (nothing changed) when they do
            not fit, with the watermark and ``reserved_blocks`` kept free.

        Raises:
            PrefixKVError: KV-connector tokens, delayed caching or encoder tokens
                (the plug-in refuses those features at start-up).
        """
        if num_external_computed_tokens or delay_cache_blocks or num_encoder_tokens:
            raise PrefixKVError(
                "KV-connector loads and encoder (cross-attention) tokens are not supported"
            )
        if num_new_tokens == 0 and num_new_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        rid = request.request_id
        computed = request.num_computed_tokens + num_new_computed_tokens
        slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        cached = min(computed + num_new_tokens, request.num_tokens)
        if rid in self.manager:
            return self._grow(request, slots, cached, reserved_blocks)
        return self._admit(
            request,
            num_new_computed_tokens,
            slots,
            cached,
            full_sequence_must_fit=full_sequence_must_fit,
            reserve=reserved_blocks
            + (self.watermark_blocks if has_scheduled_reqs and request.status in _ADMITTING else 0),
        )

    def _grow(
        self, request: Request, slots: int, cached: int, reserve: int
    ) -> KVCacheBlocks | None:
        mgr = self.manager
        if reserve:  # only KV-connector loads reserve blocks; keep the decode step O(1)
            need = self._blocks_for(slots) - len(mgr.block_table(request.request_id))
            if need > 0 and need + reserve > self._available(None):
                return None
        self._key(request, cached)
        grown = mgr.advance(request.request_id, slots, cached, swap_duplicates=False)
        return None if grown is None else self._wrap(grown)

    def _admit(
        self,
        request: Request,
        num_hit: int,
        slots: int,
        cached: int,
        *,
        full_sequence_must_fit: bool,
        reserve: int,
    ) -> KVCacheBlocks | None:
        rid = request.request_id
        mgr = self.manager
        key = self._key(request, request.num_tokens)
        m = self._lookups.get(rid)
        if m is None or m.num_tokens != num_hit:
            if num_hit:
                raise PrefixKVError(
                    f"request {rid!r}: {num_hit} computed tokens without a matching lookup"
                )
            m = Lookup(key, mgr.index.match_prefix(key, 0))
        available = self._available(m)
        if full_sequence_must_fit:
            # vLLM's admission gate: the whole sequence must fit, not just this chunk.
            full = self._blocks_for(min(request.num_tokens, self.max_model_len))
            if full - len(m.block_ids) + reserve > available:
                return None
        if self._blocks_for(slots) - len(m.block_ids) + reserve > available:
            return None
        adm = mgr.admit(rid, key, num_tokens=max(slots, m.num_tokens, 1), lookup=m)
        if adm is None:
            return None
        del self._lookups[rid]
        mgr.commit(rid, cached, swap_duplicates=False)
        return self._wrap(adm.block_table[len(m.block_ids) :])

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the full blocks of the first ``num_computed_tokens`` tokens.

        Async scheduling calls it once a step's sampled tokens are known.
        """
        rid = request.request_id
        if not self.enable_caching or rid not in self.manager:
            return
        n = min(num_computed_tokens, request.num_tokens)
        self._key(request, n)
        self.manager.commit(rid, n, swap_duplicates=False)

    def free(self, request: Request) -> None:
        """Release a finished or preempted request; its tail block is reused first."""
        rid = request.request_id
        self._lookups.pop(rid, None)
        self._keys.pop(rid, None)
        if rid in self.manager:
            self.manager.abort(rid)

    # --------------------------------------------------------------- queries

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks (its block table)."""
        if request_id not in self.manager:
            return self.empty_kv_cache_blocks
        return self._wrap(self.manager.block_table(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids, per group."""
        if request_id not in self.manager:
            return ([],)
        return ([b + 1 for b in self.manager.block_table(request_id)],)

    def get_block_ids_for_computed_tokens(
        self, request_id: str, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Block ids covering the first ``num_computed_tokens`` tokens."""
        (ids,) = self.get_block_ids(request_id)
        return (ids[: self._blocks_for(num_computed_tokens)],)

    def estimate_cached_tokens(self, request: Request) -> int:
        """Tokens of the request in the prefix cache: its registered (full) blocks."""
        rid = request.request_id
        if rid not in self.manager:
            return 0
        computed = min(self.manager.num_computed_tokens(rid), int(request.num_tokens))
        return computed // self.block_size * self.block_size

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Zero per group: vLLM 0.33 removed cascade attention and answers the same."""
        return [0]

    def truncate_computed_blocks(
        self, blocks: KVCacheBlocks, num_computed_tokens: int
    ) -> KVCacheBlocks:
        """A lookup result cut at a block-aligned ``num_computed_tokens`` (no ref counts)."""
        (group,) = blocks.blocks
        return self.create_kv_cache_blocks((list(group[: num_computed_tokens // self.block_size]),))

    @property
    def usage(self) -> float:
        """Fraction of blocks neither free nor evictable (vLLM's ``BlockPool.get_usage``)."""
        total = self.manager.allocator.num_blocks
        return 1.0 - self._available(None) / total if total else 0.0

    # ------------------------------------------------------------ maintenance

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache; ``False`` (nothing changes) while requests hold blocks."""
        if self.manager.running():
            return False
        self.manager.reset()
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop the cache entries of vLLM block ids (KV connectors' interface)."""
        self.manager.evict_blocks(b - 1 for b in block_ids if b > 0)

    def take_events(self) -> list[Any]:
        """The index's KV events since the last step, as vLLM's own event structs (the
        scheduler publishes them in one ``KVEventBatch``), or none when events are off."""
        events = self.manager.take_events()
        if not events:
            return []
        # prefixkv's structs are vLLM's field for field: a msgpack round trip gives
        # vLLM's own classes, so any consumer of the scheduler sees what it expects.
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        return as_engine_events(events, BlockStored | BlockRemoved | AllBlocksCleared)

    def new_step_starts(self) -> None:
        """Nothing to do per step for one full-attention group."""

    def remove_skipped_blocks(
        self,
        request_id: str,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Full attention skips no blocks."""

    def take_new_block_ids(self) -> list[int]:
        """No block needs zeroing (no Mamba, one precision)."""
        return []

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """No block needs zeroing (no Mamba, one precision)."""

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[KVCacheBlock]]:
        """No copy-on-write copies: hits are whole blocks."""
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """No Mamba boundary states."""
        return {}

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """No Mamba partial tails."""
        return []

    def check_invariants(self) -> None:
        """prefixkv's conservation check (free + held-only + cached == blocks).

        Raises:
            AssertionError: describing the leak or double ownership.
        """
        self.manager.check_invariants()
