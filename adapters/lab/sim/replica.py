"""Arrival-time replay of one engine replica: a discrete-event loop in virtual time.

A :class:`Replica` is a seat, the schedule over it and a cost profile on a clock:
while busy, steps run back to back; while idle, the clock jumps to the next arrival.
Sessions replay closed loop (a turn is sent once the one it follows finished plus its
think time). Nothing reads the wall clock: a run is a pure function of its inputs.
"""

from __future__ import annotations

import heapq
import itertools
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from prefixkv.adapters.servable import unservable
from prefixkv.indexes.base import PrefixIndex, SupportsEventSink
from prefixkv.indexes.errors import PrefixKVError

from .config import SimSettings
from .errors import (
    ProfileRangeWarning,
    SimError,
    SimInputError,
    SimSettingsError,
    SimUnservableError,
)
from .metrics import RequestRow, SimResult, summarize
from .profile import RANGE_KEYS, CostProfile, load_profile
from .replica_scheduler import ReplicaScheduler, SimSeq, StepPlan, StepWork
from .requests import SimRequest
from .seats import Seat, make_seat
from .serving_spread import ServingDelay, serving_delay, step_pace

__all__ = ["IndexFactory", "Replica", "pool_seat", "simulate", "step_charge"]

IndexFactory = Callable[[], PrefixIndex]
"""Makes a fresh, empty index for one run."""


def simulate(
    requests: Iterable[SimRequest],
    index_factory: IndexFactory,
    capacity_tokens: int,
    config: SimSettings | None = None,
    profile: CostProfile | None = None,
    *,
    labels: Mapping[str, Any] | None = None,
    progress: Callable[[int], object] | None = None,
) -> SimResult:
    """Replay ``requests`` (stamped, in arrival order, read lazily) through one replica
    over a pool of ``capacity_tokens``: the records in the order sent and the summary,
    labelled with the settings, ``labels`` and ``profile_range`` (what went past the
    profile's range, warned once as :class:`ProfileRangeWarning`); ``progress`` gets each
    finished request's prompt tokens.

    Raises:
        SimSettingsError: a non-positive capacity.
        SimInputError: a request without an arrival, out of order, or a repeated id.
        SimUnservableError: a request that cannot fit the pool even alone.
    """
    cfg = SimSettings() if config is None else config
    prof = load_profile() if profile is None else profile
    index, seat = pool_seat(cfg.batching, index_factory, capacity_tokens)
    replica = Replica(seat, cfg, prof)
    delay = serving_delay(
        prof.request_s,
        prof.request_spread_s,
        prof.busy_request_spread_s,
        prof.decoding_request_spread_s,
    )
    records, reached = _run(replica, _SessionGate(iter(requests), delay), progress)
    beyond = prof.extrapolation(reached)
    if beyond:
        warnings.warn(
            f"profile {prof.name!r} extrapolated beyond its measured range: " + "; ".join(beyond),
            ProfileRangeWarning,
            stacklevel=2,
        )
    all_labels: dict[str, Any] = {
        "index": type(index).__name__,
        "block_size": index.block_size,
        "capacity_tokens": capacity_tokens,
        **cfg.as_dict(),
        "profile": prof.name,
        "profile_range": "; ".join(beyond),
        **(labels or {}),
    }
    evicted = seat.totals.num_evicted_blocks
    run = summarize(
        records, busy_s=replica.busy_s, num_steps=replica.num_steps, evicted_blocks=evicted
    )
    return SimResult(all_labels, records, run)


def pool_seat(
    batching: str,
    index_factory: IndexFactory,
    capacity_tokens: int,
    *,
    events: bool = False,
    error: type[PrefixKVError] = SimSettingsError,
) -> tuple[PrefixIndex, Seat]:
    """A fresh index and the seat (:func:`~.seats.make_seat`) over a pool of
    ``capacity_tokens // block_size`` blocks; ``error`` is raised for a capacity that is
    not a positive int or holds no block."""
    if type(capacity_tokens) is not int or capacity_tokens < 1:
        raise error(f"capacity_tokens must be a positive int, got {capacity_tokens!r}")
    index = index_factory()
    block_size = index.block_size
    num_blocks = capacity_tokens // block_size
    if num_blocks < 1:
        raise error(f"capacity_tokens {capacity_tokens} holds no block of {block_size} tokens")
    events = events and isinstance(index, SupportsEventSink)
    return index, make_seat(batching, index, num_blocks, events=events)


