"""Trace replay with the K-live schedule used to check hit-for-hit fidelity.

Requests are admitted in order and at most K are live; when a request arrives while
K are live, the oldest live one decodes its remaining output one token per step and
finishes. The whole prompt is prefilled in one step and its first output token is
sampled there (SPEC, "Replay used to check fidelity"). A backend is driven through
prefixkv's vLLM ``KVCacheManager`` (the class that runs inside vLLM, as its scheduler
drives it), SGLang's prefix cache (``PrefixCache``, through SGLang's scheduler-side
steps in ``adapters/sglang/simulated``, as SGLang's scheduler drives ``RadixCache``), or the
manager: the classes that run inside the engines.

The replay consumes its requests as a stream: it holds the K live requests and the
cache, never the trace. Per-request results are kept in compact arrays (or not at
all), and each admission can be streamed out as it happens; ``on_step`` marks the end
of every scheduler step (where an engine takes its KV events).
"""

from __future__ import annotations

import contextlib
import gc
import time
from abc import ABC, abstractmethod
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

from prefixkv.indexes.base import PrefixIndex, describe
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.storage.allocator import BlockAllocator

from ..accounting import BoundaryTracker, RequestRecord
from ..events.wire import KVEvent
from ..manager import CacheManager
from ..requests import SimpleReq
from ..sglang import PrefixCache
from ..sglang.simulated import alloc_for_decode, alloc_for_extend
from ..vllm.kv_cache_manager import KVCacheManager
from .sim.seats import SglangSeat, VllmRequest, VllmSeat, make_seat

__all__ = [
    "DRIVERS",
    "HitRow",
    "ReplayError",
    "ReplayInterrupted",
    "ReplayRequest",
    "ReplayResult",
    "replay",
]

Driver = Literal["vllm", "sglang", "manager"]
DRIVERS: tuple[Driver, ...] = ("vllm", "sglang", "manager")


class ReplayRequest(Protocol):
    """One trace line: an id, the prompt, and the tokens decoded after it."""

    @property
    def id(self) -> str:
        """Unique request id."""
        ...

    @property
    def tokens(self) -> Sequence[int]:
        """Prompt token ids."""
        ...

    @property
    def output(self) -> Sequence[int]:
        """Output token ids."""
        ...


class HitRow(NamedTuple):
    """One admission as the reference oracles record it."""

    id: str
    prompt_len: int
    hit_tokens: int


class ReplayError(PrefixKVError):
    """A request could not be allocated even after evicting everything evictable."""


