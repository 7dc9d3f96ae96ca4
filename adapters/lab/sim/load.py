"""Offered vs achieved load, overload and goodput, from a timed run's per-request records.

What ``vllm bench serve`` and genai-perf report beside the latencies, computed from
the records any timed run produces (:class:`~.metrics.RequestRow`), so that a
replica, a fleet and a closed-loop run say the same things the same way:

- **offered rate**: requests per second of the arrival window, ``n / (last arrival -
  first arrival)``, from the arrival times asked for (a request rate, or the
  trace's timestamps times a scale). Closed loop, a session's turn is sent later
  than that (after its previous answer plus think time), so the **sent rate** (the
  same figure over the times the requests were really sent) can be lower.
- **achieved rate**: finished requests per second from the first arrival to the last
  finish (``vllm bench serve``'s request throughput). ``achieved <= sent <=
  offered`` by construction.
- **goodput** under a service-level objective: finished requests per second of the
  same window that met every given bound (TTFT, TPOT, end-to-end latency), as
  ``vllm bench serve --goodput``: a request with one output token has TPOT 0.

**Overloaded** (queues grow without bound) when both hold, over at least
:data:`MIN_REQUESTS` requests:

1. the achieved rate falls short of the sent rate by more than the margin ``m``
   (:data:`OVERLOAD_MARGIN`, 10%): ``sent > (1 + m) x achieved``;
2. the waiting grows through the run: the least-squares slope of each request's
   queueing delay (sent to first scheduled) against its send time exceeds ``m``
   seconds of waiting per second of run.

A single queue offered ``lambda`` and serving ``mu < lambda`` makes the n-th request
wait about ``t_n (lambda / mu - 1)``: both figures then read ``lambda / mu - 1``, so
the two tests agree on a real overload. Each alone has false alarms that the other
rules out: a short run whose last answers come long after its last arrival fails the
first but not the second; a burst that the replica drains fails the second but not
the first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .errors import SimSettingsError
from .metrics import RequestRow

__all__ = [
    "MIN_REQUESTS",
    "OVERLOAD_MARGIN",
    "LoadSummary",
    "Slo",
    "least_squares_slope",
    "summarize_load",
]

OVERLOAD_MARGIN = 0.1
"""How far the achieved rate may fall short of the sent rate, and how fast waiting
may grow (seconds per second), before a run is called overloaded."""

MIN_REQUESTS = 8
"""Fewer finished requests say nothing about a trend: never overloaded."""


@dataclass(frozen=True, slots=True)
class Slo:
    """A service-level objective: the bounds a request must meet to count as good.

    Attributes:
        ttft_s: time to first token at most this (``None``: no bound).
        tpot_s: time per output token after the first at most this.
        e2e_s: end-to-end latency at most this.

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
        parts = [
            f"{name} <= {_ms(b)}"
            for name, b in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("E2E", self.e2e_s))
            if b is not None
        ]
        return ", ".join(parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:g} ms"


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of ``ys`` against ``xs`` (NaN for fewer than two
    points or no spread in ``xs``)."""
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
    """A timed run's load (see the module docstring for each figure).

    Attributes:
        num_requests: finished requests.
        offered_rate: requests per second asked for (NaN: one request, or all at once).
        sent_rate: requests per second as sent (closed loop: after each previous turn).
        achieved_rate: finished requests per second, first arrival to last finish.
        waiting_growth: least-squares slope of queueing delay against send time
            (seconds of waiting per second of run; near 0 in a steady state).
        overloaded: the queues grow without bound.
        closed_loop: sessions waited for their previous turn.
        slo: the objective's text (empty: none).
        good_requests: requests that met it (``None``: no objective).
        goodput: those per second of the run (``None``: no objective).
    """

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
        """Closed-loop sessions sent requests more than the margin below the offered rate."""
        return self.closed_loop and self.sent_rate < self.offered_rate / (1 + OVERLOAD_MARGIN)

    def as_row(self) -> dict[str, float | int | bool | str | None]:
        """The columns a run's row gains."""
        return {
            "offered_rate": self.offered_rate,
            "sent_rate": self.sent_rate,
            "achieved_rate": self.achieved_rate,
            "waiting_growth": self.waiting_growth,
            "overloaded": self.overloaded,
            "slo": self.slo,
            "good_requests": self.good_requests,
            "goodput": self.goodput,
        }

    def verdict(self) -> str:
        """One line: ``"offered 2 req/s, achieved 0.111 req/s: overloaded (waiting grows
        17.0 s per s of run)"``, or why the achieved rate is lower without overload."""
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
    """Fold finished requests' records into a :class:`LoadSummary`.

    Args:
        records: the run's finished requests.
        offered_arrivals: the arrival times asked for, when they differ from the
            records' (closed loop); default the records' own.
        slo: count goodput under this objective.
        closed_loop: say so in :meth:`LoadSummary.verdict`.
    """
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
    return LoadSummary(
        num_requests=n,
        offered_rate=offered,
        sent_rate=sent_rate,
        achieved_rate=achieved,
        waiting_growth=growth,
        overloaded=overloaded,
        closed_loop=closed_loop,
        slo="" if slo is None else slo.describe(),
        good_requests=good,
        goodput=goodput,
    )
