"""Trace replay with the K-live schedule used to check hit-for-hit fidelity.

At most K requests are live, the oldest finishes first, there is no clock (SPEC,
"Replay used to check fidelity"): a prompt is prefilled whole in one step that samples
its first token; when a request arrives while K are live, the oldest decodes the rest,
one token a step, and finishes. :class:`KLive` steps them through the seat of the engine
class a driver names (:mod:`.sim.seats`). A scheduler step ends where an engine takes its
KV events: an admission, each decode step, and (vLLM) a finished request's release;
SGLang releases a request in the step that samples its last token. Requests are
streamed, results kept in compact arrays (or not at all).
"""

from __future__ import annotations

import contextlib
import gc
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from prefixkv.indexes.base import PrefixIndex, describe
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.storage.allocator import BlockAllocator

from ..accounting import BoundaryTracker, RequestRecord
from ..events.wire import KVEvent
from ..manager import CacheManager
from ..observer import CacheObserver
from .sim.seats import CallTimes, KLiveSeat, ManagerSeat, SglangSeat, VllmSeat, make_seat

if TYPE_CHECKING:
    from .traces import TraceRequest

__all__ = [
    "DRIVERS",
    "Driver",
    "HitRow",
    "KLive",
    "ReplayError",
    "ReplayInterrupted",
    "ReplayResult",
    "driver_seat",
    "replay",
]

Driver = Literal["vllm", "sglang", "manager"]
DRIVERS: tuple[Driver, ...] = ("vllm", "sglang", "manager")


class HitRow(NamedTuple):
    """One admission as the reference oracles record it."""

    id: str
    prompt_len: int
    hit_tokens: int


class ReplayError(PrefixKVError):
    """A request could not be allocated even after evicting everything evictable."""


