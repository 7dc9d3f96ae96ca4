"""Trace replay with the K-live schedule used to check hit-for-hit fidelity.

At most K requests are live; the oldest finishes first; there is no clock (SPEC,
"Replay used to check fidelity"). The schedule is :class:`~.sim.klive.KLive` over a
seat (:mod:`.sim.seats`), the engine class every lab run steps its requests through:
prefixkv's vLLM ``KVCacheManager`` (``driver="vllm"``), its SGLang ``PrefixCache``
(``"sglang"``) or the generic ``CacheManager`` (``"manager"``). :func:`replay` builds
the seat and the schedule and runs the requests as a stream.

A scheduler step ends where an engine takes its KV events: an admission (prefill),
each decode step, and (the vLLM driver) a finished request's release; the SGLang
driver releases a request in the step that samples its last token, as SGLang does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from prefixkv.indexes.base import PrefixIndex, describe

from ..accounting import BoundaryTracker
from ..events.wire import KVEvent
from .sim.klive import (
    DRIVERS,
    Driver,
    HitRow,
    KLive,
    ReplayError,
    ReplayInterrupted,
    ReplayRequest,
    ReplayResult,
    _Collector,
    driver_seat,
)
from .sim.seats import ManagerSeat, SglangSeat, VllmSeat

__all__ = [
    "DRIVERS",
    "Driver",
    "HitRow",
    "ReplayError",
    "ReplayInterrupted",
    "ReplayRequest",
    "ReplayResult",
    "_Collector",
    "replay",
]


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
        on_admit: called with each admission's :class:`HitRow`, in admission order.
        progress: called with each admitted request's prompt length.
        on_step: called at the end of every scheduler step (module docstring).
        on_events: turns KV events on; called at the end of each step that produced
            events, with what ``take_events()`` returned (an engine's one batch).
        guard: a reusable context around each admission and its ``on_admit`` call
            (the command line's signal deferral: no Ctrl-C between the two).

    Raises:
        ReplayError: an allocation failed even after evicting everything.
        ReplayInterrupted: Ctrl-C; its ``result`` holds the admitted requests
            (marked ``partial``).
        PrefixKVError: bad arguments.
    """
    tracker = _boundary_tracker(index) if track_boundaries else None
    seat, step = _observed_seat(driver, index, num_blocks, tracker, on_step, on_events)
    schedule = KLive(
        seat,
        concurrency,
        keep_per_request=keep_per_request,
        tracker=tracker,
        measure_memory=measure_memory,
        on_step=step,
    )
    return schedule.run(requests, on_admit=on_admit, progress=progress, guard=guard)


def _boundary_tracker(index: PrefixIndex) -> BoundaryTracker:
    """Counts the tokens each admission matched and lost, in totals only."""
    caches = describe(index).caches
    return BoundaryTracker(index.block_size, caches=caches, keep_records=False)


def _observed_seat(
    driver: Driver,
    index: PrefixIndex,
    num_blocks: int,
    tracker: BoundaryTracker | None,
    on_step: Callable[[], object] | None,
    on_events: Callable[[list[KVEvent]], object] | None,
) -> tuple[VllmSeat | SglangSeat | ManagerSeat, Callable[[], object] | None]:
    """The driver's seat, observed by ``tracker``, and the step hook (which first hands
    the step's KV events to ``on_events``, when given)."""
    observers = [] if tracker is None else [tracker]
    seat = driver_seat(driver, index, num_blocks, events=on_events is not None, observers=observers)
    step = on_step if on_events is None else _publishing(seat.take_events, on_events, on_step)
    return seat, step


def _publishing(
    take: Callable[[], list[KVEvent]],
    on_events: Callable[[list[KVEvent]], object],
    then: Callable[[], object] | None,
) -> Callable[[], object]:
    """A step hook that hands the step's KV events (if any) to ``on_events``, then
    calls ``then``."""

    def step() -> None:
        events = take()
        if events:
            on_events(events)
        if then is not None:
            then()

    return step