@dataclass
class ReplayResult:
    """What a replay produced.

    Per-request columns are in admission order and empty when the replay was asked
    not to keep them (``keep_per_request=False``); the totals are always there.

    Attributes:
        ids: request ids.
        prompt_len: prompt tokens per request.
        hit_tokens: tokens served from the cache per request.
        matched_tokens: BB-8 matched tokens per request (tracked replays only).
        boundary_lost_tokens: BB-8 block-boundary losses per request (tracked only).
        cap_lost_tokens: BB-8 last-block losses per request (tracked only).
        request_seconds: index time per request (all its calls).
        admit_seconds: the part spent admitting it (lookup, prefill allocation,
            registering the prompt).
        num_requests: requests admitted.
        total_prompt_tokens: their prompt tokens.
        total_hit_tokens: their hit tokens.
        seconds_by_call: summed seconds per call kind.
        evicted_blocks: blocks evicted from the index.
        peak_cached_blocks: the most blocks the index held at once.
        index_memory_bytes: the index structures' size near the peak (sampled).
        wall_seconds: the replay's wall time.
        partial: the replay was interrupted; only admitted requests are counted and
            the live ones did not finish.
    """

    ids: list[str] = field(default_factory=list)
    prompt_len: array[int] = field(default_factory=lambda: array("q"))
    hit_tokens: array[int] = field(default_factory=lambda: array("q"))
    matched_tokens: array[int] = field(default_factory=lambda: array("q"))
    boundary_lost_tokens: array[int] = field(default_factory=lambda: array("q"))
    cap_lost_tokens: array[int] = field(default_factory=lambda: array("q"))
    request_seconds: array[float] = field(default_factory=lambda: array("d"))
    admit_seconds: array[float] = field(default_factory=lambda: array("d"))
    num_requests: int = 0
    total_prompt_tokens: int = 0
    total_hit_tokens: int = 0
    seconds_by_call: dict[str, float] = field(default_factory=dict)
    evicted_blocks: int = 0
    peak_cached_blocks: int = 0
    index_memory_bytes: int = 0
    wall_seconds: float = 0.0
    partial: bool = False

    @property
    def hits(self) -> list[dict[str, Any]]:
        """``{"id", "prompt_len", "hit_tokens"}`` per kept request (the oracle format)."""
        return [
            {"id": i, "prompt_len": p, "hit_tokens": h}
            for i, p, h in zip(self.ids, self.prompt_len, self.hit_tokens, strict=True)
        ]

    @property
    def records(self) -> list[RequestRecord]:
        """Per kept request, the accounting record (BB-8 fields when tracked)."""
        tracked = len(self.matched_tokens) == len(self.ids)
        out = []
        for k, rid in enumerate(self.ids):
            rec = RequestRecord(rid, self.prompt_len[k], self.hit_tokens[k])
            if tracked:
                rec.matched_tokens = self.matched_tokens[k]
                rec.boundary_lost_tokens = self.boundary_lost_tokens[k]
                rec.cap_lost_tokens = self.cap_lost_tokens[k]
            out.append(rec)
        return out

    def summary(self) -> dict[str, Any]:
        """Totals for a result file's last line."""
        prompt, hit = self.total_prompt_tokens, self.total_hit_tokens
        return {
            "requests": self.num_requests,
            "total_prompt_tokens": prompt,
            "total_hit_tokens": hit,
            "hit_ratio": hit / prompt if prompt else 0.0,
            "evicted_blocks": self.evicted_blocks,
            "peak_cached_blocks": self.peak_cached_blocks,
            "seconds_by_call": dict(self.seconds_by_call),
            "seconds_total_in_index": sum(self.seconds_by_call.values()),
            "wall_seconds": self.wall_seconds,
            "partial": self.partial,
        }


class ReplayInterrupted(KeyboardInterrupt):
    """The replay was interrupted (Ctrl-C); ``result`` holds what was finished.

    A ``KeyboardInterrupt``, so code that does not look for it still stops.
    """

    def __init__(self, result: ReplayResult) -> None:
        super().__init__("replay interrupted")
        self.result = result


class _Live:
    """A live request: its position in the trace, the driver's request object, its output."""

    __slots__ = ("output", "position", "request", "seconds")

    def __init__(self, position: int, request: Any, output: Sequence[int], seconds: float) -> None:
        self.position = position
        self.request = request
        self.output = output
        self.seconds = seconds