@dataclass
class ReplayResult:
    """What a replay produced: per-request columns in admission order (when kept) and
    the totals; ``partial``: interrupted, only admitted requests counted.

    Attributes:
        matched_tokens, boundary_lost_tokens, cap_lost_tokens: the BB-8 columns, filled
            only with a tracker.
        request_seconds: all index calls of the request.
        admit_seconds: its admission: lookup, prefill allocation and registration.
        index_memory_bytes: the index's memory sampled near the peak; only with ``measure_memory``.
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
        """``{"id", "prompt_len", "hit_tokens"}`` per kept request (the oracles' format)."""
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
    """The replay was interrupted (Ctrl-C); ``result`` holds what was finished."""

    def __init__(self, result: ReplayResult) -> None:
        super().__init__("replay interrupted")
        self.result = result


def driver_seat(
    driver: Driver,
    index: PrefixIndex,
    num_blocks: int,
    *,
    events: bool = False,
    observers: Sequence[CacheObserver] = (),
) -> VllmSeat | SglangSeat | ManagerSeat:
    """The seat a driver replays through (``"manager"``: the generic ``CacheManager``).

    Raises:
        PrefixKVError: an unknown driver.
    """
    if driver not in DRIVERS:
        raise PrefixKVError(f"unknown replay driver {driver!r}; known: {', '.join(DRIVERS)}")
    with _collector_off():
        if driver == "manager":
            allocator = BlockAllocator(num_blocks)
            return ManagerSeat(
                CacheManager(index, allocator, observers=observers, enable_kv_cache_events=events)
            )
        batching = "mixed" if driver == "vllm" else "prefill_first"
        return make_seat(batching, index, num_blocks, events=events, observers=observers)


@dataclass(slots=True)
class _Live:
    position: int
    request_id: str
    output: Sequence[int]
    seconds: float


class KLive:
    """At most ``concurrency`` requests live over one seat, the oldest finishing first.
    ``keep_per_request=False`` keeps totals only (constant memory); ``tracker`` fills the
    BB-8 columns; ``measure_memory`` samples the index's size as its peak grows;
    ``on_step`` is called at the end of every scheduler step.

    Raises:
        PrefixKVError: a concurrency that is not a positive int.
    """

    def __init__(
        self,
        seat: KLiveSeat,
        concurrency: int,
        *,
        keep_per_request: bool = True,
        tracker: BoundaryTracker | None = None,
        measure_memory: bool = False,
        on_step: Callable[[], object] | None = None,
    ) -> None:
        if type(concurrency) is not int or concurrency < 1:
            raise PrefixKVError(f"concurrency must be a positive int, got {concurrency!r}")
        self.seat = seat
        self.index = seat.index
        self.concurrency = concurrency
        self.keep = keep_per_request
        self.tracker = tracker
        self.measure_memory = measure_memory
        self.on_step = on_step
        self.result = ReplayResult()
        self.times = CallTimes(self.result.seconds_by_call)
        self.live: deque[_Live] = deque()
        self._next_measure = 64

    def run(
        self,
        requests: Iterable[TraceRequest],
        *,
        on_admit: Callable[[HitRow], object] | None = None,
        progress: Callable[[int], object] | None = None,
        guard: contextlib.AbstractContextManager[object] | None = None,
    ) -> ReplayResult:
        """Run ``requests`` to their end; ``on_admit`` gets each admission's row,
        ``progress`` its prompt length, and each admission runs inside ``guard``.

        Raises:
            ReplayError: a step did not fit even after evicting everything evictable.
            ReplayInterrupted: Ctrl-C; its ``result`` holds the admitted requests.
        """
        result = self.result
        step_guard: contextlib.AbstractContextManager[object] = (
            contextlib.nullcontext() if guard is None else guard
        )
        t0 = time.perf_counter()
        with _collector_off() as collect:
            try:
                for i, rec in enumerate(requests):
                    while len(self.live) >= self.concurrency:
                        self.finish_oldest()
                    if collect and i and i % COLLECT_EVERY == 0:
                        gc.collect()
                    with step_guard:
                        row = self.admit(i, rec)
                        if on_admit is not None:
                            on_admit(row)
                    if progress is not None:
                        progress(row.prompt_len)
                while self.live:
                    self.finish_oldest()
            except KeyboardInterrupt:
                result.partial = True
                self._close(t0)
                raise ReplayInterrupted(result) from None
        self._close(t0)
        return result

    def admit(self, i: int, rec: TraceRequest) -> HitRow:
        """Admit and prefill request ``i`` in one step; it samples its first token."""
        seat, times, r = self.seat, self.times, self.result
        rid = str(rec.id)
        prompt_len = len(rec.tokens)
        times.spent = 0.0
        hit = seat.start(rid, rec.tokens, bool(self.live), times)
        if hit is None:
            raise self._fail(f"prefill of request {rid!r} ({prompt_len} tokens)")
        r.num_requests += 1
        r.total_prompt_tokens += prompt_len
        r.total_hit_tokens += hit
        if self.keep:
            r.ids.append(rid)
            r.prompt_len.append(prompt_len)
            r.hit_tokens.append(hit)
            if self.tracker is not None:  # read before the step can finish the request
                rec_b = self.tracker.record(rid)
                r.matched_tokens.append(rec_b.matched_tokens)
                r.boundary_lost_tokens.append(rec_b.boundary_lost_tokens)
                r.cap_lost_tokens.append(rec_b.cap_lost_tokens)
        output = rec.output
        if seat.started(rid, output, times):
            self.live.append(_Live(i, rid, output, times.spent))
        if self.keep:
            r.admit_seconds.append(times.spent)
            r.request_seconds.append(times.spent)
        self._note_size()
        if self.on_step is not None:
            self.on_step()
        return HitRow(rid, prompt_len, hit)

    def finish_oldest(self) -> None:
        """Decode the oldest live request to its end and release it."""
        live = self.live.popleft()
        seat, times, rid = self.seat, self.times, live.request_id
        times.spent = live.seconds
        if not seat.decode_rest(rid, live.output, times, self.on_step):
            raise self._fail(f"decode step of request {rid!r}")
        self._note_size()
        seat.end(rid, times)  # the release ends a step
        if self.keep:
            self.result.request_seconds[live.position] = times.spent
        if self.on_step is not None:
            self.on_step()

    def _note_size(self) -> None:
        cached, r = self.index.stats().num_cached_blocks, self.result
        if cached > r.peak_cached_blocks:
            r.peak_cached_blocks = cached
            # memory_bytes walks the index: sample at geometric steps of the peak.
            if self.measure_memory and cached >= self._next_measure:
                measure = getattr(self.index, "memory_bytes", None)
                if measure is not None:
                    r.index_memory_bytes = max(r.index_memory_bytes, int(measure()))
                self._next_measure = cached + cached // 4 + 1

    def _fail(self, what: str) -> ReplayError:
        free, total = self.seat.pool_size()
        return ReplayError(
            f"{what} does not fit even after evicting everything evictable: "
            f"{free} free of {total} blocks, {len(self.live)} requests live; "
            "raise the capacity or lower the concurrency"
        )

    def _close(self, t0: float) -> None:
        self.result.wall_seconds = time.perf_counter() - t0
        self.result.evicted_blocks = self.seat.totals.num_evicted_blocks


COLLECT_EVERY = 4096
"""Admissions between the full collections of a replay (its collector is off)."""


@contextlib.contextmanager
def _collector_off() -> Iterator[bool]:
    """The cyclic collector off (it would walk the cache's long-lived records, and vLLM's
    class makes a block object per pool block up front); yields whether it was on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield was_on
    finally:
        if was_on:
            gc.enable()


def replay(
    requests: Iterable[TraceRequest],
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
    """Replay ``requests`` (consumed one at a time) through a fresh ``index`` of
    ``num_blocks`` blocks with at most ``concurrency`` live, through ``driver``'s engine
    class (``"manager"``: the generic ``CacheManager``); the rest as :class:`KLive` takes
    it. ``track_boundaries`` fills the BB-8 columns; ``on_events`` turns KV events on and
    gets each step's non-empty batch; ``on_admit`` gets each admission's :class:`HitRow`
    and runs with it inside ``guard``; ``progress`` gets its prompt length.

    Raises:
        ReplayError: an allocation failed even after evicting everything.
        ReplayInterrupted: Ctrl-C; its ``result`` holds the admitted requests.
        PrefixKVError: bad arguments (concurrency, driver, num_blocks).
    """
    tracker = None
    if track_boundaries:
        caches = describe(index).caches
        tracker = BoundaryTracker(index.block_size, caches=caches, keep_records=False)
    observers = [] if tracker is None else [tracker]
    seat = driver_seat(driver, index, num_blocks, events=on_events is not None, observers=observers)
    step = on_step if on_events is None else _publishing(seat.take_events, on_events, on_step)
    schedule = KLive(
        seat,
        concurrency,
        keep_per_request=keep_per_request,
        tracker=tracker,
        measure_memory=measure_memory,
        on_step=step,
    )
    return schedule.run(requests, on_admit=on_admit, progress=progress, guard=guard)


def _publishing(
    take: Callable[[], list[KVEvent]],
    on_events: Callable[[list[KVEvent]], object],
    then: Callable[[], object] | None,
) -> Callable[[], object]:
    """A step hook that hands the step's KV events (if any) to ``on_events``, then ``then``."""

    def step() -> None:
        events = take()
        if events:
            on_events(events)
        if then is not None:
            then()

    return step
