"""Arrival-time runs of a comparison: every backend under the same scheduler, with a clock.

The K-live replay of :mod:`.k_live` counts the prompt tokens each index serves
from cache; this runs the same requests through :func:`.sim.simulate` (a queue,
continuous batching, a cost profile) to tell what that is worth to the engine's
users: TTFT, queueing, throughput, GPU-seconds of prefill. Requests arrive at a
Poisson or fixed request rate, or at the trace's own timestamps times a scale;
sessions (a trace whose requests name their session or previous turn) replay
closed loop unless asked otherwise: a turn is sent once the previous one finished,
plus its think time.

A comparison varies one thing. By default every backend runs under one scheduler,
vLLM's (prefill chunks and decode rows mixed in one step), so the index is the only
difference. The scheduler is its own axis: ``schedulers=("vllm", "sglang")`` runs
every backend under each (SGLang's: a prefill step whenever one can be admitted,
else a decode step), and ``"natural"`` runs each backend on the engine it models
(hash chain as vLLM, radix as SGLang), which moves both at once and is labelled so.
Both engines' default queue order is first come, first served.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
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

__all__ = [
    "ENGINE_MODES",
    "SCHEDULERS",
    "EngineMode",
    "Scheduler",
    "TimeSettings",
    "check_arrivals",
    "has_sessions",
    "run_arrival",
]

EngineMode = Literal["vllm", "sglang"]
Scheduler = Literal["vllm", "sglang", "natural"]
SCHEDULERS: tuple[Scheduler, ...] = ("vllm", "sglang", "natural")
"""The scheduler axis: vLLM-style or SGLang-style for every backend, or ``natural``
(each backend on the engine it models: index and scheduler move together)."""
ENGINE_MODES: Mapping[EngineMode, tuple[Batching, QueueOrder]] = {
    "vllm": ("mixed", "fcfs"),
    "sglang": ("prefill_first", "fcfs"),
}
"""Each engine's batching and default queue order (vLLM's ``--scheduling-policy fcfs``,
SGLang's ``--schedule-policy fcfs``)."""

_ENGINE_NAMES: Mapping[EngineMode, str] = {"vllm": "vLLM", "sglang": "SGLang"}


@dataclass(frozen=True, slots=True)
class TimeSettings:
    """How a comparison's arrival-time runs go: arrivals, scheduler knobs, cost profile.

    Attributes:
        request_rate: requests per second (``arrival`` process); replaces the
            trace's timestamps.
        time_scale: keep the trace's timestamps, relative to the first request,
            multiplied by this (``< 1`` squeezes the trace: more load).
        arrival: ``"poisson"`` (seeded) or ``"fixed"`` (evenly spaced).
        seed: the Poisson process's seed.
        max_num_seqs: most running requests (vLLM ``--max-num-seqs``, SGLang
            ``--max-running-requests``).
        max_num_batched_tokens: most tokens a step computes (vLLM
            ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``).
        queue_order: force a queue order on every backend (``None``: each engine's own).
        batching: force a batching mode on every backend (``"mixed"`` is the
            ``vllm`` scheduler, ``"prefill_first"`` the ``sglang`` one); replaces
            ``schedulers``.
        profile: the step costs.
        schedulers: the scheduler axis (:data:`SCHEDULERS`): every backend runs
            under each; default vLLM's alone, so only the index varies.
        closed_loop: sessions replay closed loop (a turn waits for the previous one
            plus its think time); ``False``: every request at its own arrival.
        slo: count goodput under this objective (``None``: no goodput).
        rates: more request rates to sweep at the table's capacity, beside
            ``request_rate`` (:mod:`.rates`).
        auto_rates: sweep rates from ``request_rate`` doubling until each backend is
            overloaded (at most :data:`~..sim.rate_sweep.MAX_AUTO_RATES` rates).

    Raises:
        SimSettingsError: neither or both of ``request_rate`` and ``time_scale``, a
            value out of range, an unknown process, queue order, batching mode or
            scheduler, a repeated or empty scheduler list.
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
        if self.auto_rates and self.time_scale is None and self.request_rate is None:
            pass  # the start rate is found per workload (rates.start_rate)
        elif (self.request_rate is None) == (self.time_scale is None):
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
        # Validates the knobs (sizes, queue order, batching) now, not at the first run.
        SimSettings(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            queue_order=self.queue_order or "fcfs",
            batching=self.batching or "mixed",
        )

    @property
    def axis(self) -> str:
        """What the comparison varies: ``"index"`` (one scheduler), ``"index and
        scheduler"`` (several), or ``"index and scheduler together"`` (natural)."""
        if "natural" in self.schedulers:
            return "index and scheduler together"
        return "index" if len(self.schedulers) == 1 else "index and scheduler"

    def engine(self, spec: BackendSpec, scheduler: Scheduler | None = None) -> EngineMode:
        """The engine ``spec`` runs as under ``scheduler`` (default: the first of
        :attr:`schedulers`); ``natural`` is SGLang's for the radix tree's driver,
        vLLM's for the others."""
        chosen = self.schedulers[0] if scheduler is None else scheduler
        if chosen == "natural":
            return "sglang" if spec.driver == "sglang" else "vllm"
        return chosen

    def config(self, spec: BackendSpec, scheduler: Scheduler | None = None) -> SimSettings:
        """The scheduler settings of ``spec``'s runs under ``scheduler``."""
        batching, queue_order = ENGINE_MODES[self.engine(spec, scheduler)]
        return SimSettings(
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            queue_order=self.queue_order or queue_order,
            batching=batching,
        )

    def describe_engine(self, spec: BackendSpec, scheduler: Scheduler | None = None) -> str:
        """``"radix: SGLang-style (prefill_first batching, fcfs queue)"``."""
        cfg = self.config(spec, scheduler)
        name = _ENGINE_NAMES[self.engine(spec, scheduler)]
        return f"{spec.label}: {name}-style ({cfg.batching} batching, {cfg.queue_order} queue)"

    def describe_arrivals(self) -> str:
        """``"Poisson, 4 req/s (seed 0)"``, ``"fixed, 4 req/s"``, ``"trace timestamps × 10"``."""
        if self.request_rate is None and self.auto_rates:
            return f"{self.arrival}, rates doubling until overloaded (seed {self.seed})"
        if self.request_rate is not None:
            rate = f"{self.request_rate:g} req/s"
            if self.rates:
                rate += " (table), swept at " + ", ".join(
                    f"{r:g}" for r in sorted({*self.rates, self.request_rate})
                )
            elif self.auto_rates:
                rate += ", doubling until overloaded"
            if self.arrival == "poisson":
                return f"Poisson, {rate} (seed {self.seed})"
            return f"fixed, {rate}"
        return f"trace timestamps × {self.time_scale:g}"

    def row(self) -> dict[str, Scalar]:
        """The settings as table columns (every arrival-time row carries them)."""
        return {
            "arrivals": self.describe_arrivals(),
            "request_rate": self.request_rate,
            "arrival_process": self.arrival if self.time_scale is None else "trace",
            "time_scale": self.time_scale,
            "arrival_seed": self.seed,
            "profile": self.profile.name,
            "varied": self.axis,
            "closed_loop": self.closed_loop,
            "slo": "" if self.slo is None else self.slo.describe(),
        }


