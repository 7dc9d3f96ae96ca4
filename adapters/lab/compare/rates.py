"""A request-rate sweep: every backend at several rates, at the table's capacity.

``--request-rate 1,2,4,8`` runs each rate; ``--request-rate auto`` starts from a
rate the replica serves with room to spare (the power of two at or below one over
the mean request's zero-load time under the cost profile, :func:`start_rate`) and
doubles it until the backend is overloaded (:mod:`~..sim.load`), at most
:data:`MAX_AUTO_RATES` rates. Each point is an ordinary arrival-time run (role
``rate``), with its offered and achieved rate, overload verdict and, under an SLO,
goodput; :func:`saturation` reads the highest rate a backend served without
overload and its best goodput.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..sim import CostProfile, SimUnservableError
from ..traces import TraceStats
from ..workload_sources import Workload
from .arrival import ArrivalRun, Scheduler, TimeSettings, run_arrival
from .spec import BackendSpec, Bars

__all__ = ["MAX_AUTO_RATES", "rate_points", "run_rate_sweep", "saturation", "start_rate"]

MAX_AUTO_RATES = 10
"""The most rates ``auto`` tries (a factor of 512 above its start)."""


def start_rate(stats: TraceStats, profile: CostProfile, max_num_batched_tokens: int) -> float:
    """The power of two (requests per second) at or below ``1 / t``, where ``t`` is the
    mean request's time alone on the replica: its prefill steps, then a decode step
    per further output token, plus the profile's per-request time."""
    n = max(1, stats.num_requests)
    prompt = max(1, stats.prompt_tokens // n)
    output = max(1, stats.output_tokens // n)
    steps = -(-prompt // max(1, max_num_batched_tokens))
    alone = (
        profile.request_s
        + steps * profile.step_s
        + profile.prefill_s(prompt)
        + (output - 1) * (profile.step_s + profile.decode_s(1, prompt + output // 2))
    )
    if alone <= 0:
        return 1.0
    return float(2.0 ** math.floor(math.log2(1.0 / alone)))


def rate_points(settings: TimeSettings) -> list[float]:
    """The listed rates, ascending, the table's first rate included (not for ``auto``)."""
    rates = {*settings.rates}
    if settings.request_rate is not None:
        rates.add(settings.request_rate)
    return sorted(rates)


def run_rate_sweep(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacity_tokens: int,
    settings: TimeSettings,
    *,
    scheduler: Scheduler,
    done: Sequence[ArrivalRun] = (),
    bars: Bars | None = None,
    into: list[ArrivalRun] | None = None,
) -> list[ArrivalRun]:
    """Each backend at each rate of the sweep (role ``rate``), under ``scheduler``.

    Listed rates all run; ``auto`` doubles from ``settings.request_rate`` and stops a
    backend at its first overloaded rate. ``done`` are runs already made (the
    table's): their backend and rate are not run again, but count for ``auto``. A
    rate at which a request cannot fit is left out. Each run is appended to ``into``
    (default a new list, returned) as it finishes, so Ctrl-C keeps the finished ones.
    """
    out: list[ArrivalRun] = [] if into is None else into
    ran = {(r.backend, r.settings.request_rate): r for r in done}
    if settings.auto_rates:
        first = settings.request_rate or 1.0
        rates = [first * 2**k for k in range(MAX_AUTO_RATES)]
    else:
        rates = rate_points(settings)
    busy = list(backends)
    for rate in rates:
        if not busy:
            break
        point = dataclasses.replace(settings, request_rate=rate, rates=(), auto_rates=False)
        for b in list(busy):
            run = ran.get((b.label, rate))
            if run is None:
                try:
                    run = run_arrival(
                        workload, b, capacity_tokens, point, role="rate", bars=bars,
                        scheduler=scheduler,
                    )  # fmt: skip
                except SimUnservableError:
                    continue
                out.append(run)
            if settings.auto_rates and run.load_summary.overloaded:
                busy.remove(b)
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Saturation:
    """Where one backend saturates in a rate sweep.

    Attributes:
        backend, engine: which.
        sustained_rate: the highest offered rate served without overload (``None``:
            overloaded at every rate).
        sustained_achieved: the achieved rate there.
        overloaded_rate: the lowest offered rate that overloaded it (``None``: none).
        best_goodput: the highest goodput over the sweep (``None``: no SLO).
        best_goodput_rate: the offered rate that gave it.
    """

    backend: str
    engine: str
    sustained_rate: float | None
    sustained_achieved: float | None
    overloaded_rate: float | None
    best_goodput: float | None
    best_goodput_rate: float | None

    def describe(self) -> str:
        """``"hash_chain as vllm: served up to 4 req/s, overloaded from 8 req/s; best
        goodput 3.1 req/s at 4 req/s"``."""
        served = (
            "overloaded at every rate swept"
            if self.sustained_rate is None
            else f"served up to {self.sustained_rate:g} req/s offered without overload "
            f"(achieved {self.sustained_achieved or math.nan:.3g} req/s)"
        )
        if self.overloaded_rate is not None and self.sustained_rate is not None:
            served += f", overloaded from {self.overloaded_rate:g} req/s"
        elif self.overloaded_rate is None:
            served += " (no rate swept overloaded it)"
        text = f"{self.backend} as {self.engine}: {served}"
        if self.best_goodput is not None and self.best_goodput_rate is not None:
            text += (
                f"; best goodput {self.best_goodput:.3g} req/s at {self.best_goodput_rate:g} req/s"
            )
        return text


def saturation(runs: Sequence[ArrivalRun]) -> list[Saturation]:
    """Per backend and engine, where the sweep's runs (any roles) saturate it."""
    groups: dict[tuple[str, str], list[ArrivalRun]] = {}
    for r in runs:
        if r.settings.request_rate is not None:
            groups.setdefault((r.backend, r.engine), []).append(r)
    out = []
    for (backend, engine), group in groups.items():
        group.sort(key=lambda r: r.settings.request_rate or 0.0)
        ok = [r for r in group if not r.load_summary.overloaded]
        hot = [r.settings.request_rate for r in group if r.load_summary.overloaded]
        scored = [r for r in group if r.load_summary.goodput is not None]
        best = max(scored, key=lambda r: r.load_summary.goodput or 0.0, default=None)
        out.append(
            Saturation(
                backend=backend,
                engine=engine,
                sustained_rate=ok[-1].settings.request_rate if ok else None,
                sustained_achieved=ok[-1].load_summary.achieved_rate if ok else None,
                overloaded_rate=min((x for x in hot if x is not None), default=None),
                best_goodput=None if best is None else best.load_summary.goodput,
                best_goodput_rate=None if best is None else best.settings.request_rate,
            )
        )
    return out
