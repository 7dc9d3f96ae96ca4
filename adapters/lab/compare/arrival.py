"""Arrival-time runs of a comparison: every backend through :func:`..sim.simulate` for TTFT,
queueing and throughput. One thing varies at a time: by default every backend runs under
vLLM's scheduler, so only the index differs; ``natural`` runs each on the engine it models.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from ..backends import BackendSpec, Bars, Scalar
from ..sim import (
    ARRIVAL_PROCESSES,
    ArrivalProcess,
    Batching,
    CostProfile,
    QueueOrder,
    SimRequest,
    SimSettings,
    SimSettingsError,
    load_profile,
    simulate,
    with_arrivals,
)
from ..sim.arrivals import check_request_rate, check_time_scale
from ..sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from ..sim.load import Slo, summarize_load
from ..sim.requests import from_trace
from ..sim.runs import RunRow
from ..traces import TraceSource
from ..workloads import Workload

__all__ = ["SCHEDULERS", "Scheduler", "TimeSettings", "check_arrivals", "run_arrival"]

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
    """How a comparison's arrival-time runs go: arrivals, scheduler knobs, cost profile.

    The fields are :class:`~.options.CompareOptions`' of the same names, and:

    Attributes:
        profile: the step costs.
        schedulers: the scheduler axis (:data:`SCHEDULERS`); each backend under each.
        rates: more request rates to sweep at the table's capacity.
        auto_rates: sweep rates doubling until each backend is overloaded.

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
        self.sim_settings(self.batching or "mixed")  # the knobs checked now, not at a run

    def sim_settings(self, batching: Batching) -> SimSettings:
        """The replica's scheduler settings under ``batching``."""
        return SimSettings(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            queue_order=self.queue_order or "fcfs",
            batching=batching,
        )

    def engine(self, spec: BackendSpec, scheduler: Scheduler) -> EngineMode:
        """The engine ``spec`` runs as under ``scheduler``."""
        if scheduler == "natural":
            return "sglang" if spec.driver == "sglang" else "vllm"
        return scheduler

    def describe_engine(self, spec: BackendSpec, scheduler: Scheduler) -> str:
        """``"radix: SGLang-style (prefill_first batching, fcfs queue)"``."""
        batching, name = _ENGINES[self.engine(spec, scheduler)]
        queue = self.queue_order or "fcfs"
        return f"{spec.label}: {name}-style ({batching} batching, {queue} queue)"

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


def run_arrival(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    settings: TimeSettings,
    scheduler: Scheduler,
    *,
    role: str = "table",
    bars: Bars | None = None,
) -> RunRow:
    """Simulate ``workload`` arriving at ``spec``'s replica of ``capacity_tokens`` under
    ``scheduler``.

    Raises:
        SimInputError: requests out of arrival order (a trace's timestamps).
        SimUnservableError: a request that cannot fit the pool even alone.
        KeyboardInterrupt: Ctrl-C (nothing of this run is kept).
    """
    engine = settings.engine(spec, scheduler)
    config = settings.sim_settings(_ENGINES[engine][0])
    closed = settings.closed_loop and any(
        r.session is not None or r.parent is not None
        for r in itertools.islice(workload.requests, 64)
    )
    asked: list[float] = []  # the offered load, filled as the requests are read
    stamped = with_arrivals(
        from_trace(workload.requests, closed_loop=closed),
        request_rate=settings.request_rate,
        time_scale=settings.time_scale,
        process=settings.arrival,
        seed=settings.seed,
    )
    legend = f"{spec.label} as {engine}"
    labels = {"workload": workload.name, "backend": spec.label, "legend": legend}
    note = f" @ {capacity_tokens:,} tok" if role != "table" else ""
    if role == "rate":
        note = f" @ {settings.request_rate:g} req/s"
    bar = bars(f"{workload.name} {legend}{note}", workload.stats.prompt_tokens) if bars else None
    try:
        result = simulate(
            _tally(stamped, asked), spec.make, capacity_tokens, config, settings.profile,
            labels=labels, progress=None if bar is None else bar.update,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    row_labels: dict[str, Any] = {
        **spec.run_labels(workload.name, "arrival", role, capacity_tokens),
        "engine": engine,
        **config.as_dict(),
        **settings.row(),
        "scheduler": scheduler,
        "closed_loop": closed,
        "profile_range": result.labels.get("profile_range", ""),
    }
    load = summarize_load(
        result.requests, offered_arrivals=asked, slo=settings.slo, closed_loop=closed
    )
    return RunRow(row_labels, (result.run, load), result.requests, slo=settings.slo)


def _tally(requests: Iterator[SimRequest], arrivals: list[float]) -> Iterator[SimRequest]:
    for r in requests:
        if r.arrival is not None:
            arrivals.append(r.arrival)
        yield r