def _run(
    replica: Replica, gate: _SessionGate, progress: Callable[[int], object] | None
) -> tuple[list[RequestRow], dict[str, int]]:
    """Steps ``replica`` until ``gate`` has nothing more to send and nothing runs; the
    records in the order sent and the largest step work seen per profile range key."""
    records: list[RequestRow] = []
    reached = dict.fromkeys(RANGE_KEYS, 0)
    check_invariants = replica.schedule.config.check_invariants
    while True:
        for request, sent in gate.ready(replica.now):
            records.append(replica.add(request, sent))
        if not replica.has_unfinished():
            wake = gate.next_time()
            if wake is None:
                return records, reached
            replica.idle_until(wake)
            continue
        plan = replica.plan()
        if not plan.chunks:
            sched = replica.schedule
            raise SimError(  # pragma: no cover - the servability check rules this out
                f"no request could be scheduled at t={replica.now:.6f} s with "
                f"{len(sched.waiting)} waiting and {len(sched.running)} running"
            )
        step = replica.run(plan)
        _reach(reached, step.work)
        for seq in step.finished:
            gate.finished(seq.request.id, step.delivered)
        if progress is not None and step.finished:
            progress(sum(len(s.request.prompt) for s in step.finished))
        if check_invariants:
            replica.seat.check_invariants()


def _reach(reached: dict[str, int], work: StepWork) -> None:
    reached["prefill_tokens"] = max(reached["prefill_tokens"], work.prefill_tokens)
    reached["context_tokens"] = max(reached["context_tokens"], work.max_context)
    reached["batch_size"] = max(reached["batch_size"], work.num_decode)


class _SessionGate:
    """When each request reaches the engine: sent at its arrival, or closed loop once
    its predecessor finished plus its think time; it reaches the scheduler ``delay``
    after it is sent, and not before one sent before it."""

    def __init__(self, requests: Iterator[SimRequest], delay: ServingDelay) -> None:
        self.requests = requests
        self.delay = delay
        self.pending = next(requests, None)
        self.last_arrival = 0.0
        self.seen: set[str] = set()
        self.finish: dict[str, float] = {}
        self.blocked: dict[str, list[SimRequest]] = {}
        self.heap: list[tuple[float, int, float, SimRequest]] = []
        self.order = itertools.count()
        # The front end passes requests on in the order they were sent.
        self.last_sent = self.last_reach = -math.inf

    def _push(self, request: SimRequest, sent: float, busy: bool = False) -> None:
        reach = sent + self.delay(request.id, busy, request.output_len > 1)
        if sent >= self.last_sent:
            reach = max(reach, self.last_reach)
            self.last_sent, self.last_reach = sent, reach
        heapq.heappush(self.heap, (reach, next(self.order), sent, request))

    def _read(self, now: float) -> None:
        while self.pending is not None and _arrival(self.pending, self.last_arrival) <= now:
            r = self.pending
            if r.id in self.seen:
                raise SimInputError(f"request id {r.id!r} appears twice")
            self.seen.add(r.id)
            self.last_arrival = t = _arrival(r, self.last_arrival)
            after = r.after
            if after is None or after not in self.seen:
                self._push(r, t, busy=t < now)
            elif after in self.finish:
                self._push(r, max(t, self.finish[after] + r.think_s))
            else:
                self.blocked.setdefault(after, []).append(r)
            self.pending = next(self.requests, None)

    def ready(self, now: float) -> Iterator[tuple[SimRequest, float]]:
        """The requests that reach the engine by ``now``, with the time each was sent."""
        self._read(now)
        while self.heap and self.heap[0][0] <= now:
            _, _, sent, request = heapq.heappop(self.heap)
            yield request, sent

    def finished(self, request_id: str, now: float) -> None:
        """Record a finish; the turns waiting on it are sent after their think time."""
        self.finish[request_id] = now
        for r in self.blocked.pop(request_id, ()):
            self._push(r, max(_arrival(r, 0.0), now + r.think_s))

    def next_time(self) -> float | None:
        """When the engine next receives a request (``None``: never)."""
        times = [self.heap[0][0]] if self.heap else []
        if self.pending is not None:
            times.append(_arrival(self.pending, self.last_arrival))
        return min(times, default=None)


