"""A comparison's plan: the resolved settings (the arrival-time runs' too: by default every
backend under vLLM's scheduler, so only the index differs) and each workload's capacities,
checked before anything runs (the table's default roomy: nothing evicted; a sweep spans
tight to roomy on a log scale)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ..backends import (
    MAX_POOL_BLOCKS,
    BackendSpec,
    CompareError,
    Scalar,
    check_pool,
    check_positive,
    min_capacity,
    roomy_capacity,
)
from ..sim import (
    ARRIVAL_PROCESSES,
    ArrivalProcess,
    Batching,
    CostProfile,
    QueueOrder,
    SimSettings,
    SimSettingsError,
    load_profile,
)
from ..sim.arrivals import check_request_rate, check_time_scale
from ..sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from ..sim.load import Slo
from ..traces import TraceSource
from ..workloads import Workload

__all__ = [
    "SCHEDULERS",
    "CompareSettings",
    "Scheduler",
    "TimeSettings",
    "WorkloadPlan",
    "plan_comparison",
    "sweep_capacities",
]

EngineMode = Literal["vllm", "sglang"]
Scheduler = Literal["vllm", "sglang", "natural"]
SCHEDULERS: tuple[Scheduler, ...] = ("vllm", "sglang", "natural")
"""The scheduler axis: ``natural`` runs each backend on the engine it models."""

# Each engine's batching, display name; both engines' default queue order is fcfs.
_ENGINES: dict[EngineMode, tuple[Batching, str]] = {
    "vllm": ("mixed", "vLLM"),
    "sglang": ("prefill_first", "SGLang"),
}


@dataclass(frozen=True, slots=True)
class TimeSettings:
    """How a comparison's arrival-time runs go: :class:`~.options.CompareOptions`' fields
    of the same names, the step costs, the scheduler axis (each backend under each), more
    request ``rates`` to sweep at the table's capacity or ``auto_rates`` (doubling until
    each backend is overloaded).

    Raises:
        SimSettingsError: neither or both of ``request_rate`` and ``time_scale``, or a
            value, process, queue order, batching mode or scheduler list out of range.
    """

    request_rate: float | None = None
    time_scale: float | None = None
    arrival: ArrivalProcess = "poisson"
    seed: int = 0
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    queue_order: QueueOrder | None = None
    batching: Batching | None = None
    profile: CostProfile = field(default_factory=load_profile)
    schedulers: tuple[Scheduler, ...] = ("vllm",)
    closed_loop: bool = True
    slo: Slo | None = None
    rates: tuple[float, ...] = ()
    auto_rates: bool = False

    def __post_init__(self) -> None:
        if self.slo is not None and not isinstance(self.slo, Slo):
            raise SimSettingsError(f"slo must be an Slo, got {self.slo!r:.80}")
        if (self.rates or self.auto_rates) and self.time_scale is not None:
            raise SimSettingsError("a rate sweep needs request rates (not a time scale)")
        for rate in self.rates:
            check_request_rate(rate)
        if self.batching is not None:
            forced: Scheduler = "vllm" if self.batching == "mixed" else "sglang"
            object.__setattr__(self, "schedulers", (forced,))
        scheds = self.schedulers
        if (
            not isinstance(scheds, tuple)
            or not scheds
            or any(x not in SCHEDULERS for x in scheds)
            or len(set(scheds)) != len(scheds)
        ):
            raise SimSettingsError(
                f"schedulers must be distinct names of {', '.join(SCHEDULERS)}, got {scheds!r}"
            )
        if type(self.closed_loop) is not bool:
            raise SimSettingsError(f"closed_loop must be a bool, got {self.closed_loop!r}")
        auto_start = self.auto_rates and self.time_scale is None and self.request_rate is None
        if not auto_start and (self.request_rate is None) == (self.time_scale is None):
            raise SimSettingsError("give a request rate or a time scale (one of the two)")
        if self.request_rate is not None:
            check_request_rate(self.request_rate)
        if self.time_scale is not None:
            check_time_scale(self.time_scale)
        if self.arrival not in ARRIVAL_PROCESSES:
            raise SimSettingsError(
                f"unknown arrival process {self.arrival!r}; known: {', '.join(ARRIVAL_PROCESSES)}"
            )
        if type(self.seed) is not int:
            raise SimSettingsError(f"seed must be an int, got {self.seed!r}")
        if not isinstance(self.profile, CostProfile):
            raise SimSettingsError(f"profile must be a CostProfile, got {self.profile!r:.80}")
        self._sim_settings(self.batching or "mixed")  # the knobs checked now, not at a run

    def _sim_settings(self, batching: Batching) -> SimSettings:
        return SimSettings(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            queue_order=self.queue_order or "fcfs",
            batching=batching,
        )

    def engine(self, spec: BackendSpec, scheduler: Scheduler) -> tuple[EngineMode, SimSettings]:
        """The engine ``spec`` runs as under ``scheduler``, and its scheduler settings."""
        mode: EngineMode = "sglang" if spec.driver == "sglang" else "vllm"
        if scheduler != "natural":
            mode = scheduler
        return mode, self._sim_settings(_ENGINES[mode][0])

    def describe_engine(self, spec: BackendSpec, scheduler: Scheduler) -> str:
        """``"radix: SGLang-style (prefill_first batching, fcfs queue)"``."""
        mode, config = self.engine(spec, scheduler)
        style = f"{config.batching} batching, {config.queue_order} queue"
        return f"{spec.label}: {_ENGINES[mode][1]}-style ({style})"

    def row(self) -> dict[str, Scalar]:
        """The settings as table columns (every arrival-time row carries them)."""
        if "natural" in self.schedulers:
            varied = "index and scheduler together"
        else:
            varied = "index" if len(self.schedulers) == 1 else "index and scheduler"
        return {
            "arrivals": self._arrivals(),
            "request_rate": self.request_rate,
            "arrival_process": self.arrival if self.time_scale is None else "trace",
            "time_scale": self.time_scale,
            "arrival_seed": self.seed,
            "profile": self.profile.name,
            "varied": varied,
            "closed_loop": self.closed_loop,
            "slo": "" if self.slo is None else self.slo.describe(),
        }

    def _arrivals(self) -> str:
        if self.request_rate is None and self.auto_rates:
            return f"{self.arrival}, rates doubling until overloaded (seed {self.seed})"
        if self.request_rate is None:
            return f"trace timestamps × {self.time_scale:g}"
        rate = f"{self.request_rate:g} req/s"
        if self.rates:
            swept = sorted({*self.rates, self.request_rate})
            rate += " (table), swept at " + ", ".join(f"{r:g}" for r in swept)
        elif self.auto_rates:
            rate += ", doubling until overloaded"
        return (
            f"Poisson, {rate} (seed {self.seed})" if self.arrival == "poisson" else f"fixed, {rate}"
        )


def check_arrivals(workload: Workload, settings: TimeSettings) -> None:
    """Refuse, before anything runs, a time scale for requests without a usable clock.

    Raises:
        SimSettingsError: naming the workload and what to give instead.
    """
    if settings.time_scale is None:
        return
    source = workload.requests
    if (
        isinstance(source, TraceSource)
        and source.format == "kv-cache-tester"
        and source.settings.session_order == "sequential"
    ):
        raise SimSettingsError(
            f"{workload.name}: kv-cache-tester traces time each conversation from its own "
            "start, so conversations replayed one after another are not in arrival order; "
            "give --request-rate, or interleave them (--session-order interleaved)"
        )
    first = next(iter(source), None)
    if first is not None and first.arrival is None:
        what = "built-in workload" if workload.path is None else "trace"
        raise SimSettingsError(
            f"{workload.name}: this {what} has no arrival times for --time-scale; "
            "give --request-rate"
        )


@dataclass(frozen=True)
class CompareSettings:
    """What a comparison runs, resolved from :class:`~.options.CompareOptions`' fields of
    the same names: ``capacities`` (``None``: roomy), ``time`` the arrival-time runs
    (``None``: none), ``profile`` (default: the arrival-time runs').

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
    plans = []
    for w in workloads:
        roomy = roomy_capacity(w.stats, backends)
        cap = roomy if caps is None else caps[0]
        points: list[int] = []
        if settings.capacity_sweep and caps is not None and len(caps) > 1:
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
