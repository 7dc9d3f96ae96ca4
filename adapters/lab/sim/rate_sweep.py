"""A request-rate sweep, one replica or a fleet at each rate: listed rates, or ``auto``
doubling from a rate with room to spare until each swept thing overloads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from .load import LoadSummary
from .profile import CostProfile

if TYPE_CHECKING:
    from ..traces import TraceStats

__all__ = [
    "MAX_AUTO_RATES",
    "Saturation",
    "rate_schedule",
    "saturation_of",
    "start_rate",
    "sweep_rates",
]

MAX_AUTO_RATES = 10
"""The most rates ``auto`` tries."""

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


def start_rate(stats: TraceStats, profile: CostProfile, max_num_batched_tokens: int) -> float:
    """The power of two at or below ``1 / t`` requests per second, ``t`` the mean
    request's time alone on one replica."""
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


def rate_schedule(first: float, listed: Iterable[float] = (), *, auto: bool = False) -> list[float]:
    """The rates a sweep tries, ascending: ``first`` doubling (``auto``), else ``first``
    and ``listed``, each once."""
    if auto:
        return [first * 2**k for k in range(MAX_AUTO_RATES)]
    return sorted({first, *listed})


def sweep_rates(
    keys: Sequence[K],
    rates: Sequence[float],
    run: Callable[[K, float], R | None],
    overloaded: Callable[[R], bool],
    *,
    auto: bool = False,
    done: Mapping[tuple[K, float], R] | None = None,
) -> Iterator[R]:
    """Run every key at every rate, rate by rate, yielding each new run.

    ``run(key, rate)`` makes one (``None``: left out). With ``auto`` a key stops after
    its first overloaded run. ``done``'s runs are not run again nor yielded, but count.
    """
    made = done or {}
    busy = list(keys)
    for rate in rates:
        for key in list(busy):
            result = made.get((key, rate))
            if result is None:
                result = run(key, rate)
                if result is None:
                    continue
                yield result
            if auto and overloaded(result):
                busy.remove(key)
        if not busy:
            return


@dataclass(frozen=True, slots=True)
class Saturation:
    """Where one swept thing saturates: the highest offered rate served without
    overload and the rate achieved there, the lowest that overloaded it, the best
    goodput and its rate (``None``: no such rate, or no SLO)."""

    name: str
    sustained_rate: float | None
    sustained_achieved: float | None
    overloaded_rate: float | None
    best_goodput: float | None
    best_goodput_rate: float | None

    def describe(self) -> str:
        """One line, e.g. ``"p: served up to 4 req/s offered without overload ..."``."""
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
        text = f"{self.name}: {served}"
        if self.best_goodput is not None and self.best_goodput_rate is not None:
            text += (
                f"; best goodput {self.best_goodput:.3g} req/s at {self.best_goodput_rate:g} req/s"
            )
        return text


def saturation_of(points: Iterable[tuple[str, float, LoadSummary]]) -> list[Saturation]:
    """Per name, in first-seen order, where its ``(name, rate, load)`` points saturate."""
    groups: dict[str, list[tuple[float, LoadSummary]]] = {}
    for name, rate, load in points:
        groups.setdefault(name, []).append((rate, load))
    out = []
    for name, group in groups.items():
        group.sort(key=lambda p: p[0])
        ok = [(r, s) for r, s in group if not s.overloaded]
        hot = [r for r, s in group if s.overloaded]
        scored = [(r, s) for r, s in group if s.goodput is not None]
        best = max(scored, key=lambda p: p[1].goodput or 0.0, default=None)
        out.append(
            Saturation(
                name=name,
                sustained_rate=ok[-1][0] if ok else None,
                sustained_achieved=ok[-1][1].achieved_rate if ok else None,
                overloaded_rate=min(hot, default=None),
                best_goodput=None if best is None else best[1].goodput,
                best_goodput_rate=None if best is None else best[0],
            )
        )
    return out