def has_sessions(workload: Workload) -> bool:
    """Whether the workload's first requests name a session or a previous turn."""
    first = itertools.islice(workload.requests, 64)
    return any(r.session is not None or r.parent is not None for r in first)


def check_arrivals(workload: Workload, settings: TimeSettings) -> None:
    """Refuse, before anything runs, a time scale for requests that have no usable clock.

    Built-in workloads have no timestamps; kv-cache-tester traces time each
    conversation from its own start, so their requests are not in arrival order.

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
    *,
    role: str = "table",
    bars: Bars | None = None,
    scheduler: Scheduler | None = None,
) -> RunRow:
    """Simulate ``workload`` arriving at ``spec``'s replica of ``capacity_tokens``
    under ``scheduler`` (default: the first of ``settings.schedulers``).

    The requests are read again from the workload (a trace streams), stamped with
    arrival times, and replayed by :func:`~.sim.simulate`; a workload with sessions
    runs closed loop when ``settings.closed_loop``. The run's row has the parts
    :class:`~..sim.metrics.RunMetrics` and :class:`~..sim.load.LoadSummary`; its labels
    name the backend, the engine and scheduler, the scheduler settings
    (:meth:`~..sim.SimSettings.as_dict`) and the arrivals (:meth:`TimeSettings.row`).

    Raises:
        SimInputError: requests out of arrival order (a trace's timestamps).
        SimUnservableError: a request that cannot fit the pool even alone.
        KeyboardInterrupt: Ctrl-C (nothing of this run is kept).
    """
    sched: Scheduler = settings.schedulers[0] if scheduler is None else scheduler
    config = settings.config(spec, sched)
    engine = settings.engine(spec, sched)
    closed = settings.closed_loop and has_sessions(workload)
    asked: list[float] = []  # the arrival times the process asked for
    stamped = _tally(_arriving(workload, settings, closed), asked)
    legend = f"{spec.label} as {engine}"
    labels = {"workload": workload.name, "backend": spec.label, "legend": legend}
    desc = f"{workload.name} {legend}{_role_note(role, settings, capacity_tokens)}"
    bar = bars(desc, workload.stats.prompt_tokens) if bars else None
    try:
        progress = None if bar is None else bar.update
        result = simulate(
            stamped, spec.make, capacity_tokens, config, settings.profile, labels=labels,
            progress=progress,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    row_labels: dict[str, Any] = {
        **spec.run_labels(workload.name, "arrival", role, capacity_tokens),
        "engine": engine,
        **config.as_dict(),
        **settings.row(),
        "scheduler": sched,
        "closed_loop": closed,
        "profile_range": result.labels.get("profile_range", ""),
    }
    load = summarize_load(
        result.requests, offered_arrivals=asked, slo=settings.slo, closed_loop=closed
    )
    return RunRow(row_labels, (result.run, load), result.requests, slo=settings.slo)


def _arriving(workload: Workload, settings: TimeSettings, closed: bool) -> Iterator[SimRequest]:
    """The workload's requests read again, stamped with the settings' arrival times."""
    return with_arrivals(
        from_trace(workload.requests, closed_loop=closed),
        request_rate=settings.request_rate,
        time_scale=settings.time_scale,
        process=settings.arrival,
        seed=settings.seed,
    )


def _role_note(role: str, settings: TimeSettings, capacity_tokens: int) -> str:
    """What a progress bar adds for a run beside the table's: its rate or capacity."""
    if role == "table":
        return ""
    if role == "rate":
        return f" @ {settings.request_rate:g} req/s"
    return f" @ {capacity_tokens:,} tok"


def _tally(requests: Iterable[SimRequest], arrivals: list[float]) -> Iterator[SimRequest]:
    """Pass ``requests`` through, noting each one's asked-for arrival (the offered load)."""
    for r in requests:
        if r.arrival is not None:
            arrivals.append(r.arrival)
        yield r