class _Replayer(ABC):
    """Shared K-live state; subclasses play one scheduler."""

    def __init__(self, index: PrefixIndex, result: ReplayResult, keep: bool) -> None:
        self.index = index
        self.result = result
        self.keep = keep
        self.measure_memory = False
        self.by_call = result.seconds_by_call
        self.live: deque[_Live] = deque()
        self.on_step: Callable[[], object] | None = None
        self.peak_cached = 0
        self.peak_memory = 0
        self._next_measure = 64
        self.tracker: BoundaryTracker | None = None

    def note_size(self) -> None:
        cached = self.index.stats().num_cached_blocks
        if cached > self.peak_cached:
            self.peak_cached = cached
            # memory_bytes walks the index: sample it at geometric steps of the peak
            # (O(log capacity) walks), not at every new peak.
            if self.measure_memory and cached >= self._next_measure:
                measure = getattr(self.index, "memory_bytes", None)
                if measure is not None:
                    self.peak_memory = max(self.peak_memory, int(measure()))
                self._next_measure = cached + cached // 4 + 1

    def fail(self, what: str) -> ReplayError:
        free, total = self.pool_size()
        return ReplayError(
            f"{what} does not fit even after evicting everything evictable: "
            f"{free} free of {total} blocks, {len(self.live)} requests live; "
            "raise the capacity or lower the concurrency"
        )

    @abstractmethod
    def pool_size(self) -> tuple[int, int]:
        """Free and total blocks of the pool."""

    @abstractmethod
    def take_events(self) -> list[KVEvent]:
        """The KV events of the step that just ended."""

    @abstractmethod
    def num_evicted_blocks(self) -> int:
        """Blocks evicted so far."""

    def timed(self, kind: str, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = fn(*args)
        spent = time.perf_counter() - t0
        self.by_call[kind] = self.by_call.get(kind, 0.0) + spent
        return out, spent

    def book(self, kind: str, live: _Live, seconds: float) -> None:
        """Book time measured inline (the decode loops time each call in place, as
        the reference oracles do, so the clock itself costs no extra call)."""
        self.by_call[kind] = self.by_call.get(kind, 0.0) + seconds
        live.seconds += seconds

    def admitted(self, i: int, rid: str, prompt_len: int, hit: int, seconds: float) -> HitRow:
        r = self.result
        r.num_requests += 1
        r.total_prompt_tokens += prompt_len
        r.total_hit_tokens += hit
        if self.keep:
            r.ids.append(rid)
            r.prompt_len.append(prompt_len)
            r.hit_tokens.append(hit)
            r.admit_seconds.append(seconds)
            r.request_seconds.append(seconds)
            if self.tracker is not None:
                rec = self.tracker.record(rid)
                r.matched_tokens.append(rec.matched_tokens)
                r.boundary_lost_tokens.append(rec.boundary_lost_tokens)
                r.cap_lost_tokens.append(rec.cap_lost_tokens)
        return HitRow(rid, prompt_len, hit)

    def stepped(self) -> None:
        """A scheduler step ended: note the cache's size, then call the step hook."""
        self.note_size()
        if self.on_step is not None:
            self.on_step()

    def release(self, live: _Live, kind: str, fn: Callable[[Any], object], req: Any) -> None:
        """Release the finished ``live`` request with ``fn(req)`` (timed as ``kind``);
        the release ends a step."""
        self.note_size()
        _, spent = self.timed(kind, fn, req)
        live.seconds += spent
        if self.keep:
            self.result.request_seconds[live.position] = live.seconds
        if self.on_step is not None:
            self.on_step()

    @abstractmethod
    def admit(self, i: int, rec: ReplayRequest) -> HitRow:
        """Admit and prefill request ``i``; it samples its first output token."""

    @abstractmethod
    def finish_oldest(self) -> None:
        """Decode the oldest live request to its end and release it."""


class _ManagerBacked(_Replayer):
    """A replayer over a ``CacheManager`` (the vLLM ``KVCacheManager``'s, or the manager itself)."""

    def __init__(self, manager: CacheManager, result: ReplayResult, keep: bool) -> None:
        super().__init__(manager.index, result, keep)
        self.manager = manager

    def pool_size(self) -> tuple[int, int]:
        a = self.manager.allocator
        return a.num_free_blocks, a.num_blocks

    def take_events(self) -> list[KVEvent]:
        return self.manager.take_events()

    def num_evicted_blocks(self) -> int:
        return self.manager.totals.num_evicted_blocks


class _VLLMReplayer(_ManagerBacked):
    def __init__(self, kv: KVCacheManager, result: ReplayResult, keep: bool) -> None:
        super().__init__(kv.manager, result, keep)
        self.kv = kv

    def admit_slots(
        self, req: VllmRequest, num_new: int, num_hit: int, blocks: Any, scheduled: bool
    ) -> Any:
        """``allocate_slots`` as vLLM's scheduler calls it for a waiting request."""
        return self.kv.allocate_slots(
            req, num_new, num_hit, blocks, full_sequence_must_fit=True, has_scheduled_reqs=scheduled
        )

    def admit(self, i: int, rec: ReplayRequest) -> HitRow:
        f = self.kv
        rid = str(rec.id)
        req = VllmRequest(rid, rec.tokens)
        (blocks, hit, _), t_lookup = self.timed("lookup", f.get_computed_blocks, req)
        n = req.num_tokens
        # As vLLM's scheduler admits a waiting request: the whole sequence must fit.
        new, t_alloc = self.timed(
            "allocate_prefill", self.admit_slots, req, n - hit, hit, blocks, bool(self.live)
        )
        if new is None:
            raise self.fail(f"prefill of request {rid!r} ({n} tokens, hit {hit})")
        req.num_computed_tokens = n
        row = self.admitted(i, rid, n, hit, t_lookup + t_alloc)
        output = rec.output
        if len(output):
            req.append(output[0])
        self.live.append(_Live(i, req, output, t_lookup + t_alloc))
        self.stepped()
        return row

    def finish_oldest(self) -> None:
        live = self.live.popleft()
        req, output = live.request, live.output
        allocate = self.kv.allocate_slots
        tokens = req.all_token_ids
        perf, spent = time.perf_counter, 0.0
        step = self.on_step
        for k in range(1, len(output)):
            t0 = perf()
            new = allocate(req, 1)
            spent += perf() - t0
            if new is None:
                raise self.fail(f"decode step of request {req.request_id!r}")
            req.num_computed_tokens += 1
            tokens.append(output[k])  # append(), inlined: the decode loop is hot
            req.num_tokens += 1
            if step is not None:
                step()
        self.book("allocate_decode", live, spent)
        self.release(live, "free", self.kv.free, req)  # vLLM: a step of its own


class _SGLangReplayer(_Replayer):
    # A request whose only output token is sampled at prefill finishes in that
    # step and is never live (SGLang); vLLM counts every admitted request as live.

    def __init__(self, cache: PrefixCache, result: ReplayResult, keep: bool) -> None:
        super().__init__(cache.index, result, keep)
        self.cache = cache

    def pool_size(self) -> tuple[int, int]:
        pool = self.cache.pool
        return pool.num_free_blocks, pool.num_blocks

    def take_events(self) -> list[KVEvent]:
        return self.cache.take_events()

    def num_evicted_blocks(self) -> int:
        return self.cache.totals.num_evicted_blocks

    def admit(self, i: int, rec: ReplayRequest) -> HitRow:
        f = self.cache
        rid = str(rec.id)
        req = SimpleReq(rid, rec.tokens)
        sampled: Sequence[int] = rec.output if len(rec.output) else (0,)  # SGLang samples one
        hit, spent = self.timed("alloc_for_extend", alloc_for_extend, f, req)
        if hit is None:
            raise self.fail(f"prefill of request {rid!r} ({len(rec.tokens)} tokens)")
        req.output_ids.append(sampled[0])
        row = self.admitted(i, rid, len(rec.tokens), hit, spent)  # reads the record: first
        if len(sampled) == 1:
            _, t_done = self.timed("cache_finished_req", f.cache_finished_req, req)
        else:
            _, t_done = self.timed("cache_unfinished_req", f.cache_unfinished_req, req)
            self.live.append(_Live(i, req, sampled, spent + t_done))
        if self.keep:
            self.result.admit_seconds[i] += t_done
            self.result.request_seconds[i] += t_done
        self.stepped()
        return row

    def finish_oldest(self) -> None:
        live = self.live.popleft()
        req, sampled = live.request, live.output
        cache = self.cache
        out_ids = req.output_ids
        perf, spent = time.perf_counter, 0.0
        step = self.on_step
        while len(out_ids) < len(sampled):
            t0 = perf()
            ok = alloc_for_decode(cache, req)
            spent += perf() - t0
            if not ok:
                raise self.fail(f"decode step of request {req.rid!r}")
            out_ids.append(sampled[len(out_ids)])
            # The step that samples the last token also releases the request.
            if step is not None and len(out_ids) < len(sampled):
                step()
        self.book("alloc_for_decode", live, spent)
        self.release(live, "cache_finished_req", self.cache.cache_finished_req, req)


class _ManagerReplayer(_ManagerBacked):
    def admit(self, i: int, rec: ReplayRequest) -> HitRow:
        m = self.manager
        rid = str(rec.id)
        adm, t_admit = self.timed("admit", m.admit, rid, rec.tokens)
        if adm is None:
            raise self.fail(f"prefill of request {rid!r} ({len(rec.tokens)} tokens)")
        n = len(rec.tokens)
        _, t_commit = self.timed("commit", m.commit, rid, n)
        row = self.admitted(i, rid, n, adm.hit_tokens, t_admit + t_commit)
        self.live.append(_Live(i, rid, rec.output, t_admit + t_commit))
        self.stepped()
        return row

    def finish_oldest(self) -> None:
        live = self.live.popleft()
        m, rid, output = self.manager, live.request, live.output
        step = self.on_step
        for k in range(len(output) - 1):  # the last sampled token never gets KV
            ok, spent = self.timed("append", m.append, rid, [output[k]])
            live.seconds += spent
            if not ok:
                raise self.fail(f"decode step of request {rid!r}")
            _, spent = self.timed("commit", m.commit, rid, len(m.key(rid)))
            live.seconds += spent
            if step is not None:
                step()
        self.release(live, "finish", m.finish, rid)


def _replayer(
    index: PrefixIndex, num_blocks: int, driver: Driver, track: bool, keep: bool, events: bool
) -> _Replayer:
    result = ReplayResult()
    tracker = None
    if track:
        caches = describe(index).caches
        tracker = BoundaryTracker(index.block_size, caches=caches, keep_records=False)
    observers = [] if tracker is None else [tracker]
    rp: _Replayer
    # The engine classes through the seats every lab run steps through.
    if driver in ("vllm", "sglang"):
        batching = "mixed" if driver == "vllm" else "prefill_first"
        seat = make_seat(batching, index, num_blocks, events=events, observers=observers)
        if isinstance(seat, VllmSeat):
            rp = _VLLMReplayer(seat.kv, result, keep)
        else:
            assert isinstance(seat, SglangSeat), seat
            rp = _SGLangReplayer(seat.cache, result, keep)
    elif driver == "manager":
        mgr = CacheManager(
            index, BlockAllocator(num_blocks), observers=observers, enable_kv_cache_events=events
        )
        rp = _ManagerReplayer(mgr, result, keep)
    else:
        raise PrefixKVError(f"unknown replay driver {driver!r}; known: {', '.join(DRIVERS)}")
    rp.tracker = tracker
    return rp


def replay(
    requests: Iterable[ReplayRequest],
    index: PrefixIndex,
    num_blocks: int,
    *,
    driver: Driver = "manager",
    concurrency: int = 1,
    track_boundaries: bool = False,
    keep_per_request: bool = True,
    measure_memory: bool = False,
    on_admit: Callable[[HitRow], object] | None = None,
    progress: Callable[[int], object] | None = None,
    on_step: Callable[[], object] | None = None,
    on_events: Callable[[list[KVEvent]], object] | None = None,
    guard: contextlib.AbstractContextManager[object] | None = None,
) -> ReplayResult:
    """Replay ``requests`` through ``index`` with at most ``concurrency`` live.

    The requests are consumed one at a time (a generator or a trace source is never
    turned into a list), so memory is the cache, the live requests and, when kept,
    a few numbers per request.

    Args:
        requests: trace requests (``id``, ``tokens``, ``output``), in arrival order.
        index: the backend (fresh; the replay fills it).
        num_blocks: pool size in blocks of ``index.block_size`` tokens.
        driver: ``"vllm"`` (vLLM scheduler order), ``"sglang"`` (SGLang scheduler
            order) or ``"manager"`` (the generic lifecycle).
        concurrency: K, the most live requests.
        track_boundaries: fill the BB-8 columns (matched and lost tokens).
        keep_per_request: keep the per-request columns (``False``: totals only,
            constant memory however long the stream).
        measure_memory: sample the index's ``memory_bytes`` as its peak grows (at
            geometric steps: it walks the index) into ``index_memory_bytes``.
        on_admit: called with each admission's :class:`HitRow`, in admission order
            (stream the oracle file from it).
        progress: called with each admitted request's prompt length.
        on_step: called at the end of every scheduler step, where an engine takes
            its KV events: an admission (prefill), each decode step, and (the vLLM
            driver) a finished request's release; the SGLang driver releases a
            request in the step that samples its last token, as SGLang does.
        on_events: with KV events on (the engine classes' ``enable_kv_cache_events``), called
            at the end of each step that produced events, with the events
            ``take_events()`` returned (what an engine publishes as one batch).
        guard: a reusable context that each admission and its ``on_admit`` call run
            inside (the command line's signal deferral: a Ctrl-C then never falls
            between a request counted and its row written).

    Raises:
        ReplayError: an allocation failed even after evicting everything.
        ReplayInterrupted: Ctrl-C; its ``result`` holds the admitted requests
            (marked ``partial``).
        PrefixKVError: bad arguments.
    """
    if type(concurrency) is not int or concurrency < 1:
        raise PrefixKVError(f"concurrency must be a positive int, got {concurrency!r}")
    rp = _replayer(
        index, num_blocks, driver, track_boundaries, keep_per_request, on_events is not None
    )
    rp.measure_memory = measure_memory
    rp.on_step = on_step
    if on_events is not None:
        take, step = rp.take_events, on_step

        def publish_step() -> None:
            events = take()
            if events:
                on_events(events)
            if step is not None:
                step()

        rp.on_step = publish_step
    result = rp.result
    step_guard: contextlib.AbstractContextManager[object] = (
        contextlib.nullcontext() if guard is None else guard
    )
    collector = _Collector()
    t0 = time.perf_counter()
    try:
        for i, rec in enumerate(requests):
            while len(rp.live) >= concurrency:
                rp.finish_oldest()
            collector.between_requests(i)
            with step_guard:
                row = rp.admit(i, rec)
                if on_admit is not None:
                    on_admit(row)
            if progress is not None:
                progress(row.prompt_len)
        while rp.live:
            rp.finish_oldest()
    except KeyboardInterrupt:
        result.partial = True
        _close(rp, result, t0)
        raise ReplayInterrupted(result) from None
    finally:
        collector.close()
    _close(rp, result, t0)
    return result


class _Collector:
    """The cyclic garbage collector during a replay: off, with a full collection
    between requests every ``EVERY`` admissions.

    A cache holds hundreds of thousands of linked records that live long; with the
    collector on, every few hundred allocations it walks the young ones and every so
    often all of them, a fifth of a replay's time on a long trace. The indexes make
    next to no cyclic garbage per request, so collecting now and then, between
    requests (never inside a timed call), keeps memory bounded as well. Nothing
    changes when the collector was off already (a caller's choice).
    """

    EVERY = 4096

    def __init__(self) -> None:
        self.active = gc.isenabled()
        if self.active:
            gc.disable()

    def between_requests(self, i: int) -> None:
        if self.active and i and i % self.EVERY == 0:
            gc.collect()

    def close(self) -> None:
        if self.active:
            gc.enable()
            self.active = False


def _close(rp: _Replayer, result: ReplayResult, t0: float) -> None:
    result.wall_seconds = time.perf_counter() - t0
    result.evicted_blocks = rp.num_evicted_blocks()
    result.peak_cached_blocks = rp.peak_cached
    result.index_memory_bytes = rp.peak_memory
