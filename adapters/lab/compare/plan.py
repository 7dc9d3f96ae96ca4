"""A comparison's plan: the capacities each workload runs at, checked before anything runs.

The table's capacity defaults to roomy (every request's KV at once: nothing is
evicted); a sweep spans tight (the K largest requests live at once) to roomy on a
log scale. :func:`plan_comparison` fixes each workload's capacities from the
resolved :class:`CompareSettings` and refuses a pool that holds no block or too many.
"""

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
    "SWEEP_POINTS",
    "CompareSettings",
    "WorkloadPlan",
    "check_pool",
    "default_boundary_accounting",
    "min_capacity",
    "plan_capacities",
    "plan_comparison",
    "roomy_capacity",
    "sweep_capacities",
]


SWEEP_POINTS = 7
"""Capacities of a sweep from tight to roomy, when none are listed."""


@dataclass(frozen=True)
class CompareSettings:
    """What a comparison runs, resolved: parsed backends, capacities in tokens, the
    arrival-time settings (:class:`CompareOptions` is what a caller writes, and
    ``prefixkv compare`` builds this from its flags).

    Attributes:
        backends: the backends, in table order.
        capacities: KV capacities in tokens; the first is the table's, and several
            are the sweep's. ``None``: roomy (nothing is evicted).
        capacity_sweep: also sweep capacities (the listed ones, or
            :data:`SWEEP_POINTS` from tight to roomy).
        concurrency: the K of the K-live schedule.
        timing_repeats: timed K-live replays per backend.
        boundary_accounting: count matched-but-recomputed tokens (SPEC BB-8).
        time: arrival-time runs (``None``: none).
        max_pool_blocks: refuse a capacity of more blocks than this.
        profile: the cost profile whose KV bytes per token give capacities in GiB
            (default: the arrival-time runs' profile, if any).
        capacity_search: find each backend's working set and knee by bisection
            over K-live replays (:mod:`.capacity_search`).

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

    @property
    def listed_sweep(self) -> bool:
        """Whether the sweep's capacities are the listed ones."""
        return self.capacities is not None and len(self.capacities) > 1


@dataclass(frozen=True, slots=True)
class WorkloadPlan:
    """One workload's capacities, checked.

    Attributes:
        workload: the requests.
        capacity_tokens: the table's capacity.
        sweep: the sweep's capacities, ascending (empty: no sweep).
    """

    workload: Workload
    capacity_tokens: int
    sweep: list[int]


def default_boundary_accounting(workloads: Sequence[Workload]) -> bool:
    """On, except for hash-id traces (their sharing stops at block boundaries by
    construction, so the accounting's extra replay would only measure zeros)."""
    return all(w.tokens_per_id is None for w in workloads)


def plan_comparison(workloads: Sequence[Workload], settings: CompareSettings) -> list[WorkloadPlan]:
    """Fix each workload's capacities and refuse, before anything runs, what cannot run.

    Raises:
        CapacityError: a capacity that holds no block or too many.
        SimSettingsError: ``--time-scale`` for requests without a usable clock.
    """
    caps = settings.capacities
    plans = []
    for w in workloads:
        cap, points = plan_capacities(
            w,
            settings.backends,
            capacity_tokens=None if caps is None else caps[0],
            concurrency=settings.concurrency,
            sweep_points=SWEEP_POINTS
            if settings.capacity_sweep and not settings.listed_sweep
            else 0,
        )
        if settings.capacity_sweep and caps is not None and settings.listed_sweep:
            points = sorted(caps)
        for c in [cap, *points]:
            check_pool(c, settings.backends, settings.max_pool_blocks)
        if settings.time is not None:
            check_arrivals(w, settings.time)
        plans.append(WorkloadPlan(w, cap, points))
    return plans


def sweep_capacities(low: int, high: int, points: int = 7) -> list[int]:
    """``points`` capacities from ``low`` to ``high``, evenly spaced on a log scale."""
    if high <= low:
        return [high]
    ratio = high / low
    caps = [round(low * ratio ** (i / (points - 1))) for i in range(points)]
    return sorted(set(caps))


def plan_capacities(
    workload: Workload,
    backends: Sequence[BackendSpec],
    *,
    capacity_tokens: int | None = None,
    concurrency: int = 1,
    sweep_points: int = 0,
) -> tuple[int, list[int]]:
    """The capacity of the table (default: roomy) and of the sweep (tight to roomy).

    Returns:
        ``(capacity_tokens, sweep)``; the sweep is empty when ``sweep_points`` is 0.
    """
    roomy = roomy_capacity(workload.stats, backends)
    cap = roomy if capacity_tokens is None else capacity_tokens
    if not sweep_points:
        return cap, []
    tight = min_capacity(workload.stats, backends, concurrency)
    return cap, sweep_capacities(tight, max(roomy, cap), sweep_points)
