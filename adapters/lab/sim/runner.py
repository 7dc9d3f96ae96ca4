"""One engine replica on a virtual clock: a seat, the schedule over it, a cost profile.

Every arrival-time run steps its requests through a :class:`Replica`: the one-replica
simulation (:func:`~.replica.simulate`) and each replica of a cluster (which adds an
event publisher around it). A step is planned by the schedule (which calls only its
seat, the engine class), priced by the cost profile, and completed at its end::

    replica = Replica(make_seat("mixed", index, num_blocks), config, profile)
    replica.add(seq)
    plan = replica.plan()          # what the step computes (a cluster publishes here)
    step = replica.run(plan)       # the clock moves by the step's cost

Nothing reads the wall clock: a run is a pure function of its inputs.
"""

from __future__ import annotations

from typing import NamedTuple

from .config import SimSettings
from .profile import CostProfile
from .replica_scheduler import ReplicaScheduler, SimSeq, StepPlan, StepWork
from .seats import Seat

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


class Replica:
    """A seat, its schedule and a cost profile, on a clock.

    Args:
        seat: the engine class the requests run through (:func:`~.seats.make_seat`).
        config: the schedule's settings (its batching must be the seat's).
        profile: step costs.
        start_time: the clock when it starts (a replica started mid-run).
        stream: tokens reach their clients after the step, at the profile's
            per-token streaming cost (a serving front end); else at the step's end.
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
        # The serving front end's CPU seconds since the last step began: a front end
        # sharing the engine's cores slows the next step by its share of them.
        self._frontend_cpu_s = 0.0

    def add(self, seq: SimSeq) -> None:
        """Queue a request at the back of the waiting queue (its front-end work counts)."""
        self.schedule.add(seq)
        self._frontend_cpu_s += self.profile.frontend_request_cpu_s

    def idle_until(self, t: float) -> None:
        """Move an idle replica's clock to ``t`` (front-end work while idle costs nothing)."""
        self.now = max(self.now, t)
        self._frontend_cpu_s = 0.0

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return self.schedule.has_unfinished()

    def plan(self) -> StepPlan:
        """Plan the step that starts now (empty when nothing can be scheduled)."""
        return self.schedule.schedule(self.now)

    def run(self, plan: StepPlan) -> Step:
        """Compute ``plan``: the clock moves by its cost, then the step completes."""
        work = plan.work()
        seconds = self.profile.step_time(
            work.prefill_tokens, work.prefill_pairs, work.num_decode, work.decode_context
        )
        seconds += self.profile.frontend_cpu_share * self._frontend_cpu_s
        self._frontend_cpu_s = self.profile.stream_token_s * work.num_sampled
        start = self.now
        self.now = end = start + seconds
        self.busy_s += seconds
        self.num_steps += 1
        delivered = end + self.profile.stream_token_s * work.num_sampled if self.stream else end
        finished = self.schedule.complete(plan, end, delivered)
        return Step(start, end, delivered, work, finished)
