"""A request-rate sweep: every backend at several rates, at the table's capacity.

``--request-rate 1,2,4,8`` runs each rate; ``--request-rate auto`` starts from a
rate the replica serves with room to spare (the power of two at or below one over
the mean request's zero-load time under the cost profile, :func:`start_rate`) and
doubles it until the backend is overloaded (:mod:`~..sim.load`), at most
:data:`MAX_AUTO_RATES` rates. Each point is an ordinary arrival-time run (role
``rate``), with its offered and achieved rate, overload verdict and, under an SLO,
goodput; :func:`saturation` reads the highest rate a backend served without
overload and its best goodput. The sweep itself is :mod:`~..sim.rate_sweep`'s, which
``cluster`` shares.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..sim import SimUnservableError
from ..sim.rate_sweep import (
    MAX_AUTO_RATES,
    Saturation,
    rate_schedule,
    saturation_of,
    start_rate,
    sweep_rates,
)
from ..workloads import Workload
from .arrival import ArrivalRun, Scheduler, TimeSettings, run_arrival
from .spec import BackendSpec, Bars

__all__ = ["MAX_AUTO_RATES", "rate_points", "run_rate_sweep", "saturation", "start_rate"]


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
    if settings.auto_rates:
        rates = rate_schedule(settings.request_rate or 1.0, auto=True)
    else:
        rates = rate_points(settings)

    by_label = {b.label: b for b in backends}

    def run(label: str, rate: float) -> ArrivalRun | None:
        point = dataclasses.replace(settings, request_rate=rate, rates=(), auto_rates=False)
        try:
            return run_arrival(
                workload, by_label[label], capacity_tokens, point, role="rate", bars=bars,
                scheduler=scheduler,
            )  # fmt: skip
        except SimUnservableError:
            return None

    made = {(r.backend, r.settings.request_rate or 0.0): r for r in done}
    for new in sweep_rates(
        list(by_label), rates, run, lambda r: r.load_summary.overloaded,
        auto=settings.auto_rates, done=made,
    ):  # fmt: skip
        out.append(new)
    return out


def saturation(runs: Sequence[ArrivalRun]) -> list[Saturation]:
    """Per backend and engine, where the sweep's runs (any roles) saturate it."""
    return saturation_of(
        (f"{r.backend} as {r.engine}", r.settings.request_rate, r.load_summary)
        for r in runs
        if r.settings.request_rate is not None
    )
