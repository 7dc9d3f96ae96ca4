"""Arrival processes (as ``vllm bench serve``): a seeded Poisson process, a fixed rate,
or a trace's own timestamps times a scale; all lazy.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Literal

from .errors import SimInputError, SimSettingsError
from .requests import SimRequest, from_trace

if TYPE_CHECKING:
    from ..traces import TraceRequest

__all__ = [
    "ARRIVAL_PROCESSES",
    "ArrivalProcess",
    "check_request_rate",
    "check_time_scale",
    "fixed_rate_arrivals",
    "poisson_arrivals",
    "sim_requests",
    "with_arrivals",
]

ArrivalProcess = Literal["poisson", "fixed"]
ARRIVAL_PROCESSES: tuple[ArrivalProcess, ...] = ("poisson", "fixed")
"""The arrival processes: Poisson (exponential gaps) or a fixed gap of ``1 / rate``."""

MIN_REQUEST_RATE, MAX_REQUEST_RATE = 1e-9, 1e9
"""Outside, arrival times overflow to infinity or collapse onto one instant."""
MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-9, 1e9


def _bounded(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise SimSettingsError(  # NaN and infinity compare out of range too
            f"{name} must be a finite number > 0, in [{low:g}, {high:g}], got {value!r:.60}"
        )
    return float(value)


def check_request_rate(value: object) -> float:
    """``value`` as a request rate; :class:`SimSettingsError` when out of range."""
    return _bounded("request rate", value, MIN_REQUEST_RATE, MAX_REQUEST_RATE)


def check_time_scale(value: object) -> float:
    """``value`` as a time scale; :class:`SimSettingsError` when out of range."""
    return _bounded("time scale", value, MIN_TIME_SCALE, MAX_TIME_SCALE)


def poisson_arrivals(rate: float, *, seed: int = 0) -> Iterator[float]:
    """Endless Poisson arrival times at ``rate``: 0, then seeded exponential gaps."""
    lam, rng = check_request_rate(rate), random.Random(seed)
    return itertools.accumulate((rng.expovariate(lam) for _ in itertools.count()), initial=0.0)


def fixed_rate_arrivals(rate: float) -> Iterator[float]:
    """Endless evenly spaced arrival times ``0, 1/rate, 2/rate, ...``."""
    step = 1.0 / check_request_rate(rate)
    return (i * step for i in itertools.count())


def with_arrivals(
    requests: Iterable[SimRequest],
    *,
    request_rate: float | None = None,
    time_scale: float | None = None,
    process: ArrivalProcess = "poisson",
    seed: int = 0,
) -> Iterator[SimRequest]:
    """Stamp requests with arrival times, lazily: ``request_rate`` from ``process``, or
    their own arrivals relative to the first times ``time_scale``, or as they are.

    Raises:
        SimSettingsError: both knobs, a bad rate, scale or process (at once).
        SimInputError: a request without an arrival where one is needed (when reached).
    """
    if request_rate is not None and time_scale is not None:
        raise SimSettingsError("give a request rate or a time scale, not both")
    if process not in ARRIVAL_PROCESSES:
        raise SimSettingsError(
            f"unknown arrival process {process!r}; known: {', '.join(ARRIVAL_PROCESSES)}"
        )
    if request_rate is not None:
        times = (
            poisson_arrivals(request_rate, seed=seed)
            if process == "poisson"
            else fixed_rate_arrivals(request_rate)
        )
        return (dataclasses.replace(r, arrival=t) for r, t in zip(requests, times, strict=False))
    scale = None if time_scale is None else check_time_scale(time_scale)
    return _rescaled(requests, scale)


def sim_requests(
    requests: Iterable[TraceRequest],
    *,
    prefill_only: bool = False,
    request_rate: float | None = None,
    time_scale: float | None = None,
    seed: int = 0,
    closed_loop: bool = True,
) -> Iterator[SimRequest]:
    """Trace requests as stamped simulator requests, as a cluster run takes them (the
    filler decoded; see :func:`~.requests.from_trace` and :func:`with_arrivals`)."""
    return with_arrivals(
        from_trace(
            requests, closed_loop=closed_loop, output_tokens=False, prefill_only=prefill_only
        ),
        request_rate=request_rate,
        time_scale=time_scale,
        seed=seed,
    )


def _rescaled(requests: Iterable[SimRequest], scale: float | None) -> Iterator[SimRequest]:
    first: float | None = None
    for r in requests:
        if r.arrival is None:
            raise SimInputError(
                f"request {r.id!r} has no arrival time; give a request rate instead"
            )
        if scale is None:
            yield r
            continue
        if first is None:
            first = r.arrival
        yield dataclasses.replace(r, arrival=(r.arrival - first) * scale)
