"""Trace replay with the K-live schedule used to check hit-for-hit fidelity.

At most K requests are live, the oldest finishes first, there is no clock (SPEC,
"Replay used to check fidelity"): :class:`~.sim.klive.KLive` over the seat of the
engine class a driver names (:mod:`.sim.seats`). A scheduler step ends where an engine
takes its KV events: an admission, each decode step, and (vLLM) a finished request's
release; SGLang releases a request in the step that samples its last token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from prefixkv.indexes.base import PrefixIndex, describe

from ..accounting import BoundaryTracker
from ..events.wire import KVEvent
from .sim.klive import Driver, HitRow, KLive, ReplayRequest, ReplayResult, driver_seat

__all__ = ["replay"]


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
    """Replay ``requests`` (consumed one at a time) through a fresh ``index`` of
    ``num_blocks`` blocks with at most ``concurrency`` live, in ``driver``'s order.

    ``track_boundaries`` fills the BB-8 columns; ``keep_per_request=False`` keeps totals
    only; ``measure_memory`` samples the index's memory as its peak grows; ``on_events``
    turns KV events on and gets each step's non-empty batch; ``guard`` is a context
    around each admission and its ``on_admit`` call.

    Args:
        driver: ``"vllm"`` or ``"sglang"`` (that scheduler's order), ``"manager"`` (generic).
        on_admit: called with each admission's :class:`HitRow`, in admission order.
        progress: called with each admitted request's prompt length.
        on_step: called at the end of every scheduler step.

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
