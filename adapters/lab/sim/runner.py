"""One engine replica on a virtual clock: a seat, the schedule over it, a cost profile.

Every arrival-time run steps its requests through a :class:`Replica`: the one-replica
simulation (:func:`~.replica.simulate`) and each replica of a cluster (a subclass that
adds an event publisher, ``cluster/sim_replica.py``). A step is planned by the schedule
(which calls only its seat, the engine class), priced by the cost profile (at the
engine's pace when the step starts, :mod:`.serving_spread`), and completed at its end::

    replica = Replica(make_seat("mixed", index, num_blocks), config, profile)
    replica.add(request, sent)     # its record, filled in as it runs
    plan = replica.plan()          # what the step computes (a cluster publishes here)
    step = replica.run(plan)       # the clock moves by the step's cost

The K-live replay has no clock and no cost: its schedule (:class:`~.klive.KLive`) steps
whole requests through the same seats.

Nothing reads the wall clock: a run is a pure function of its inputs.
"""

from __future__ import annotations

from typing import NamedTuple

from prefixkv.adapters.servable import unservable

from .config import SimSettings
from .errors import SimUnservableError
from .metrics import RequestRow
from .profile import CostProfile
from .replica_scheduler import ReplicaScheduler, SimSeq, StepPlan, StepWork
from .requests import SimRequest
from .seats import Seat
from .serving_spread import step_pace

__all__ = ["Replica", "Step"]


class Step(NamedTuple):
    """One computed step.

    Attributes:
        start: when it started.
        end: when it ended (the replica's clock now).
        delivered: when its tokens reached their clients (``end`` plus the streaming
            cost of the tokens it sampled, when the replica streams).
        work: what it computed, in the cost profile's units.
        finished: the requests it finished.
    """

    start: float
    end: float
    delivered: float
    work: StepWork
    finished: list[SimSeq]


def step_charge(
    p: CostProfile, seconds: float, *, wakes: bool, admits: bool, frontend_busy_s: float
) -> float:
    """A step's seconds as the simulator charges them: ``seconds`` of computing, plus
    waking an engine idle for ``wake_after_s`` or more (``wakes``), plus taking a request
    in (``admits``, once a step), plus the front end's share of the part of the step it
    is busy for (``frontend_busy_s`` from the step's start, at most the step's length).
    """
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
        start_time: the clock when it starts (a replica started mid-run).
        stream: a serving front end shares the engine's cores: tokens reach their
            clients once it has streamed them (the profile's per-token cost, after the
            work it queued before them), and it slows a step by its share of the time
            it is busy during it; else tokens arrive at the step's end and the front end
            costs nothing.
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
        # When the serving front end is done with its queued work (taking requests in,
        # streaming steps' tokens, in order): a front end sharing the engine's cores
        # slows a step by its share of the time it is busy during it.
        self._frontend_free = start_time
        # Since when the engine has had nothing to do (None: busy).
        self._idle_since: float | None = start_time
        # The engine's pace over time (a factor on each step's priced time).
        self._pace = step_pace(profile.pace_spread, profile.pace_window_s)

    def add(self, request: SimRequest, sent: float) -> RequestRow:
        """Queue a request sent at ``sent`` at the back of the waiting queue (its
        front-end work counts); returns its record, filled in as it runs.

        Raises:
            SimUnservableError: it cannot run in this replica's pool even alone
                (nothing changed).
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
        """Move an idle replica's clock to ``t`` (front-end work while idle costs no step)."""
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
        # It streams the step's tokens once done with what it had queued before them.
        delivered = end
        if self.stream:
            self._frontend_free = (
                max(end, self._frontend_free) + p.stream_token_s * work.num_sampled
            )
            delivered = self._frontend_free
        finished = self.schedule.complete(plan, end, delivered)
        return Step(start, end, delivered, work, finished)
