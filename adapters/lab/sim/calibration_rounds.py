"""Several calibration rounds of one server, combined into one profile.

One calibration on a small, shared machine is not repeatable. :func:`pool_rounds` fits
one profile to rounds that keep their samples: each round's *speed* is the median over
its shapes of the log of its time over the shape's median across rounds; with three or
more rounds, one whose speed lies more than :data:`OUTLIER_MADS` scaled MADs (and
:data:`MIN_OUTLIER`) from the median is dropped; each shape's time is the median over
the rounds kept, and the serving path's samples are pooled. ``fit["rounds"]`` says how
spread the rounds were.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from .calibration import StepSample
from .errors import ProfileError
from .profile import CostProfile
from .server_calibration import KEPT_FIELDS, fit_server, kept_samples
from .serving_path import HopSamples

__all__ = ["pool_rounds", "round_speeds"]

OUTLIER_MADS = 3.0
"""A round this many scaled MADs from the rounds' median speed is an outlier."""

MIN_OUTLIER = 0.10
"""... and at least this far (in log speed): rounds closer than that agree."""

_Shape = tuple[StepSample, int]
"""A sample's work (its seconds set to 0) and which of its round's samples of that work
it is (a sweep may measure one shape twice)."""


def _shapes(samples: Sequence[StepSample]) -> list[tuple[_Shape, float]]:
    seen: dict[StepSample, int] = {}
    out = []
    for s in samples:
        work = s._replace(seconds=0.0, runs=1)
        seen[work] = seen.get(work, -1) + 1
        out.append(((work, seen[work]), s.seconds))
    return out


def round_speeds(rounds: Sequence[Sequence[StepSample]]) -> list[float]:
    """Each round's speed against the others (0: typical, +0.2: about 22% slower)."""
    medians = _shape_medians(rounds)
    return [
        statistics.median(math.log(t / medians[k]) for k, t in _shapes(r)) if r else 0.0
        for r in rounds
    ]


def _by_shape(rounds: Sequence[Sequence[StepSample]]) -> dict[_Shape, list[float]]:
    by_shape: dict[_Shape, list[float]] = {}
    for r in rounds:
        for k, t in _shapes(r):
            by_shape.setdefault(k, []).append(t)
    return by_shape


def _shape_medians(rounds: Sequence[Sequence[StepSample]]) -> dict[_Shape, float]:
    return {k: statistics.median(v) for k, v in _by_shape(rounds).items()}


def _outliers(speeds: Sequence[float]) -> list[bool]:
    if len(speeds) < 3:
        return [False] * len(speeds)
    center = statistics.median(speeds)
    mad = 1.4826 * statistics.median(abs(v - center) for v in speeds)
    limit = max(OUTLIER_MADS * mad, MIN_OUTLIER)
    return [abs(v - center) > limit for v in speeds]


def pool_rounds(profiles: Sequence[CostProfile], *, name: str | None = None) -> CostProfile:
    """One profile fitted to several calibration rounds of the same server; the first
    round's name, provenance and range are kept.

    Raises:
        ProfileError: no rounds; a round that keeps no samples (not made by
            ``calibrate --server``); rounds of different servers' pools or block sizes.
    """
    if not profiles:
        raise ProfileError("no calibration rounds to pool")
    first = profiles[0]
    for p in profiles[1:]:
        if (p.kv_cache_tokens, p.measured_on.get("block_size")) != (
            first.kv_cache_tokens,
            first.measured_on.get("block_size"),
        ):
            raise ProfileError(
                f"profile {p.name!r} was measured on another pool or block size than "
                f"{first.name!r}: only rounds of one server pool"
            )
    kept = [kept_samples(p) for p in profiles]
    steps = [k[0] for k in kept]
    speeds = round_speeds(steps)
    out = _outliers(speeds)
    use = [i for i, bad in enumerate(out) if not bad]
    medians = _shape_medians([steps[i] for i in use])
    runs: dict[_Shape, int] = {}
    for i in use:
        for (shape, _), sample in zip(_shapes(steps[i]), steps[i], strict=True):
            runs[shape] = runs.get(shape, 0) + sample.runs
    pooled_steps = [
        work._replace(seconds=t, runs=runs[(work, j)]) for (work, j), t in medians.items()
    ]
    hops = [h for i in use if (h := kept[i][1]) is not None]
    pooled_hops = None
    if hops:
        pooled_hops = HopSamples(
            *([x for h in hops for x in getattr(h, f)] for f in HopSamples._fields)
        )
    described = {k: getattr(first, k) for k in KEPT_FIELDS}
    if name is not None:
        described["name"] = name
    profile = fit_server(pooled_steps, pooled_hops, **described)
    rounds = _describe(profiles, steps, speeds, out, use)
    return dataclasses.replace(profile, fit={**profile.fit, "rounds": rounds})


def _describe(
    profiles: Sequence[CostProfile],
    steps: Sequence[Sequence[StepSample]],
    speeds: Sequence[float],
    out: Sequence[bool],
    use: Sequence[int],
) -> dict[str, Any]:
    by_shape = _by_shape([steps[i] for i in use])
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in by_shape.values() if len(v) > 1]
    return {
        "count": len(profiles),
        "kept": len(use),
        "per_round": [
            {
                "name": p.name,
                "date": p.measured_on.get("date", ""),
                "speed_log": round(v, 4),
                "step_s": p.step_s,
                "admit_s": p.admit_s,
                "request_s": p.request_s,
                "dropped": "an outlier: its speed is far from the other rounds'" if bad else "",
            }
            for p, v, bad in zip(profiles, speeds, out, strict=True)
        ],
        "shape_spread_median": round(statistics.median(spreads), 4) if spreads else None,
        "shape_spread_max": round(max(spreads), 4) if spreads else None,
        "rule": (
            f"a round more than {OUTLIER_MADS:g} scaled MADs and {MIN_OUTLIER:.0%} (log) "
            "from the rounds' median speed is dropped; each shape's seconds are the median "
            "over the rounds kept; the serving path's samples are pooled"
        ),
    }