def _arrival(request: SimRequest, last: float) -> float:
    t = request.arrival
    if t is None:
        raise SimInputError(
            f"request {request.id!r} has no arrival time; stamp it with with_arrivals()"
        )
    if t < last:
        raise SimInputError(
            f"request {request.id!r} arrives at {t} s, before the previous one ({last} s); "
            "requests must come in arrival order"
        )
    return t


class Step(NamedTuple):
    """One computed step (``delivered``: when its tokens reached their clients)."""

    start: float
    end: float
    delivered: float
    work: StepWork
    finished: list[SimSeq]


def step_charge(
    p: CostProfile, seconds: float, *, wakes: bool, admits: bool, frontend_busy_s: float
) -> float:
    """A step's charged seconds: ``seconds`` of computing, plus waking an idle engine
    (``wakes``), taking a request in (``admits``, once a step), and the front end's share
    of the part of the step it is busy for (``frontend_busy_s`` from the step's start)."""
    if wakes:
        seconds += p.wake_s
    if admits:
        seconds += p.admit_s
    return seconds + p.frontend_cpu_share * min(max(0.0, frontend_busy_s), seconds)


class Replica:
    """A seat, its schedule and a cost profile, on a clock starting at ``start_time``.

    With ``stream``, a serving front end shares the engine's cores: tokens reach their
    clients once it has streamed them, and it slows a step by its share of the time it
    is busy during it; else tokens arrive at the step's end. ``config.batching`` must
    match the seat: the schedule is picked by the seat's type.
    """

    def __init__(
        self,
        seat: Seat,
        config: SimSettings,
        profile: CostProfile,
        *,
        start_time: float = 0.0,
        stream: bool = True,
    ) -> None:
        self.seat = seat
        self.schedule = ReplicaScheduler(seat, config, profile)
        self.profile = profile
        self.now = start_time
        self.busy_s = 0.0
        self.num_steps = 0
        self.stream = stream
        self._frontend_free = start_time  # when the front end is done with its queued work
        self._idle_since: float | None = start_time  # None: busy
        self._pace = step_pace(profile.pace_spread, profile.pace_window_s)

    def add(self, request: SimRequest, sent: float) -> RequestRow:
        """Queue a request sent at ``sent``; its record, filled in as it runs.

        Raises:
            SimUnservableError: it cannot run in this replica's pool even alone.
        """
        seat, cfg = self.seat, self.schedule.config
        reason = unservable(
            len(request.prompt),
            request.output_len,
            block_size=seat.block_size,
            num_blocks=seat.num_blocks,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
        )
        if reason is not None:
            raise SimUnservableError(f"request {request.id!r} {reason}")
        metrics = RequestRow(request.id, sent, len(request.prompt), request.output_len)
        self.schedule.add(SimSeq(request, metrics))
        if self.stream:
            self._frontend_free = (
                max(self._frontend_free, self.now) + self.profile.frontend_request_cpu_s
            )
        return metrics

    def idle_until(self, t: float) -> None:
        """Move an idle replica's clock to ``t``."""
        if self._idle_since is None:
            self._idle_since = self.now
        self.now = max(self.now, t)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return self.schedule.has_unfinished()

    def plan(self) -> StepPlan:
        """Plan the step that starts now (empty when nothing can be scheduled)."""
        return self.schedule.schedule(self.now)

    def run(self, plan: StepPlan) -> Step:
        """Compute ``plan``: the clock moves by its cost, then the step completes."""
        work = plan.work()
        p = self.profile
        start = self.now
        seconds = self._pace(start) * p.step_time(
            work.prefill_tokens, work.prefill_pairs, work.num_decode, work.decode_context
        )
        wakes = self._idle_since is not None and start - self._idle_since >= p.wake_after_s
        self._idle_since = None
        seconds = step_charge(
            p,
            seconds,
            wakes=wakes,
            admits=any(c.seq.metrics.first_scheduled_s == start for c in plan.chunks),
            frontend_busy_s=self._frontend_free - start if self.stream else 0.0,
        )
        self.now = end = start + seconds
        self.busy_s += seconds
        self.num_steps += 1
        delivered = end
        if self.stream:
            self._frontend_free = (
                max(end, self._frontend_free) + p.stream_token_s * work.num_sampled
            )
            delivered = self._frontend_free
        finished = self.schedule.complete(plan, end, delivered)
        return Step(start, end, delivered, work, finished)
