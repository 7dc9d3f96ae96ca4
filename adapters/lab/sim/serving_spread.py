"""How the serving path and the engine's pace vary request to request.

A calibration keeps quantile tables (at :data:`QUANTILES`) of what a request spent
outside the engine core (sent to an idle server, to a busy one, and decoding after a
pause) and of the engine's pace (lone decodes' time per token over their median). The
simulator draws from them by a hash of the request id (:func:`serving_delay`) or of the
time window a step starts in (:func:`step_pace`), so a run stays a pure function of its
inputs.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .serving_path import HopSample

__all__ = [
    "BURST_TPOT_S",
    "QUANTILES",
    "ServingDelay",
    "draw_fraction",
    "is_burst",
    "pace_ratios",
    "pace_table",
    "pace_window",
    "quantile_table",
    "serving_delay",
    "spread_at",
    "step_pace",
]

QUANTILES = tuple(k / 20 for k in range(21))
"""The probabilities a spread table gives the quantiles at: 0, 5%, ..., 100%."""

BURST_TPOT_S = 1e-4
"""A stream whose chunks reached the client this close together was read from a backlog."""


def is_burst(sample: HopSample) -> bool:
    """Whether the client read ``sample``'s stream of several tokens in one burst (its
    own stall, not the server's time)."""
    n = sample.num_tokens - 1
    return n > 0 and sample.client_decode_s / n < BURST_TPOT_S


def quantile_table(values: Sequence[float]) -> tuple[float, ...]:
    """The quantiles of ``values`` at :data:`QUANTILES` (numpy's linear), each at least 0."""
    if not values:
        return ()
    import numpy as np  # a calibration's step: the simulator imports without numpy

    xs = np.maximum(np.asarray(values, dtype=float), 0.0)
    return tuple(float(x) for x in np.quantile(xs, QUANTILES))


def draw_fraction(key: str) -> float:
    """A number in ``[0, 1)`` that ``key`` fixes, uniform over keys (a hash)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, person=b"prefixkv-spread").digest()
    return int.from_bytes(digest, "little") / 2.0**64


def spread_at(table: Sequence[float], u: float) -> float:
    """A quantile ``table``'s value at probability ``u``, linear between its points."""
    if len(table) != len(QUANTILES):
        raise ValueError(f"a spread table has {len(QUANTILES)} quantiles, got {len(table)}")
    pos = min(max(u, 0.0), 1.0) * (len(table) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(table) - 1)
    return float(table[lo] + (table[hi] - table[lo]) * (pos - lo))


ServingDelay = Callable[[str, bool, bool], float]
"""``(request id, sent while busy, decodes more than one token) -> seconds`` outside the engine."""


def serving_delay(
    request_s: float,
    idle: Sequence[float] = (),
    busy: Sequence[float] = (),
    decoding: Sequence[float] = (),
) -> ServingDelay:
    """Each request's time outside the engine: drawn by its id from the table of the
    engine's state when it was sent (``busy`` falls back to ``idle``; a request that goes
    on decoding, sent to an idle engine, draws from ``decoding`` where there is one), or
    ``request_s`` where there is no table."""
    busy = busy or idle

    def delay(request_id: str, is_busy: bool, continues: bool) -> float:
        table = busy if is_busy else (decoding if continues and decoding else idle)
        return spread_at(table, draw_fraction(request_id)) if table else request_s

    return delay


def _lone_decodes(lone: Sequence[HopSample]) -> list[tuple[HopSample, float]]:
    # The requests that decoded on, with the engine's decode seconds (where it timed them).
    return [
        (s, s.engine_decode_s)
        for s in lone
        if s.engine_decode_s is not None and s.engine_decode_s > 0 and s.num_tokens > 1
    ]


def pace_ratios(lone: Sequence[HopSample]) -> list[float]:
    """Each request's engine decode seconds per token over the median of its shape's
    (prompt tokens, tokens decoded), for those the server timed; 1 is the typical pace."""
    by_shape: dict[tuple[int, int], list[float]] = {}
    for s, seconds in _lone_decodes(lone):
        by_shape.setdefault((s.prompt_tokens, s.num_tokens), []).append(
            seconds / (s.num_tokens - 1)
        )
    out: list[float] = []
    for paces in by_shape.values():
        mid = statistics.median(paces)
        out.extend(p / mid for p in paces)
    return out


def pace_table(lone: Sequence[HopSample]) -> tuple[float, ...]:
    """The quantiles of :func:`pace_ratios` (empty under three requests)."""
    ratios = pace_ratios(lone)
    return quantile_table(ratios) if len(ratios) >= 3 else ()


def pace_window(lone: Sequence[HopSample]) -> float:
    """The median engine decode seconds of the requests :func:`pace_table` reads (0: none)."""
    times = [seconds for _, seconds in _lone_decodes(lone)]
    return statistics.median(times) if times else 0.0


def step_pace(table: Sequence[float], window_s: float) -> Callable[[float], float]:
    """``step start (s) -> factor`` a step's priced time is multiplied by: the table's
    value drawn by the window's index; 1 everywhere without a table or a window."""
    if not table or not window_s > 0 or not math.isfinite(window_s):
        return lambda _t: 1.0

    def pace(t: float) -> float:
        return spread_at(table, draw_fraction(f"pace:{math.floor(t / window_s)}"))

    return pace
