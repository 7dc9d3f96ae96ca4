"""vLLM's ``KVCacheManager`` over prefixkv's :class:`CacheManager`: the class that runs in vLLM.

Mirrors ``vllm/v1/core/kv_cache_manager.py`` (0.32 and 0.33) for one full-attention
KV-cache group: every method and attribute vLLM's ``Scheduler``, ``AsyncScheduler`` and
``EngineCore`` use. Engine-free: the block, block-list, prefix-cache-stats and KV-event
types come from :class:`~.engine_types.EngineTypes` (``scheduler.py`` passes vLLM's own;
by default prefixkv's look-alikes), so ``make test`` replays this very class hit for hit
against recordings of vLLM (SPEC VL-1..VL-4).

Block ids are vLLM's: block 0 is the null block, held from the start and never handed
out, so ``num_blocks`` is vLLM's ``num_gpu_blocks`` and ``num_blocks - 1`` blocks hold KV.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Final, cast

from prefixkv.indexes.base import PrefixIndex, describe
from prefixkv.indexes.errors import PrefixKVError, RequestStateError
from prefixkv.indexes.registry import make_index, pool_owned_options
from prefixkv.indexes.tokens import ExtraKey, TokenKey, make_extra_key
from prefixkv.indexes.validation import ceil_div, check_bool, check_count
from prefixkv.storage.allocator import BlockAllocator, Owner

from ..errors import UnsupportedEngineFeatureError
from ..manager import CacheManager, Lookup
from ..observer import CacheObserver
from ..requests import RequestLike
from .engine_types import PREFIXKV_TYPES, Coordinator, EngineTypes

__all__ = ["KVCacheManager"]

_EAGER_BLOCKS: Final = 1 << 16
"""Block objects made at construction; larger pools make the rest as ids are handed out."""
_NO_CAP: Final = 1 << 60
"""``max_model_len`` when none is given: no cap (and a short int, compared fast)."""
_ZERO: Final[object] = 0
"""The int 0 (the counts' default): a count that *is* it is an int 0, told by one pointer
compare where a type test and an unboxed compare cost a few dozen instructions each; an
equal value that is another object (a bool, an IntEnum) takes the checked path."""
_NOT_RUNNING: Final = object()
"""What ``_grow_running`` answers when the checked path must (no blocks: None is "does
not fit")."""


def _field(request: object, name: str) -> Any:
    """``getattr(request, name, None)`` without an ``AttributeError`` for a missing field.

    Compiled, ``getattr`` with a default raises and clears the error for each missing
    field, which cost more than the rest of a lookup's bookkeeping for requests that
    carry only what the manager reads (vLLM's ``Request`` has every field).
    """
    return getattr(request, name) if hasattr(request, name) else None


def _namespace(request: RequestLike) -> ExtraKey | None:
    # vLLM's block-hash extra keys: the LoRA (name and path hashed, int id published in
    # events) in every block, the cache salt in block 0 -- skipped when empty, as
    # vLLM's `if request.cache_salt` skips it. Multimodal inputs and prompt embeddings
    # enter vLLM's hashes too; without them in the key, two requests with the same
    # placeholder tokens would share blocks, so such a request is refused.
    lora = _field(request, "lora_request")
    salt = _field(request, "cache_salt")
    if _field(request, "mm_features") or _field(request, "prompt_embeds") is not None:
        raise UnsupportedEngineFeatureError(
            f"request {request.request_id!r:.80} has multimodal inputs or prompt "
            "embeddings, which prefixkv's vLLM KVCacheManager does not key"
        )
    if lora is None and not salt:
        return None
    return make_extra_key(
        lora=None if lora is None else lora.lora_name,
        lora_path=None if lora is None else lora.lora_path,
        lora_id=None if lora is None else lora.lora_int_id,
        cache_salt=salt if salt else None,
    )


def _prefix_index(index: PrefixIndex | str, caching: bool, block_size: object) -> PrefixIndex:
    # The index a KVCacheManager runs: a registry name built (the 'none' index when
    # caching is off), or the caller's own, which must not cache when caching is off.
    if isinstance(index, str):
        name = index if caching else "none"
        size: Any = 16 if block_size is None else block_size  # make_index checks it
        return make_index(name, block_size=size, **pool_owned_options(name))
    if not caching and describe(index).caches:
        raise PrefixKVError(
            f"enable_caching=False with a {type(index).__name__} that caches: "
            "give the 'none' index or a registry name"
        )
    return index


class KVCacheManager:
    """vLLM's ``KVCacheManager`` on a prefixkv index and block pool.

    Args:
        index: a ``PrefixIndex`` (its ``block_size`` is vLLM's) or a registry name
            (``"hash_chain"`` default).
        num_blocks: vLLM's ``num_gpu_blocks``, the null block 0 included (>= 2).
        block_size: tokens per block when ``index`` is a name (default 16).
        max_model_len: slots are never allocated past it (default: no cap).
        enable_caching: ``False`` looks nothing up (a name then gives the ``"none"``
            index; an index given must be one that caches nothing).
        log_stats: keep ``prefix_cache_stats`` for ``make_prefix_cache_stats``.
        watermark: vLLM's ``SchedulerConfig.watermark``: the fraction of blocks an
            admission leaves free while other requests are scheduled.
        enable_kv_cache_events: record KV events for ``take_events``.
        observers: hooks for the manager (accounting, metrics); see ``observer.py``.
        engine_types: the block, block-list, stats and event types to answer with
            (default prefixkv's; vLLM's inside vLLM).
        kv_cache_spec: the group's spec, for ``coordinator.single_type_managers``.
        kv_cache_config: vLLM's ``KVCacheConfig``, kept as ``kv_cache_config``.

    Not modelled (the scheduler refuses them at start-up): KV-connector loads,
    encoder tokens, hybrid groups (sliding window, Mamba), cached-block reports.
    Thread safety: none; vLLM calls it from its scheduler thread only.
    """

    def __init__(
        self,
        index: PrefixIndex | str = "hash_chain",
        num_blocks: int = 1024,
        block_size: int | None = None,
        *,
        max_model_len: int | None = None,
        enable_caching: bool = True,
        log_stats: bool = False,
        watermark: float = 0.0,
        enable_kv_cache_events: bool = False,
        observers: Sequence[CacheObserver] = (),
        engine_types: EngineTypes = PREFIXKV_TYPES,
        kv_cache_spec: object = None,
        kv_cache_config: object = None,
    ) -> None:
        caching = check_bool("enable_caching", enable_caching)
        index = _prefix_index(index, caching, block_size)
        if not isinstance(engine_types, EngineTypes):
            raise PrefixKVError(f"engine_types must be an EngineTypes, got {engine_types!r:.80}")
        gpu_blocks = check_count("num_blocks", num_blocks, lo=2)
        if type(watermark) is not float or not 0.0 <= watermark < 1.0:
            raise PrefixKVError(f"watermark must be a float in [0, 1), got {watermark!r:.80}")
        self.manager = CacheManager(
            index,
            BlockAllocator(gpu_blocks),
            observers=observers,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        null = self.manager.allocator.allocate(1)
        assert null == [0], null  # a fresh pool hands out block 0 first
        self.block_size: int = index.block_size
        self.max_model_len: int | None = (
            None if max_model_len is None else check_count("max_model_len", max_model_len, lo=1)
        )
        self._slot_cap: int = _NO_CAP if self.max_model_len is None else self.max_model_len
        self.enable_caching = caching
        self.log_stats = check_bool("log_stats", log_stats)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.watermark_blocks = int(watermark * gpu_blocks)
        self.num_kv_cache_groups = 1
        self.mamba_shared_prefix_checkpoint = False
        self.kv_cache_config = kv_cache_config
        self.coordinator = Coordinator(self.block_size, kv_cache_spec)
        self._types = engine_types
        self._make_blocks = engine_types.blocks
        self.prefix_cache_stats: Any = engine_types.prefix_cache_stats() if self.log_stats else None
        # Block objects, one per id, made up front as vLLM's BlockPool makes them; past
        # _EAGER_BLOCKS the rest when first handed out (a pool of millions costs nothing
        # up front). Block 0 is the null block.
        self._block_objects: list[Any] = [engine_types.block(0, True)]
        self._make_block_objects(min(gpu_blocks, _EAGER_BLOCKS) - 1)
        self.empty_kv_cache_blocks: Any = engine_types.blocks(((),))  # immutable, as vLLM's
        # Each request's key, with the request it was made for: an id can come back
        # as another request (after a refusal or an abort) with its own tokens.
        self._keys: dict[Hashable, tuple[object, TokenKey]] = {}
        self._lookups: dict[Hashable, Lookup] = {}

    # ------------------------------------------------------------------ helpers

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[Any], ...]) -> Any:
        """The engine's block list, sharing the one empty answer as vLLM does."""
        if type(blocks) is not tuple:
            raise PrefixKVError(f"blocks must be a tuple of block lists, got {blocks!r:.80}")
        return self._make_blocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def _wrap(self, block_ids: list[int]) -> Any:
        if not block_ids:
            return self.empty_kv_cache_blocks
        try:  # a comprehension fills a list of known size: no append, no bounds check here
            group = [self._block_objects[b] for b in block_ids]
        except IndexError:  # an id past the objects made so far (a pool past _EAGER_BLOCKS)
            self._make_block_objects(max(block_ids))
            group = [self._block_objects[b] for b in block_ids]
        return self._make_blocks((group,))

    def _make_block_objects(self, block_id: int) -> None:
        # At least up to ``block_id``, doubling (a growing pool pays once per block,
        # not once per call), never past the pool.
        objects = self._block_objects
        make = self._types.block
        stop = min(max(block_id + 1, 2 * len(objects)), self.manager.allocator.num_blocks)
        objects.extend([make(i, False) for i in range(len(objects), stop)])

    def _key(self, request: RequestLike) -> TokenKey:
        # One key per request, from its lookup on: its block-hash memo lives as long
        # as the request, like vLLM's Request.block_hashes. Kept for this request
        # object only: another one under the same id gets a key of its own tokens
        # and namespace, validated afresh, and no lookup made for the first.
        rid = request.request_id
        try:
            held = self._keys.get(rid)
        except TypeError:
            raise RequestStateError(f"request id {rid!r:.80} is not hashable") from None
        if held is not None and held[0] is request:
            key = held[1]
            _learn(key, request, request.num_tokens)
            return key
        key = TokenKey(request.all_token_ids, _namespace(request))
        self._keys[rid] = (request, key)
        self._lookups.pop(rid, None)
        return key

    def _available(self, hit: Lookup | None) -> int:
        # Free plus evictable blocks (vLLM's free queue), less the hit's own evictable
        # ones (locking them takes them off the queue); a stale hit raises here.
        index = self.manager.index
        pinned = 0 if hit is None else index.count_evictable(hit.match.handle)
        return self.manager.allocator.num_free_blocks + index.stats().num_evictable_blocks - pinned

    # ------------------------------------------------------------------ lookup

    def prefix_cache_lookup_enabled(self, request: RequestLike) -> bool:
        """Whether a lookup may run (off for prompt-logprob and pooling requests)."""
        return self.enable_caching and not _field(request, "skip_reading_prefix_cache")

    def get_computed_blocks(
        self, request: RequestLike, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int]:
        """The longest cached prefix, capped at ``num_tokens - 1`` (or ``max_cache_hit_length``).

        NOTE: when every token hits, the last one is recomputed for its logits, and
        with block granularity the whole last block is (SPEC BB-1). Locks nothing:
        ``allocate_slots`` takes the hit. O(prompt blocks).

        Returns:
            The hit blocks, the hit length in tokens, and 0 (no shared-prefix
            boundary: there is no sparse-retention group).

        Raises:
            RequestStateError: the request is running already.
            InvalidTokenError: an empty prompt or a bad token id.
        """
        if not self.prefix_cache_lookup_enabled(request):
            return self.empty_kv_cache_blocks, 0, 0
        rid = request.request_id
        if rid in self.manager:
            raise RequestStateError(f"request {rid!r:.80} is running already")
        key = self.manager.make_key(self._key(request))
        cap = len(key) - 1
        if max_cache_hit_length is not None:
            cap = min(cap, check_count("max_cache_hit_length", max_cache_hit_length))
        lookup = Lookup(key, self.manager.index.match_prefix(key, cap))
        self._lookups[rid] = lookup
        return self._wrap(lookup.block_ids), lookup.num_tokens, 0

    def get_computed_blocks_for_connector(
        self, request: RequestLike, max_cache_hit_length: int | None = None
    ) -> tuple[Any, int, int, bool]:
        """``get_computed_blocks`` plus ``hit_diverged=False`` (one group never diverges)."""
        return (*self.get_computed_blocks(request, cast(Any, max_cache_hit_length)), False)

    def record_prefix_cache_stats(self, request: RequestLike, num_hits: int) -> None:
        """Count an admitted lookup, as vLLM does (preempted requests apart)."""
        num_hits = check_count("num_hits", num_hits)
        if self.prefix_cache_stats is None or not self.prefix_cache_lookup_enabled(request):
            return
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=(_field(request, "num_preemptions") or 0) > 0,
        )

    def make_prefix_cache_stats(self) -> Any:
        """Take (and reset) the stats; ``None`` when ``log_stats`` is off."""
        if not self.log_stats:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, self._types.prefix_cache_stats()
        return stats

    # -------------------------------------------------------------- allocation

    def allocate_slots(
        self,
        request: RequestLike,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: object = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> Any:
        """Slots for ``num_new_tokens`` (plus lookahead); registers the full blocks (VL-1, VL-2).

        A waiting request takes its hit from the ``get_computed_blocks`` just before
        (vLLM's admission) and gets slots for the rest; a running one (the next chunk
        of a prefill, or a decode step: O(1) when no block is added) grows. Full
        blocks of the tokens this step computes are registered before the forward
        pass, capped at ``num_tokens``: tokens async scheduling has scheduled but not
        sampled yet are registered later by ``cache_blocks``, as in vLLM (slots stop at
        ``max_model_len``).

        Returns:
            The newly allocated blocks, or ``None`` (nothing changed) when they do
            not fit with ``reserved_blocks`` kept free, and the watermark too for an
            admission while other requests are scheduled.

        Raises:
            PrefixKVError: a count that is not a non-negative int, no tokens at all,
                a hit without its lookup, or KV-connector, delayed-caching or encoder
                tokens (features the scheduler refuses at start-up).
        """
        if (  # a running request's decode step or prefill chunk, O(1) with no new block
            type(num_new_tokens) is int and num_new_tokens > 0
            and num_new_computed_tokens is _ZERO and num_lookahead_tokens is _ZERO
            and reserved_blocks is _ZERO and not self.watermark_blocks
            and num_external_computed_tokens is _ZERO and num_encoder_tokens is _ZERO
            and delay_cache_blocks is False
        ):  # fmt: skip
            grown = self._grow_running(request, num_new_tokens)
            if grown is not _NOT_RUNNING:
                return grown
        return self._allocate_checked(
            request, num_new_tokens, num_new_computed_tokens, num_lookahead_tokens,
            num_external_computed_tokens, delay_cache_blocks, num_encoder_tokens,
            full_sequence_must_fit, reserved_blocks, has_scheduled_reqs,
        )  # fmt: skip

    def _grow_running(self, request: RequestLike, num_new_tokens: int) -> Any:
        """A running request's step with no new computed tokens, lookahead or reserve:
        O(1) when no block is added. ``_NOT_RUNNING`` when the request is not running
        here or the step passes ``max_model_len`` (the checked path answers those)."""
        total = request.num_computed_tokens + num_new_tokens
        if total > self._slot_cap:
            return _NOT_RUNNING
        rid = request.request_id
        mgr = self.manager
        done = mgr.step_if_running(rid, total)  # one lookup of the request, the int unboxed
        if done is None:
            return _NOT_RUNNING
        if done:  # no block to add or register
            return self.empty_kv_cache_blocks
        boxed: Any = total  # boxed once, passed on; the key learns the tokens
        grown = mgr.advance(  # when a block fills, as vLLM hashes them
            rid, boxed, boxed, tokens=request.all_token_ids, swap_duplicates=False
        )
        if grown is None:
            return None
        return self._wrap(grown) if grown else self.empty_kv_cache_blocks

    def _allocate_checked(
        self,
        request: RequestLike,
        num_new_tokens: object,
        num_new_computed_tokens: object,
        num_lookahead_tokens: object,
        num_external_computed_tokens: object,
        delay_cache_blocks: object,
        num_encoder_tokens: object,
        full_sequence_must_fit: object,
        reserved_blocks: object,
        has_scheduled_reqs: object,
    ) -> Any:
        """Everything but the plain step: every argument checked (in signature order, so
        the error names the first wrong one), then an admission, or a running request
        with lookahead slots, blocks to keep free or the slot cap in play. The request's
        tokens, as vLLM lays them out::

            | computed | new computed (hit) | new          | lookahead |
                                            |<- computed this step ->|
                       |<------------ to be allocated -------------->|
            |<-- registered: full blocks, up to num_tokens -->|
        """
        num_new = check_count("num_new_tokens", num_new_tokens)
        num_hit = check_count("num_new_computed_tokens", num_new_computed_tokens)
        lookahead = check_count("num_lookahead_tokens", num_lookahead_tokens)
        reserve = check_count("reserved_blocks", reserved_blocks)
        if (
            num_external_computed_tokens != 0
            or delay_cache_blocks is not False
            or num_encoder_tokens != 0
        ):
            raise PrefixKVError(
                "KV-connector loads, delayed caching and encoder (cross-attention) "
                "tokens are not supported"
            )
        if num_new == 0 and num_hit == 0:
            raise PrefixKVError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        rid = request.request_id
        mgr = self.manager
        total = request.num_computed_tokens + num_hit + num_new
        slots = min(total + lookahead, self._slot_cap)
        total = min(total, slots)
        watermark = 0
        if self.watermark_blocks and self._watermarked(request, has_scheduled_reqs):
            watermark = self.watermark_blocks
        if rid not in mgr:
            full = bool(full_sequence_must_fit)
            return self._admit(request, num_hit, slots, total, full, reserve, watermark)
        if reserve + watermark:  # vLLM refuses even a step that needs no block then
            need = ceil_div(slots, self.block_size) - len(mgr.block_table(rid))
            if max(need, 0) + reserve + watermark > self._available(None):
                return None
        grown = mgr.advance(rid, slots, total, tokens=request.all_token_ids, swap_duplicates=False)
        if grown is None:
            return None
        return self._wrap(grown)

    def _watermarked(self, request: RequestLike, has_scheduled_reqs: object) -> bool:
        # vLLM keeps the watermark free for waiting and preempted requests only, and
        # only while others are scheduled; an admission is one, and so is a running
        # request resumed from waiting (a streaming-input session).
        if not has_scheduled_reqs:
            return False
        if request.request_id not in self.manager:
            return True
        status = _field(_field(request, "status"), "name")
        return status in ("WAITING", "PREEMPTED")

    def _admit(
        self,
        request: RequestLike,
        num_hit: int,
        slots: int,
        total: int,
        full_sequence_must_fit: bool,
        reserve: int,
        watermark: int,
    ) -> Any:
        rid = request.request_id
        mgr = self.manager
        key = mgr.make_key(self._key(request))
        lookup = self._lookups.pop(rid, None)
        if lookup is None or lookup.key is not key or lookup.num_tokens != num_hit:
            if num_hit:
                raise PrefixKVError(
                    f"request {rid!r:.80}: {num_hit} computed tokens without "
                    "a matching get_computed_blocks"
                )
            lookup = Lookup(key, mgr.index.match_prefix(key, 0))  # computes everything
        have = len(lookup.block_ids)
        if reserve or watermark or full_sequence_must_fit or slots > len(key):
            # What CacheManager.admit checks, plus the blocks kept free and vLLM's
            # admission gate: the whole sequence must fit, not just this chunk.
            bs = self.block_size
            whole = ceil_div(min(len(key), self._slot_cap), bs) - have
            need = max(whole if full_sequence_must_fit else 0, ceil_div(slots, bs) - have + reserve)
            # Free blocks alone settle it when they suffice (the available blocks are
            # at least the free ones); the evictable ones are counted only otherwise.
            if need + watermark > mgr.allocator.num_free_blocks:
                available = self._available(lookup)
                if (full_sequence_must_fit and whole + watermark > available) or (
                    ceil_div(slots, bs) - have + reserve + watermark > available
                ):
                    mgr.totals.num_rejected += 1
                    return None
        new = mgr._admit_looked_up(rid, lookup, max(min(slots, len(key)), 1))
        if new is None:
            return None
        if slots > len(key):  # lookahead slots past the prompt
            grown = mgr.advance(rid, slots)
            if grown is None:
                mgr.abort(rid)
                return None
            new += grown
        mgr.commit(rid, min(total, len(key)), swap_duplicates=False)
        return self._wrap(new)

    def cache_blocks(self, request: RequestLike, num_computed_tokens: int) -> None:
        """Register the full blocks of the first ``num_computed_tokens`` tokens.

        Async scheduling calls it once a step's sampled tokens are known (they were
        scheduled before they existed, so ``allocate_slots`` could not register them).
        """
        num_computed_tokens = check_count("num_computed_tokens", num_computed_tokens)
        rid = request.request_id
        if not self.enable_caching or rid not in self.manager:
            return
        key = self._keys[rid][1]
        n = min(num_computed_tokens, request.num_tokens)
        _learn(key, request, n)
        self.manager.commit(rid, n, swap_duplicates=False)

    def free(self, request: RequestLike) -> None:
        """Release a finished or preempted request; its tail block is reused first (HC-7)."""
        rid = request.request_id
        try:
            held = self._keys.pop(rid, None)
        except TypeError:  # unhashable: no request's id
            return
        self._lookups.pop(rid, None)
        mgr = self.manager
        if rid in mgr:
            if mgr.observed:
                self._report_computed(request, None if held is None else held[1])
            mgr.abort(rid)

    def _report_computed(self, request: RequestLike, key: TokenKey | None) -> None:
        # The key learns tokens only when a block fills; tell the manager's observers
        # (nothing else reads it: the request is released next) what the request
        # computed past it, registering nothing: vLLM registers no block at free, and
        # under async scheduling a preempted request may have computed a block whose
        # tokens were never confirmed.
        rid = request.request_id
        mgr = self.manager
        if key is not None:
            _learn(key, request, request.num_tokens)
        done = mgr.num_computed_tokens(rid)
        bs = self.block_size
        computed = min(request.num_computed_tokens, len(mgr.key(rid).tokens))
        computed = min(computed, (done // bs + 1) * bs - 1)
        if computed > done:
            mgr.advance(rid, computed, computed, swap_duplicates=False)

    # --------------------------------------------------------------- queries

    def get_blocks(self, request_id: Hashable) -> Any:
        """The request's blocks (its block table); empty for an unknown request."""
        if request_id not in self.manager:
            return self.empty_kv_cache_blocks
        return self._wrap(self.manager.block_table(request_id))

    def get_block_ids(self, request_id: Hashable) -> tuple[list[int], ...]:
        """The request's block ids, per group."""
        if request_id not in self.manager:
            return ([],)
        return (self.manager.block_table(request_id),)

    def get_block_ids_for_computed_tokens(
        self, request_id: Hashable, num_computed_tokens: int
    ) -> tuple[list[int], ...]:
        """Block ids covering the first ``num_computed_tokens`` tokens."""
        num_computed_tokens = check_count("num_computed_tokens", num_computed_tokens)
        (ids,) = self.get_block_ids(request_id)
        return (ids[: ceil_div(num_computed_tokens, self.block_size)],)

    def estimate_cached_tokens(self, request: RequestLike) -> int:
        """Tokens of the request in the prefix cache: its full computed blocks."""
        rid = request.request_id
        if rid not in self.manager:
            return 0
        computed = min(self.manager.num_computed_tokens(rid), request.num_tokens)
        return computed // self.block_size * self.block_size

    def get_num_common_prefix_blocks(self, running_request_id: Hashable) -> list[int]:
        """Blocks shared by every running request, per group (HC-11).

        vLLM 0.32/0.33 removed cascade attention, answer 0 and never call it; kept
        for schedulers outside vLLM.
        """
        return [self.manager.num_common_prefix_blocks(running_request_id)]

    def truncate_computed_blocks(self, blocks: Any, num_computed_tokens: int) -> Any:
        """A lookup result cut at a block-aligned ``num_computed_tokens`` (no ref counts)."""
        num_computed_tokens = check_count("num_computed_tokens", num_computed_tokens)
        (group,) = blocks.blocks
        return self.create_kv_cache_blocks((list(group[: num_computed_tokens // self.block_size]),))

    @property
    def usage(self) -> float:
        """Fraction of blocks neither free nor evictable (vLLM's ``BlockPool.get_usage``)."""
        return 1.0 - self._available(None) / (self.manager.allocator.num_blocks - 1)

    # ------------------------------------------------------------ maintenance

    def reset_prefix_cache(self) -> bool:
        """Drop the prefix cache; ``False`` (nothing changes) while requests hold blocks."""
        if self.manager.running():
            return False
        self.manager.reset()
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache entries of these blocks (KV connectors, HC-10)."""
        self.manager.evict_blocks(block_ids)

    def take_events(self) -> list[Any]:
        """The KV events since the last call, as the engine's event structs."""
        events = self.manager.take_events()
        return self._types.convert_events(events) if events else []

    def new_step_starts(self) -> None:
        """Nothing to do per step for one full-attention group."""

    def remove_skipped_blocks(
        self,
        request_id: Hashable,
        processed_computed_tokens: int,
        num_prompt_tokens: int | None = None,
    ) -> None:
        """Full attention skips no blocks."""
        check_count("processed_computed_tokens", processed_computed_tokens)
        if num_prompt_tokens is not None:
            check_count("num_prompt_tokens", num_prompt_tokens)

    def take_new_block_ids(self) -> list[int]:
        """No block needs zeroing (no Mamba, one precision)."""
        return []

    def record_blocks_for_zeroing(self, request_id: Hashable, start_token: int) -> None:
        """No block needs zeroing (no Mamba, one precision)."""
        check_count("start_token", start_token)

    def take_kv_cache_block_copies(self) -> tuple[list[Any], list[Any]]:
        """No copy-on-write copies: hits are whole blocks."""
        return [], []

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """No Mamba boundary states."""
        return {}

    def finalize_partial_tail_offloads(self, request: RequestLike) -> list[tuple[int, int, int]]:
        """No Mamba partial tails."""
        return []

    def check_invariants(self) -> None:
        """prefixkv's conservation check, the null block held apart.

        Raises:
            AssertionError: describing the leak or double ownership.
        """
        self.manager.check_invariants()
        owner = self.manager.allocator.owner_of(0)
        assert owner is Owner.CALLER, f"the null block 0 is {owner.name}, not held apart"


def _learn(key: TokenKey, request: RequestLike, num_tokens: int) -> None:
    # The key holds a prefix of the request's tokens; extend it to ``num_tokens``.
    have = len(key.tokens)
    if num_tokens > have:
        key.append(request.all_token_ids[have:num_tokens])
