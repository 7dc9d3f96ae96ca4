"""Offered vs achieved load, overload and goodput, from a timed run's request records.

As ``vllm bench serve``: offered rate over the arrivals asked for, sent rate over the
times sent (closed loop: later), achieved rate to the last finish, goodput of requests
that met an SLO. **Overloaded**: over :data:`MIN_REQUESTS` or more, ``sent > (1 + m) x
achieved`` and queueing delay grows faster than ``m`` s per s (``m`` 10%); a queue
offered ``lambda`` serving ``mu`` reads ``lambda / mu - 1`` on both, and each rules
out the other's false alarms.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from .errors import SimSettingsError
from .metrics import RequestRow

__all__ = ["MIN_REQUESTS", "LoadSummary", "Slo", "least_squares_slope", "summarize_load"]

OVERLOAD_MARGIN = 0.1
"""The margin ``m`` of both overload tests."""

MIN_REQUESTS = 8
"""Fewer finished requests say nothing about a trend: never overloaded."""


@dataclass(frozen=True, slots=True)
class Slo:
    """A service-level objective: upper bounds in seconds.

    Raises:
        SimSettingsError: a bound that is not a finite number > 0, or none given.
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        bounds = (self.ttft_s, self.tpot_s, self.e2e_s)
        if all(b is None for b in bounds):
            raise SimSettingsError("an SLO needs a TTFT, TPOT or end-to-end bound")
        for name, b in zip(("ttft_s", "tpot_s", "e2e_s"), bounds, strict=True):
            if b is not None and (
                isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < math.inf
            ):
                raise SimSettingsError(
                    f"SLO {name} must be a finite number of seconds > 0, got {b!r}"
                )

    def met(self, r: RequestRow) -> bool:
        """Whether ``r`` meets every bound (a one-token output has TPOT 0)."""
        if self.ttft_s is not None and not r.ttft_s <= self.ttft_s:
            return False
        if self.tpot_s is not None:
            tpot = 0.0 if r.output_tokens < 2 else r.tpot_s
            if not tpot <= self.tpot_s:
                return False
        return self.e2e_s is None or r.e2e_s <= self.e2e_s

    def describe(self) -> str:
        """``"TTFT <= 500 ms, TPOT <= 50 ms"``."""
        bounds = (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2E", self.e2e_s))
        return ", ".join(f"{name} <= {b * 1e3:g} ms" for name, b in bounds if b is not None)


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs`` (NaN without two distinct xs)."""
    n = len(xs)
    if n < 2:
        return math.nan
    mx = math.fsum(xs) / n
    my = math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return math.nan
    return math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def _window_rate(n: int, first: float, last: float) -> float:
    span = last - first
    return n / span if n >= 2 and span > 0 else math.nan


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """A timed run's load (the figures of the module docstring; rates in requests per
    second, NaN where undefined; ``waiting_growth`` the queueing-delay slope; the SLO
    fields empty or ``None`` without an objective)."""

    num_requests: int
    offered_rate: float
    sent_rate: float
    achieved_rate: float
    waiting_growth: float
    overloaded: bool
    closed_loop: bool = False
    slo: str = ""
    good_requests: int | None = None
    goodput: float | None = None

    @property
    def held_back(self) -> bool:
        """Closed-loop sessions sent more than the margin below the offered rate."""
        return self.closed_loop and self.sent_rate < self.offered_rate / (1 + OVERLOAD_MARGIN)

    def as_row(self) -> dict[str, float | int | bool | str | None]:
        """The columns a run's row gains."""
        return {k: v for k, v in asdict(self).items() if k not in ("num_requests", "closed_loop")}

    def verdict(self) -> str:
        """One line: the offered and achieved rates and whether it is overloaded."""
        text = f"offered {_rate(self.offered_rate)}, achieved {_rate(self.achieved_rate)}"
        if self.overloaded:
            return (
                f"{text}: overloaded (queues grow without bound: waiting grows "
                f"{self.waiting_growth:.3g} s per s of run)"
            )
        if self.held_back:
            return (
                f"{text}: closed loop, sessions sent {_rate(self.sent_rate)} (each turn waits "
                "for its previous answer plus think time); not overloaded"
            )
        return f"{text}: not overloaded"


def _rate(value: float) -> str:
    return "- req/s" if math.isnan(value) else f"{value:.3g} req/s"


def summarize_load(
    records: Iterable[RequestRow],
    *,
    offered_arrivals: Sequence[float] | None = None,
    slo: Slo | None = None,
    closed_loop: bool = False,
) -> LoadSummary:
    """Fold finished requests' records into a :class:`LoadSummary`; ``offered_arrivals``
    are the arrival times asked for where they differ from the records' (closed loop)."""
    recs = sorted(records, key=lambda r: r.arrival_s)
    n = len(recs)
    if not recs:
        return LoadSummary(0, math.nan, math.nan, math.nan, math.nan, False, closed_loop)
    sent = [r.arrival_s for r in recs]
    start, end = sent[0], max(r.finish_s for r in recs)
    asked = sorted(offered_arrivals) if offered_arrivals else sent
    offered = _window_rate(len(asked), asked[0], asked[-1])
    sent_rate = _window_rate(n, sent[0], sent[-1])
    duration = end - start
    achieved = n / duration if duration > 0 else math.nan
    growth = least_squares_slope(sent, [r.queueing_delay_s for r in recs])
    overloaded = (
        n >= MIN_REQUESTS
        and sent_rate > (1 + OVERLOAD_MARGIN) * achieved
        and growth > OVERLOAD_MARGIN
    )
    good = None if slo is None else sum(slo.met(r) for r in recs)
    goodput = None if good is None else (good / duration if duration > 0 else math.nan)
    text = "" if slo is None else slo.describe()
    return LoadSummary(
        n, offered, sent_rate, achieved, growth, overloaded, closed_loop, text, good, goodput
    )
