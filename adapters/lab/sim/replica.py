"""Arrival-time replay of one engine replica: a discrete-event loop in virtual time.

A request arrives or a step ends: while busy, steps run back to back and requests that
arrived during a step join the queue when it ends; while idle, the clock jumps to the
next arrival. Sessions replay closed loop: a request that names the one it follows
(``after``) is sent once that one finished plus its think time, never before its own
arrival. A run past the profile's measured range warns once and says so in its labels.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prefixkv.indexes.base import PrefixIndex, SupportsEventSink
from prefixkv.indexes.errors import PrefixKVError

from .config import SimSettings
from .errors import ProfileRangeWarning, SimError, SimInputError, SimSettingsError
from .metrics import RequestRow, SimResult, summarize
from .profile import RANGE_KEYS, CostProfile, load_profile
from .replica_scheduler import StepWork
from .requests import SimRequest
from .runner import Replica
from .seats import Seat, make_seat
from .serving_spread import ServingDelay, serving_delay

__all__ = ["IndexFactory", "pool_seat", "simulate"]

IndexFactory = Callable[[], PrefixIndex]
"""Makes a fresh, empty index for one run (``BackendSpec.make``, ``lambda: make_index(...)``)."""


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
    """Replay ``requests`` at their arrival times through one simulated replica.

    Args:
        requests: in arrival order, each with an arrival time; read lazily.
        index_factory: makes the replica's (empty) prefix index.
        capacity_tokens: KV pool size in tokens (``capacity_tokens // block_size`` blocks).
        config: scheduler settings (default ``SimSettings()``).
        profile: step costs (default: the shipped default profile).
        labels: extra columns for the result's tables.
        progress: called with a request's prompt tokens when it finishes.

    Returns:
        Per-request records (in the order sent) and the run's summary, labelled with
        the index, block size, capacity, settings, profile, ``profile_range`` (what
        went past the profile's range) and ``labels``.

    Warns:
        ProfileRangeWarning: once, when the run went past the profile's range.

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
    all_labels: dict[str, Any] = {
        "index": type(index).__name__,
        "block_size": index.block_size,
        "capacity_tokens": capacity_tokens,
        **cfg.as_dict(),
        "profile": prof.name,
        "profile_range": "; ".join(_beyond_range(prof, reached)),
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


def _beyond_range(prof: CostProfile, reached: Mapping[str, int]) -> list[str]:
    """What the run took past the profile's range; warns (at :func:`simulate`'s caller)."""
    beyond = prof.extrapolation(reached)
    if beyond:
        warnings.warn(
            f"profile {prof.name!r} extrapolated beyond its measured range: " + "; ".join(beyond),
            ProfileRangeWarning,
            stacklevel=3,
        )
    return beyond


def _reach(reached: dict[str, int], work: StepWork) -> None:
    for key, value in (
        ("prefill_tokens", work.prefill_tokens),
        ("context_tokens", work.max_context),
        ("batch_size", work.num_decode),
    ):
        if value > reached[key]:
            reached[key] = value


class _SessionGate:
    """When each request reaches the engine: open loop at its arrival; closed loop
    once its predecessor finished plus its think time (one whose predecessor never
    appeared is sent at its arrival). A request reaches the scheduler
    ``delay(id, busy, continues)`` after it is sent, and not before one sent before it.
    """

    def __init__(self, requests: Iterator[SimRequest], delay: ServingDelay) -> None:
        self.requests = requests
        self.delay = delay
        self.pending = next(requests, None)
        self.last_arrival = 0.0
        self.seen: set[str] = set()
        self.finish: dict[str, float] = {}
        self.blocked: dict[str, list[SimRequest]] = {}
        self.heap: list[tuple[float, int, float, SimRequest]] = []
        self.order = 0
        # The front end passes requests on in the order they were sent.
        self.last_sent = self.last_reach = -math.inf

    def _push(self, request: SimRequest, sent: float, busy: bool = False) -> None:
        reach = sent + self.delay(request.id, busy, request.output_len > 1)
        if sent >= self.last_sent:
            reach = max(reach, self.last_reach)
            self.last_sent, self.last_reach = sent, reach
        heapq.heappush(self.heap, (reach, self.order, sent, request))
        self.order += 1

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
