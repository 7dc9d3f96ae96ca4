"""Arrival processes: when each request of an arrival-time replay reaches the engine.

Three ways, as in vLLM's ``benchmark_serving`` and SGLang's ``bench_serving``: a
Poisson process at a request rate (seeded, so a seed names the arrival pattern), a
fixed rate (evenly spaced), or a trace's own timestamps stretched or squeezed by a
time scale. All run lazily, so a streamed trace never sits in memory.

:func:`sim_requests` turns trace requests into stamped simulator requests in one call,
as a cluster run takes them: decoded tokens are the filler token (no later prompt
quotes them in a hash-id trace), and ``prefill_only`` keeps one output token, as
Mooncake's cache experiments do ("restrict all request outputs to 1", FAST'25 section
5.3.2) and as its prefill pool sees requests.
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
    "MAX_REQUEST_RATE",
    "MAX_TIME_SCALE",
    "MIN_REQUEST_RATE",
    "MIN_TIME_SCALE",
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
"""The request-rate processes :func:`with_arrivals` knows."""


MIN_REQUEST_RATE, MAX_REQUEST_RATE = 1e-9, 1e9
"""Requests per second: one in 30 years to a billion a second. Outside, arrival times
overflow to infinity or collapse onto one instant."""

MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-9, 1e9
"""The factor on a trace's timestamps, for the same reason."""


def _bounded(name: str, value: object, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise SimSettingsError(  # NaN and infinity compare out of range too
            f"{name} must be a finite number > 0, in [{low:g}, {high:g}], got {value!r:.60}"
        )
    return float(value)


def check_request_rate(value: object) -> float:
    """``value`` as a request rate (requests per second).

    Raises:
        SimSettingsError: not a number in ``[MIN_REQUEST_RATE, MAX_REQUEST_RATE]``.
    """
    return _bounded("request rate", value, MIN_REQUEST_RATE, MAX_REQUEST_RATE)


def check_time_scale(value: object) -> float:
    """``value`` as a time scale (a factor on a trace's timestamps).

    Raises:
        SimSettingsError: not a number in ``[MIN_TIME_SCALE, MAX_TIME_SCALE]``.
    """
    return _bounded("time scale", value, MIN_TIME_SCALE, MAX_TIME_SCALE)


def poisson_arrivals(rate: float, *, seed: int = 0) -> Iterator[float]:
    """Endless arrival times of a Poisson process: the first at 0, then exponential gaps.

    Args:
        rate: requests per second.
        seed: seeds the gaps (``random.Random(seed)``); equal seeds, equal times.

    Raises:
        SimSettingsError: a rate out of ``[MIN_REQUEST_RATE, MAX_REQUEST_RATE]``.
    """
    lam = check_request_rate(rate)
    return _poisson(lam, random.Random(seed))


def _poisson(lam: float, rng: random.Random) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(lam)


def fixed_rate_arrivals(rate: float) -> Iterator[float]:
    """Endless evenly spaced arrival times ``0, 1/rate, 2/rate, ...``.

    Raises:
        SimSettingsError: a rate out of ``[MIN_REQUEST_RATE, MAX_REQUEST_RATE]``.
    """
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
    """Stamp requests with arrival times (lazily, in order).

    Args:
        requests: the requests, in arrival order.
        request_rate: requests per second from ``process``; replaces any arrival
            the requests carry.
        time_scale: keep the requests' own arrivals, relative to the first,
            multiplied by this.
        process: ``"poisson"`` (seeded) or ``"fixed"`` (evenly spaced).
        seed: the Poisson process's seed.

    With neither ``request_rate`` nor ``time_scale`` the requests' arrivals are used
    as they are.

    Raises:
        SimSettingsError: both knobs given, a bad rate, scale or process (at once).
        SimInputError: a request without an arrival where one is needed (when it
            is reached).
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
    """The simulator's requests, stamped with arrival times, lazily, in arrival order.

    Closed loop, a turn names the request it follows (its ``parent``, or else the
    previous request of its ``session``) and its think time, and the cluster run
    routes it once that one finished.

    Args:
        requests: trace requests in arrival order.
        prefill_only: one output token each (Mooncake's prefill pool).
        request_rate: Poisson arrivals at this rate (seeded) instead of the trace's.
        time_scale: the trace's timestamps times this (``< 1`` is more load).
        seed: the Poisson process's seed.
        closed_loop: link each session's turns (see above); ``False``: open loop.

    Raises:
        SimSettingsError: both a rate and a scale, or a bad one.
        SimInputError: a request without an arrival where the trace's are used.
    """
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
