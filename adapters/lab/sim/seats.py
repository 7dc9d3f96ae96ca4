"""A replica's seat: the shipped engine class a schedule steps its requests through.

The lab measures the classes that run inside the engines, never a model of them:

- :class:`VllmSeat` is prefixkv's vLLM ``KVCacheManager``, driven as vLLM 0.33's
  ``Scheduler`` drives it: ``get_computed_blocks`` then ``allocate_slots(...,
  full_sequence_must_fit=True, has_scheduled_reqs=...)`` to admit (vLLM's null
  block, watermark and whole-sequence gate act because the class applies them),
  ``allocate_slots(req, n)`` for each further chunk and decode step (full blocks are
  registered there, before the forward pass), ``free`` to preempt or finish.
- :class:`SglangSeat` is prefixkv's SGLang ``PrefixCache`` on its simulated pools,
  driven as SGLang 0.5.23's scheduler drives ``RadixCache``: its ``PrefillAdder``
  (``adapters.sglang.prefill_adder``) decides a prefill pass, ``alloc_for_extend``
  and ``alloc_for_chunk`` allocate its chunks, ``checkpoint`` after a prefill chunk
  (``cache_unfinished_req``), ``alloc_for_decode`` each decode step,
  ``cache_finished_req`` at the end and ``retract`` when short of pages.

Whether a request fits is the class's answer (``None`` or ``False``, nothing
changed); the seat keeps no copy of an engine's admission rule.

The K-live schedule (:mod:`.klive`) asks each seat for whole requests, in its engine's
own calls and step order, each call timed under its engine's name (:class:`CallTimes`):
``start`` (admit a whole prompt in one step), ``started`` (that step sampled the first
token: is the request still running?), ``decode_rest`` (one decode step per remaining
output token) and ``end`` (release). :class:`ManagerSeat` answers them over prefixkv's
``CacheManager`` (the generic lifecycle, for indexes that model neither engine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

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

from .decode_loops import VllmRequest, sglang_decode, vllm_decode

__all__ = [
    "CallTimes",
    "KLiveSeat",
    "ManagerSeat",
    "Seat",
    "SglangSeat",
    "VllmRequest",
    "VllmSeat",
    "make_seat",
]

_T = TypeVar("_T")


class CallTimes:
    """Seconds per engine call kind, and the seconds of the request being worked on.

    Attributes:
        by_call: summed seconds per call kind (``"lookup"``, ``"alloc_for_decode"``, ...).
        spent: seconds booked since the caller last set it (one request's share).
    """

    __slots__ = ("by_call", "spent")

    def __init__(self, by_call: dict[str, float]) -> None:
        self.by_call = by_call
        self.spent = 0.0

    def call(self, kind: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, its time booked as ``kind``."""
        t0 = time.perf_counter()
        out = fn(*args)
        self.book(kind, time.perf_counter() - t0)
        return out

    def book(self, kind: str, seconds: float) -> None:
        """Book time measured in place (a decode loop times each call inline, as the
        reference oracles do, so the clock itself costs no extra call)."""
        by = self.by_call
        by[kind] = by.get(kind, 0.0) + seconds
        self.spent += seconds


class Seat(Protocol):
    """What every seat answers besides its engine's own steps."""

    index: PrefixIndex
    block_size: int
    num_blocks: int

    @property
    def totals(self) -> CacheTotals:
        """The class's counters (hits, evictions, rejections)."""
        ...

    @property
    def usage(self) -> float:
        """The KV-cache usage its engine reports, in [0, 1] (the engine's own formula)."""
        ...

    def prefilled(self, request_id: str, end: int) -> None:
        """A prefill chunk ending at ``end`` was computed."""
        ...

    def sampled(self, request_id: str, token: int) -> None:
        """A running request sampled ``token`` (its KV is computed next step)."""
        ...

    def finish(self, request_id: str, num_computed: int) -> None:
        """Release a finished request that computed ``num_computed`` tokens."""
        ...

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (empty unless built with events)."""
        ...

    def num_held_blocks(self) -> int:
        """Blocks running requests hold (neither free nor evictable)."""
        ...

    def release(self, request_id: str) -> None:
        """Give a running request's blocks back without caching more (preemption)."""
        ...

    def reset(self) -> None:
        """Drop the whole cache (no request running)."""
        ...

    def check_invariants(self) -> None:
        """The class's invariants."""
        ...


class KLiveSeat(Protocol):
    """What the K-live schedule asks of a seat: whole requests, one step each call."""

    index: PrefixIndex

    @property
    def totals(self) -> CacheTotals:
        """The class's counters (hits, evictions, rejections)."""
        ...

    def start(
        self, request_id: str, tokens: Sequence[int], live: bool, times: CallTimes
    ) -> int | None:
        """Admit the whole prompt in one step (the prefill).

        Args:
            request_id: its id.
            tokens: the prompt.
            live: other requests are live (scheduled in this step).
            times: books each call.

        Returns:
            The hit tokens, or ``None`` (nothing changed) when the class refuses it.
        """
        ...

    def started(self, request_id: str, output: Sequence[int], times: CallTimes) -> bool:
        """The prefill step sampled the first of ``output``: whether the request is
        still running after it."""
        ...

    def decode_rest(
        self,
        request_id: str,
        output: Sequence[int],
        times: CallTimes,
        step: Callable[[], object] | None,
    ) -> bool:
        """Decode the running request's remaining output, one step per token, calling
        ``step`` at the end of each step but a release step; ``False`` when a step's
        slot does not fit (the request stays running)."""
        ...

    def end(self, request_id: str, times: CallTimes) -> None:
        """Release a request that decoded its output."""
        ...

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (empty unless built with events)."""
        ...

    def pool_size(self) -> tuple[int, int]:
        """Free and total blocks of the pool (for an error message)."""
        ...


class _PoolSeat:
    """What every seat reads off its pool (``pool``: the class's free blocks)."""

    pool: PagePool
    index: PrefixIndex
    num_blocks: int

    def pool_size(self) -> tuple[int, int]:
        """Free and total blocks of the pool (for an error message)."""
        pool = self.pool
        return pool.num_free_blocks, pool.num_blocks

    def num_held_blocks(self) -> int:
        """Blocks running requests hold (neither free nor evictable)."""
        free = self.pool.num_free_blocks
        return self.num_blocks - free - self.index.stats().num_evictable_blocks


class VllmSeat(_PoolSeat):
    """prefixkv's vLLM ``KVCacheManager`` as a seat (:func:`make_seat` builds one).

    Args:
        kv: the manager; its pool's block 0 is vLLM's null block.
    """

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.index = kv.manager.index
        self.block_size = self.index.block_size
        self.pool = kv.manager.allocator
        self.num_blocks = self.pool.num_blocks - 1
        self.requests: dict[str, VllmRequest] = {}

    @property
    def totals(self) -> CacheTotals:
        return self.kv.manager.totals

    @property
    def usage(self) -> float:
        """vLLM's ``KVCacheManager.usage`` (``BlockPool.get_usage``): 1 - free / usable
        blocks, evictable cached blocks counting as free, the null block not usable."""
        return self.kv.usage

    def admit(
        self, request_id: str, tokens: Any, budget: int, *, chunked: bool, scheduled: bool
    ) -> tuple[int, int] | None:
        """Admit a waiting request, as ``Scheduler.schedule`` admits one.

        Args:
            request_id: its id.
            tokens: prompt plus the output so far (a resumed request recomputes it).
            budget: the most tokens this step may compute.
            chunked: a prompt may be cut at ``budget`` (else one past it waits).
            scheduled: other requests are scheduled in this step (the watermark).

        Returns:
            The hit tokens and the tokens computed this step, or ``None`` (nothing
            changed) when the class refuses or the prompt waits for a bigger budget.
        """
        req = self.requests.get(request_id)
        if req is None or req.num_tokens != len(tokens):
            req = self.requests[request_id] = VllmRequest(request_id, tokens)
        kv = self.kv
        blocks, hit, _ = kv.get_computed_blocks(req)
        n = req.num_tokens - hit
        if n > budget:
            if not chunked:
                return None
            n = budget
        if self._admit_slots(req, n, hit, blocks, scheduled) is None:
            return None
        req.num_computed_tokens = hit
        return hit, n

    def _admit_slots(
        self, req: VllmRequest, num_new: int, num_hit: int, blocks: Any, scheduled: bool
    ) -> Any:
        """``allocate_slots`` as vLLM's scheduler calls it for a waiting request."""
        return self.kv.allocate_slots(
            req, num_new, num_hit, blocks, full_sequence_must_fit=True, has_scheduled_reqs=scheduled
        )

    def start(
        self, request_id: str, tokens: Sequence[int], live: bool, times: CallTimes
    ) -> int | None:
        """K-live: ``get_computed_blocks`` then ``allocate_slots`` for the whole prompt
        (the whole sequence must fit)."""
        kv = self.kv
        req = VllmRequest(request_id, tokens)
        blocks, hit, _ = times.call("lookup", kv.get_computed_blocks, req)
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
        self,
        request_id: str,
        output: Sequence[int],
        times: CallTimes,
        step: Callable[[], object] | None,
    ) -> bool:
        """K-live: ``allocate_slots(req, 1)`` per remaining token; the free is a step
        of its own."""
        req = self.requests[request_id]
        allocate = self.kv.allocate_slots
        tokens = req.all_token_ids
        perf = time.perf_counter
        if step is None:
            # No hook between steps: the loop is timed once, its few bookkeeping
            # instructions per step booked with the calls (two clock reads a step
            # cost more than the in-place step they timed); it runs compiled where
            # the build is (decode_loops).
            return times.call("allocate_decode", vllm_decode, self.kv, req, output)
        spent = 0.0
        for k in range(1, len(output)):
            t0 = perf()
            new = allocate(req, 1)
            spent += perf() - t0
            if new is None:
                times.book("allocate_decode", spent)
                return False
            req.num_computed_tokens += 1
            tokens.append(output[k])
            req.num_tokens += 1
            step()
        times.book("allocate_decode", spent)
        return True

    def end(self, request_id: str, times: CallTimes) -> None:
        """K-live: ``free`` (vLLM registers nothing there)."""
        times.call("free", self.kv.free, self.requests.pop(request_id))

    def grow(self, request_id: str, num_computed: int, num_new: int) -> bool:
        """Slots for the next ``num_new`` tokens of a running request (a chunk or a
        decode step); ``False`` (nothing changed) when they do not fit."""
        req = self.requests[request_id]
        req.num_computed_tokens = num_computed
        return self.kv.allocate_slots(req, num_new) is not None

    def prefilled(self, request_id: str, end: int) -> None:
        """Nothing to do: ``allocate_slots`` registered the chunk's full blocks."""

    def sampled(self, request_id: str, token: int) -> None:
        """A running request sampled ``token`` (its KV is computed next step)."""
        self.requests[request_id].append(token)

    def finish(self, request_id: str, num_computed: int) -> None:
        """Release a finished request (vLLM registers nothing at ``free``)."""
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
    """prefixkv's SGLang ``PrefixCache`` on its simulated pools as a seat
    (:func:`make_seat` builds one).

    Args:
        cache: the cache (``PrefixCache.create_simulated``); its page size is its
            index's block size.
    """

    def __init__(self, cache: PrefixCache) -> None:
        self.cache = cache
        self.index = cache.index
        self.block_size = self.index.block_size
        self.pool = cache.pool
        self.num_blocks = self.pool.num_blocks
        self.requests: dict[str, SimpleReq] = {}

    @property
    def totals(self) -> CacheTotals:
        return self.cache.totals

    @property
    def usage(self) -> float:
        """SGLang's ``token_usage``: used tokens over ``max_total_num_tokens`` (the
        pool's pages times the page size), evictable cached tokens counting as free."""
        return self.cache.token_usage(self.num_blocks * self.block_size)

    def max_new_tokens(self, prompt_len: int, output_len: int) -> int:
        """The ``max_new_tokens`` SGLang sets on a request's arrival (clipped to what
        the pool holds beside its prompt): what its admission reserves."""
        return init_req_max_new_tokens(
            prompt_len,
            output_len,
            page_size=self.block_size,
            max_total_num_tokens=self.num_blocks * self.block_size,
        )

    def prefill_adder(
        self, running: list[RunningReq], *, rem_input_tokens: int, rem_chunk_tokens: int | None
    ) -> PrefillAdder:
        """A prefill pass's ``PrefillAdder`` over the cache. The lab's requests have
        fixed lengths (SGLang's ``ignore_eos``), so their whole decode is reserved."""
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
        """``alloc_for_extend`` (booked in ``times`` when given; the first
        ``extend_len`` tokens past the hit, when given): the hit tokens, or ``None``
        (nothing changed)."""
        req, cache = SimpleReq(request_id, tokens), self.cache
        if times is None:
            hit = alloc_for_extend(cache, req, extend_len)
        else:
            hit = times.call("alloc_for_extend", alloc_for_extend, cache, req, extend_len)
        if hit is not None:
            self.requests[request_id] = req
        return hit

    def prefilled(self, request_id: str, end: int) -> None:
        """A prefill chunk ending at ``end`` was computed: checkpoint it
        (``cache_unfinished_req``)."""
        self.cache.checkpoint(self.requests[request_id], up_to=end)

    def chunk(self, request_id: str, extend_len: int) -> bool:
        """``alloc_for_chunk``: slots for a chunked prefill's next ``extend_len``
        tokens; ``False`` (nothing changed) when they cannot be had."""
        return alloc_for_chunk(self.cache, self.requests[request_id], extend_len)

    def grow(self, request_id: str) -> bool:
        """``alloc_for_decode``: ``False`` (nothing changed) when no page can be had."""
        return alloc_for_decode(self.cache, self.requests[request_id])

    def sampled(self, request_id: str, token: int) -> None:
        """A running request sampled ``token``."""
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
        """``cache_unfinished_req``; a request whose only output token was sampled
        finishes in this step (``cache_finished_req``) and is never live. An empty
        output is one throw-away token (SGLang samples one)."""
        cache = self.cache
        req = self.requests[request_id]
        req.output_ids.append(output[0] if len(output) else 0)
        if len(output) <= 1:
            times.call(
                "cache_finished_req", cache.cache_finished_req, self.requests.pop(request_id)
            )
            return False
        times.call("cache_unfinished_req", cache.cache_unfinished_req, req)
        return True

    def decode_rest(
        self,
        request_id: str,
        output: Sequence[int],
        times: CallTimes,
        step: Callable[[], object] | None,
    ) -> bool:
        """K-live: ``alloc_for_decode`` per remaining token; the step that samples the
        last token also releases the request, as SGLang does."""
        req = self.requests[request_id]
        cache = self.cache
        out_ids = req.output_ids
        perf, spent = time.perf_counter, 0.0
        if step is None:
            # No hook between steps: timed once, as the vLLM seat's loop is.
            return times.call("alloc_for_decode", sglang_decode, cache, req, output)
        while len(out_ids) < len(output):
            t0 = perf()
            ok = alloc_for_decode(cache, req)
            spent += perf() - t0
            if not ok:
                times.book("alloc_for_decode", spent)
                return False
            out_ids.append(output[len(out_ids)])
            if len(out_ids) < len(output):
                step()
        times.book("alloc_for_decode", spent)
        return True

    def end(self, request_id: str, times: CallTimes) -> None:
        """K-live: ``cache_finished_req``."""
        times.call(
            "cache_finished_req", self.cache.cache_finished_req, self.requests.pop(request_id)
        )

    def take_events(self) -> list[KVEvent]:
        return self.cache.take_events()

    def reset(self) -> None:
        self.cache.reset()

    def check_invariants(self) -> None:
        self.cache.check_invariants(self.requests.values())


class ManagerSeat(_PoolSeat):
    """prefixkv's ``CacheManager`` as a K-live seat: the generic lifecycle (``admit``,
    ``commit``, ``append``, ``finish``) for an index that models neither engine.

    Args:
        manager: the manager.
    """

    def __init__(self, manager: CacheManager) -> None:
        self.manager = manager
        self.index = manager.index
        self.pool = manager.allocator
        self.num_blocks = self.pool.num_blocks

    @property
    def totals(self) -> CacheTotals:
        return self.manager.totals

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
        self,
        request_id: str,
        output: Sequence[int],
        times: CallTimes,
        step: Callable[[], object] | None,
    ) -> bool:
        """``append`` and ``commit`` each output token but the last (it never gets KV);
        the finish is a step of its own."""
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


def make_seat(
    batching: str,
    index: PrefixIndex,
    num_blocks: int,
    *,
    events: bool = False,
    observers: Sequence[CacheObserver] = (),
) -> Seat:
    """The seat of a batching, over ``num_blocks`` usable blocks of ``index``.

    Args:
        batching: ``"mixed"`` gives vLLM's ``KVCacheManager`` (its null block 0 on
            top of the usable blocks), ``"prefill_first"`` SGLang's ``PrefixCache``.
        index: the (empty) prefix index.
        num_blocks: usable blocks (pages).
        events: record KV events for ``take_events``.
        observers: the class's observers (accounting, boundary tracking).
    """
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
