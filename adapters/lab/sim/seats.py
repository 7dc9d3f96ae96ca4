"""A replica's seat: the shipped engine class a schedule steps its requests through.

:class:`VllmSeat` drives vLLM's ``KVCacheManager`` as vLLM 0.33's ``Scheduler`` does,
:class:`SglangSeat` SGLang's ``PrefixCache`` as SGLang 0.5.23's scheduler does. Whether
a request fits is the class's answer (``None`` or ``False``, nothing changed): the seat
keeps no copy of an engine's admission rule. K-live calls are timed per engine call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from prefixkv.adapters.events.wire import KVEvent
from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.observer import CacheObserver
from prefixkv.adapters.requests import SimpleReq
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.sglang.pools import PagePool
from prefixkv.adapters.sglang.prefill_adder import (
    AddReqResult,
    PrefillAdder,
    RunningReq,
    init_req_max_new_tokens,
)
from prefixkv.adapters.sglang.simulated import (
    alloc_for_chunk,
    alloc_for_decode,
    alloc_for_extend,
    retract,
)
from prefixkv.adapters.totals import CacheTotals
from prefixkv.adapters.vllm.kv_cache_manager import KVCacheManager
from prefixkv.indexes.base import PrefixIndex

from .decode_loops import DecodeStep, VllmRequest, sglang_decode, vllm_decode

__all__ = ["CallTimes", "KLiveSeat", "ManagerSeat", "Seat", "SglangSeat", "VllmSeat", "make_seat"]

_T = TypeVar("_T")


@dataclass(slots=True)
class CallTimes:
    """Seconds per engine call kind (``by_call``) and those booked since the caller last
    set ``spent`` (one request's share)."""

    by_call: dict[str, float]
    spent: float = 0.0

    def call(self, kind: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, its time booked as ``kind``."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:  # an interrupted call books what it spent, so a hook's take-back never wins
            self.book(kind, time.perf_counter() - t0)

    def book(self, kind: str, seconds: float) -> None:
        """Book ``seconds`` as ``kind``."""
        self.by_call[kind] = self.by_call.get(kind, 0.0) + seconds
        self.spent += seconds

    def untimed(self, kind: str, step: DecodeStep | None) -> DecodeStep | None:
        """``step`` with its own seconds taken back off ``kind`` (a hook that runs inside
        a call timed as ``kind``)."""
        if step is None:
            return None

        def untimed_step() -> None:
            t0 = time.perf_counter()
            try:
                step()
            finally:
                self.book(kind, t0 - time.perf_counter())

        return untimed_step


class _PoolSeat:
    """What every seat reads off its engine class: its index, pool and totals."""

    def __init__(
        self, index: PrefixIndex, pool: PagePool, totals: CacheTotals, num_blocks: int
    ) -> None:
        self.index = index
        self.block_size = index.block_size
        self.pool = pool
        self.totals = totals
        self.num_blocks = num_blocks

    def pool_size(self) -> tuple[int, int]:
        """Free and total blocks of the pool."""
        return self.pool.num_free_blocks, self.pool.num_blocks

    def num_held_blocks(self) -> int:
        """Blocks running requests hold (neither free nor evictable)."""
        evictable = self.index.stats().num_evictable_blocks
        return self.num_blocks - self.pool.num_free_blocks - evictable


class VllmSeat(_PoolSeat):
    """prefixkv's vLLM ``KVCacheManager`` as a seat (its block 0 is vLLM's null block)."""

    def __init__(self, kv: KVCacheManager) -> None:
        m = kv.manager
        super().__init__(m.index, m.allocator, m.totals, m.allocator.num_blocks - 1)
        self.kv = kv
        self.requests: dict[str, VllmRequest] = {}

    @property
    def usage(self) -> float:
        """vLLM's ``KVCacheManager.usage``."""
        return self.kv.usage

    def admit(
        self, request_id: str, tokens: Any, budget: int, *, chunked: bool, scheduled: bool
    ) -> tuple[int, int] | None:
        """Admit a waiting request as ``Scheduler.schedule`` does, at most ``budget``
        tokens (past it only when ``chunked``): the hit and the tokens computed, or
        ``None`` (nothing changed)."""
        req = self.requests.get(request_id)
        if req is None or req.num_tokens != len(tokens):
            req = self.requests[request_id] = VllmRequest(request_id, tokens)
        blocks, hit, _ = self.kv.get_computed_blocks(req)
        n = req.num_tokens - hit
        if n > budget and not chunked:
            return None
        n = min(n, budget)
        if self._admit_slots(req, n, hit, blocks, scheduled) is None:
            return None
        req.num_computed_tokens = hit
        return hit, n

    def _admit_slots(
        self, req: VllmRequest, num_new: int, num_hit: int, blocks: Any, scheduled: bool
    ) -> Any:
        return self.kv.allocate_slots(
            req, num_new, num_hit, blocks, full_sequence_must_fit=True, has_scheduled_reqs=scheduled
        )

    def start(
        self, request_id: str, tokens: Sequence[int], live: bool, times: CallTimes
    ) -> int | None:
        """K-live: ``get_computed_blocks`` then ``allocate_slots`` for the whole prompt."""
        req = VllmRequest(request_id, tokens)
        blocks, hit, _ = times.call("lookup", self.kv.get_computed_blocks, req)
        n = req.num_tokens
        new = times.call("allocate_prefill", self._admit_slots, req, n - hit, hit, blocks, live)
        if new is None:
            return None
        req.num_computed_tokens = n
        self.requests[request_id] = req
        return int(hit)

    def started(self, request_id: str, output: Sequence[int], times: CallTimes) -> bool:
        """Every admitted request is live until its free."""
        if len(output):
            self.requests[request_id].append(output[0])
        return True

    def decode_rest(
        self, request_id: str, output: Sequence[int], times: CallTimes, step: DecodeStep | None
    ) -> bool:
        """K-live: ``allocate_slots(req, 1)`` per remaining token."""
        kind = "allocate_decode"
        req, hook = self.requests[request_id], times.untimed(kind, step)
        return times.call(kind, vllm_decode, self.kv, req, output, hook)

    def end(self, request_id: str, times: CallTimes) -> None:
        """K-live: ``free`` (vLLM registers nothing there)."""
        times.call("free", self.kv.free, self.requests.pop(request_id))

    def grow(self, request_id: str, num_computed: int, num_new: int) -> bool:
        """Slots for a running request's next ``num_new`` tokens (``False``: no fit)."""
        req = self.requests[request_id]
        req.num_computed_tokens = num_computed
        return self.kv.allocate_slots(req, num_new) is not None

    def prefilled(self, request_id: str, end: int) -> None:
        """Nothing to do: ``allocate_slots`` registered the chunk's full blocks."""

    def sampled(self, request_id: str, token: int) -> None:
        """A running request sampled ``token`` (its KV is computed next step)."""
        self.requests[request_id].append(token)

    def finish(self, request_id: str, num_computed: int) -> None:
        """Release a finished request that computed ``num_computed`` tokens (``free``)."""
        req = self.requests.pop(request_id)
        req.num_computed_tokens = num_computed
        self.kv.free(req)

    def release(self, request_id: str) -> None:
        req = self.requests[request_id]
        self.kv.free(req)
        req.num_computed_tokens = 0

    def take_events(self) -> list[KVEvent]:
        return self.kv.take_events()

    def reset(self) -> None:
        self.kv.reset_prefix_cache()

    def check_invariants(self) -> None:
        self.kv.check_invariants()


class SglangSeat(_PoolSeat):
    """prefixkv's SGLang ``PrefixCache`` on its simulated pools as a seat."""

    def __init__(self, cache: PrefixCache) -> None:
        super().__init__(cache.index, cache.pool, cache.totals, cache.pool.num_blocks)
        self.cache = cache
        self.requests: dict[str, SimpleReq] = {}

    @property
    def usage(self) -> float:
        """SGLang's ``token_usage``."""
        return self.cache.token_usage(self.num_blocks * self.block_size)

    def max_new_tokens(self, prompt_len: int, output_len: int) -> int:
        """The ``max_new_tokens`` SGLang sets on a request's arrival (clipped to the pool)."""
        return init_req_max_new_tokens(
            prompt_len,
            output_len,
            page_size=self.block_size,
            max_total_num_tokens=self.num_blocks * self.block_size,
        )

    def prefill_adder(
        self, running: list[RunningReq], *, rem_input_tokens: int, rem_chunk_tokens: int | None
    ) -> PrefillAdder:
        """A prefill pass's ``PrefillAdder``; fixed lengths (``ignore_eos``) reserve all."""
        return PrefillAdder(
            self.cache,
            running,
            new_token_ratio=1.0,
            rem_input_tokens=rem_input_tokens,
            rem_chunk_tokens=rem_chunk_tokens,
        )

    def add_one_req(
        self,
        adder: PrefillAdder,
        request_id: str,
        tokens: Any,
        max_new_tokens: int,
        num_output: int,
    ) -> AddReqResult:
        """Match a waiting request (``init_next_round_input``), then ask ``adder``."""
        match = self.cache.match_prefix(tokens, max_prefix_len=len(tokens) - 1)
        return adder.add_one_req(
            request_id, len(tokens), match.prefix_len, match.last_node, max_new_tokens, num_output
        )

    def admit(
        self,
        request_id: str,
        tokens: Any,
        times: CallTimes | None = None,
        extend_len: int | None = None,
    ) -> int | None:
        """``alloc_for_extend`` (of ``extend_len`` tokens past the hit when given): the hit
        tokens, or ``None`` (nothing changed)."""
        req, cache = SimpleReq(request_id, tokens), self.cache
        if times is None:
            hit = alloc_for_extend(cache, req, extend_len)
        else:
            hit = times.call("alloc_for_extend", alloc_for_extend, cache, req, extend_len)
        if hit is not None:
            self.requests[request_id] = req
        return hit

    def prefilled(self, request_id: str, end: int) -> None:
        """Checkpoint a computed prefill chunk (``cache_unfinished_req``)."""
        self.cache.checkpoint(self.requests[request_id], up_to=end)

    def chunk(self, request_id: str, extend_len: int) -> bool:
        """``alloc_for_chunk`` for a chunked prefill's next ``extend_len`` tokens."""
        return alloc_for_chunk(self.cache, self.requests[request_id], extend_len)

    def grow(self, request_id: str) -> bool:
        """``alloc_for_decode`` (``False``: no page, nothing changed)."""
        return alloc_for_decode(self.cache, self.requests[request_id])

    def sampled(self, request_id: str, token: int) -> None:
        """A running request sampled ``token`` (its KV is computed next step)."""
        self.requests[request_id].output_ids.append(token)

    def finish(self, request_id: str, num_computed: int) -> None:
        """``cache_finished_req``: insert what it computed, release it."""
        self.cache.cache_finished_req(self.requests.pop(request_id))

    def release(self, request_id: str) -> None:
        retract(self.cache, self.requests.pop(request_id))

    def start(
        self, request_id: str, tokens: Sequence[int], live: bool, times: CallTimes
    ) -> int | None:
        """K-live: ``alloc_for_extend``."""
        return self.admit(request_id, tokens, times)

    def started(self, request_id: str, output: Sequence[int], times: CallTimes) -> bool:
        """``cache_unfinished_req``, or ``cache_finished_req`` when its only output token
        was sampled (an empty output samples one throw-away token)."""
        req = self.requests[request_id]
        req.output_ids.append(output[0] if len(output) else 0)
        if len(output) <= 1:
            self.end(request_id, times)
            return False
        times.call("cache_unfinished_req", self.cache.cache_unfinished_req, req)
        return True

    def decode_rest(
        self, request_id: str, output: Sequence[int], times: CallTimes, step: DecodeStep | None
    ) -> bool:
        """K-live: ``alloc_for_decode`` per remaining token (the last step releases)."""
        kind = "alloc_for_decode"
        req, hook = self.requests[request_id], times.untimed(kind, step)
        return times.call(kind, sglang_decode, self.cache, req, output, hook)

    def end(self, request_id: str, times: CallTimes) -> None:
        """K-live: ``cache_finished_req``."""
        req = self.requests.pop(request_id)
        times.call("cache_finished_req", self.cache.cache_finished_req, req)

    def take_events(self) -> list[KVEvent]:
        return self.cache.take_events()

    def reset(self) -> None:
        self.cache.reset()

    def check_invariants(self) -> None:
        self.cache.check_invariants(self.requests.values())


class ManagerSeat(_PoolSeat):
    """prefixkv's generic ``CacheManager`` as a K-live seat."""

    def __init__(self, manager: CacheManager) -> None:
        pool = manager.allocator
        super().__init__(manager.index, pool, manager.totals, pool.num_blocks)
        self.manager = manager

    def start(
        self, request_id: str, tokens: Sequence[int], live: bool, times: CallTimes
    ) -> int | None:
        """``admit`` then ``commit`` the whole prompt."""
        m = self.manager
        adm = times.call("admit", m.admit, request_id, tokens)
        if adm is None:
            return None
        times.call("commit", m.commit, request_id, len(tokens))
        return adm.hit_tokens

    def started(self, request_id: str, output: Sequence[int], times: CallTimes) -> bool:
        """Every admitted request is live until its finish."""
        return True

    def decode_rest(
        self, request_id: str, output: Sequence[int], times: CallTimes, step: DecodeStep | None
    ) -> bool:
        """``append`` and ``commit`` each output token but the last (it gets no KV)."""
        m = self.manager
        for k in range(len(output) - 1):
            if not times.call("append", m.append, request_id, [output[k]]):
                return False
            times.call("commit", m.commit, request_id, len(m.key(request_id)))
            if step is not None:
                step()
        return True

    def end(self, request_id: str, times: CallTimes) -> None:
        """``finish``: register what has KV, release."""
        times.call("finish", self.manager.finish, request_id)

    def take_events(self) -> list[KVEvent]:
        return self.manager.take_events()


Seat = VllmSeat | SglangSeat
"""A seat of the arrival-time schedules."""
KLiveSeat = VllmSeat | SglangSeat | ManagerSeat
"""A seat of ``replay``'s K-live schedule: ``start`` admits a whole prompt in one step
(the hit, or ``None``: nothing changed; ``live``: others run in the step); ``started``:
it still runs after sampling its first token; ``decode_rest`` decodes the rest, calling
``step`` after each step but a release (``False``: a slot did not fit, the request stays
running); ``end`` releases it."""


def make_seat(
    batching: str,
    index: PrefixIndex,
    num_blocks: int,
    *,
    events: bool = False,
    observers: Sequence[CacheObserver] = (),
) -> Seat:
    """The seat of a batching (``"mixed"``: vLLM's class, with its null block on top of
    ``num_blocks``; else SGLang's) over ``num_blocks`` usable blocks of ``index``."""
    if batching == "mixed":
        kv = KVCacheManager(
            index, num_blocks + 1, enable_kv_cache_events=events, observers=observers
        )
        return VllmSeat(kv)
    capacity = num_blocks * index.block_size
    cache = PrefixCache.create_simulated(
        index, capacity, enable_kv_cache_events=events, observers=observers
    )
    return SglangSeat(cache)
