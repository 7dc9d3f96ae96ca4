"""How the engine core's pace drifts over time, from the serving path's lone decodes.

The step model prices a step by its work; a served engine on a shared machine runs
the same step faster or slower from one moment to the next (other processes, clock
frequency). On a 2-core CPU vLLM the calibration's lone 32-token requests, seconds
apart, took 0.7x to 1.36x their median time per token in the engine core (vLLM's
``vllm:request_decode_time_seconds``), and a recorded sweep's TPOT p90 / p50 was
1.25-1.37 where a fixed pace gave 1.04-1.12: TPOT p90 19-33% low.

So the calibration keeps the spread of that pace (:func:`pace_table`): quantiles (at
:data:`~.serving_spread.QUANTILES`) of each lone request's engine decode time per
token over the median of its shape's, and the window it holds over
(:func:`pace_window`: the median of those requests' decode time, the span one pace
was measured over). The simulator scales each step by the factor of the window its
start lies in (:func:`step_pace`), drawn from the table by the window's index, so
a run stays a pure function of its inputs. A request spanning several windows
averages their factors, as a real request averages the pace it met.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from .serving_path import HopSample
from .serving_spread import draw_fraction, quantile_table, spread_at

__all__ = ["StepPace", "pace_ratios", "pace_table", "pace_window", "step_pace"]


def _lone_decodes(lone: Sequence[HopSample]) -> list[HopSample]:
    return [
        s
        for s in lone
        if s.engine_decode_s is not None and s.engine_decode_s > 0 and s.num_tokens > 1
    ]


def pace_ratios(lone: Sequence[HopSample]) -> list[float]:
    """Each request of ``lone`` whose engine decode time the server said: its decode
    seconds per token over the median of those of its shape (prompt tokens, tokens
    decoded); 1 is the typical pace."""
    by_shape: dict[tuple[int, int], list[float]] = {}
    for s in _lone_decodes(lone):
        assert s.engine_decode_s is not None
        by_shape.setdefault((s.prompt_tokens, s.num_tokens), []).append(
            s.engine_decode_s / (s.num_tokens - 1)
        )
    out: list[float] = []
    for paces in by_shape.values():
        mid = statistics.median(paces)
        out.extend(p / mid for p in paces)
    return out


def pace_table(lone: Sequence[HopSample]) -> tuple[float, ...]:
    """The quantiles of :func:`pace_ratios` (empty under three requests: no spread
    to speak of)."""
    ratios = pace_ratios(lone)
    return quantile_table(ratios) if len(ratios) >= 3 else ()


def pace_window(lone: Sequence[HopSample]) -> float:
    """The median engine decode seconds of the requests :func:`pace_table` reads (0:
    none)."""
    times = [s.engine_decode_s for s in _lone_decodes(lone)]
    return statistics.median(t for t in times if t is not None) if times else 0.0


StepPace = Callable[[float], float]
"""``step start (s) -> factor`` a step's priced time is multiplied by."""


def step_pace(table: Sequence[float], window_s: float) -> StepPace:
    """The pace factor at a time: the table's value at the fraction the window's index
    draws; 1 everywhere without a table or a window."""
    if not table or not window_s > 0 or not math.isfinite(window_s):
        return lambda _t: 1.0

    def pace(t: float) -> float:
        return spread_at(table, draw_fraction(f"pace:{math.floor(t / window_s)}"))

    return pace
