"""A comparison's plan: the resolved settings and the capacities each workload runs at,
checked before anything runs (the table's default is roomy: nothing evicted; a sweep spans
tight to roomy on a log scale)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..backends import (
    MAX_POOL_BLOCKS,
    BackendSpec,
    CompareError,
    check_pool,
    check_positive,
    min_capacity,
    roomy_capacity,
)
from ..sim import CostProfile
from ..workloads import Workload
from .arrival import TimeSettings, check_arrivals

__all__ = [
    "CompareSettings",
    "WorkloadPlan",
    "plan_comparison",
    "roomy_capacity",
    "sweep_capacities",
]


@dataclass(frozen=True)
class CompareSettings:
    """What a comparison runs, resolved (:class:`CompareOptions` is what a caller writes).

    Attributes:
        backends: the backends compared, in table order.
        capacities: KV capacities in tokens, the first the table's (``None``: roomy).
        capacity_sweep: also sweep capacities (the listed ones, or 7 from tight to roomy).
        concurrency: the K of the K-live schedule.
        timing_repeats: timed K-live replays per backend.
        boundary_accounting: count matched-but-recomputed tokens (SPEC BB-8).
        time: arrival-time runs (``None``: none).
        max_pool_blocks: refuse a capacity of more blocks than this.
        profile: gives capacities in GiB (default: the arrival-time runs').
        capacity_search: find each backend's working set and knee by bisection.

    Raises:
        CompareError: no backend, a non-positive capacity, concurrency or limit.
    """

    backends: tuple[BackendSpec, ...]
    capacities: tuple[int, ...] | None = None
    capacity_sweep: bool = False
    concurrency: int = 1
    timing_repeats: int = 1
    boundary_accounting: bool = True
    time: TimeSettings | None = None
    max_pool_blocks: int = MAX_POOL_BLOCKS
    profile: CostProfile | None = None
    capacity_search: bool = False

    def __post_init__(self) -> None:
        if not self.backends:
            raise CompareError("no backend to compare")
        for name in ("concurrency", "max_pool_blocks"):
            check_positive(name, getattr(self, name))
        if self.capacities is not None and (
            not self.capacities or any(type(c) is not int or c < 1 for c in self.capacities)
        ):
            raise CompareError(f"capacities must be positive ints, got {self.capacities!r}")


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    """One workload's checked capacities: the table's and the sweep's (ascending)."""

    workload: Workload
    capacity_tokens: int
    sweep: list[int]


def plan_comparison(workloads: Sequence[Workload], settings: CompareSettings) -> list[WorkloadPlan]:
    """Fix each workload's capacities and refuse, before anything runs, what cannot run.

    Raises:
        CapacityError: a capacity that holds no block or too many.
        SimSettingsError: ``--time-scale`` for requests without a usable clock.
    """
    caps, backends = settings.capacities, settings.backends
    listed = caps is not None and len(caps) > 1
    plans = []
    for w in workloads:
        roomy = roomy_capacity(w.stats, backends)
        cap = roomy if caps is None else caps[0]
        points: list[int] = []
        if settings.capacity_sweep and caps is not None and listed:
            points = sorted(caps)
        elif settings.capacity_sweep:
            tight = min_capacity(w.stats, backends, settings.concurrency)
            points = sweep_capacities(tight, max(roomy, cap))
        for c in [cap, *points]:
            check_pool(c, backends, settings.max_pool_blocks)
        if settings.time is not None:
            check_arrivals(w, settings.time)
        plans.append(WorkloadPlan(w, cap, points))
    return plans


def sweep_capacities(low: int, high: int, points: int = 7) -> list[int]:
    """``points`` capacities from ``low`` to ``high``, evenly spaced on a log scale."""
    if high <= low:
        return [high]
    return sorted({round(low * (high / low) ** (i / (points - 1))) for i in range(points)})
