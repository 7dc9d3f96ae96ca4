"""One engine replica on a virtual clock: a seat, the schedule over it, a cost profile.

Every arrival-time run (:func:`~.replica.simulate`, each cluster replica) steps through
a :class:`Replica`. Nothing reads the wall clock: a run is a pure function of its inputs::

    replica = Replica(make_seat("mixed", index, num_blocks), config, profile)
    replica.add(request, sent)     # its record, filled in as it runs
    plan = replica.plan()          # what the step computes (a cluster publishes here)
    step = replica.run(plan)       # the clock moves by the step's cost
"""

from __future__ import annotations

from typing import NamedTuple

from prefixkv.adapters.servable import unservable

from .config import SimSettings
from .engine_pace import step_pace
from .errors import SimUnservableError
from .metrics import RequestRow
from .profile import CostProfile
from .replica_scheduler import ReplicaScheduler, SimSeq, StepPlan, StepWork
from .requests import SimRequest
from .seats import Seat

__all__ = ["Replica", "Step"]


class Step(NamedTuple):
    """One computed step: its start and end, when its tokens reached their clients,
    what it computed and the requests it finished."""

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
    """A seat, its schedule and a cost profile, on a clock.

    Args:
        seat: the engine class the requests run through (:func:`~.seats.make_seat`).
        config: the schedule's settings (its batching must be the seat's).
        profile: step costs.
        start_time: the clock when it starts.
        stream: a serving front end shares the engine's cores: tokens reach their
            clients once it has streamed them, and it slows a step by its share of the
            time it is busy during it; else tokens arrive at the step's end.
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
        """Queue a request sent at ``sent``; returns its record, filled in as it runs.

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
            self._frontend_free = max(self._frontend_free, self.now)
            self._frontend_free += self.profile.frontend_request_cpu_s
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
