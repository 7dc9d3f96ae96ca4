"""Several calibration rounds of one server, combined into one profile.

One calibration of a served engine on a small, shared machine is not repeatable: five
rounds of ``calibrate --server`` against the same 2-core CPU vLLM, minutes apart,
timed the same one-request prefill 36-64% apart (max - min over median), and their step
fits said ``step_s`` 3.9 to 9.2 ms, while the server's TPOT over the same minutes moved
by 7%. A rate predicted from one round is off by as much as that round was.

:func:`pool_rounds` combines rounds (profiles that keep their samples:
``calibrate --server``'s) into one fit:

- each round's *speed* is the median, over the sweep's shapes, of the log of its time
  over the shape's median time across rounds; a round whose speed lies more than
  :data:`OUTLIER_MADS` scaled median absolute deviations from the rounds' median speed
  (and more than :data:`MIN_OUTLIER` from it: rounds that agree this well all count) is
  dropped. With fewer than three rounds none is dropped (no majority to say which);
- each shape's time is the median over the rounds kept, so a burst that held one
  round's streams (a decode run timed 6x its usual) is outvoted; it stands for the
  runs of all of them (the fit weighs it by their number's square root);
- the serving path's samples (the one-at-a-time requests) are pooled: the spreads and
  ``admit_s`` come from all of them;
- the profile says how spread the rounds were (``fit["rounds"]``): each round's speed
  and fitted ``step_s``, the rounds dropped and why, and the median over shapes of
  each shape's spread across the rounds kept.

The shapes of a round are its samples' work (everything but the seconds): rounds of
the same sweep on the same server measure the same shapes; a shape only some rounds
measured is the median of those.
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

__all__ = ["MIN_OUTLIER", "OUTLIER_MADS", "pool_rounds", "round_speeds"]

OUTLIER_MADS = 3.0
"""A round this many scaled MADs (1.4826 x the median absolute deviation, the standard
deviation of normal noise) from the rounds' median speed is an outlier."""

MIN_OUTLIER = 0.10
"""... and at least this far (in log speed, about 10%): rounds closer than that agree."""

_Shape = tuple[StepSample, int]
"""A sample's work (the sample with its seconds set to 0) and which of its round's
samples of that work it is (a sweep may measure one shape twice: a 16-token prompt
with no prefix and with half of it cached, which rounds down to no block)."""


def _shapes(samples: Sequence[StepSample]) -> list[tuple[_Shape, float]]:
    seen: dict[StepSample, int] = {}
    out = []
    for s in samples:
        work = s._replace(seconds=0.0, runs=1)
        seen[work] = seen.get(work, -1) + 1
        out.append(((work, seen[work]), s.seconds))
    return out


def round_speeds(rounds: Sequence[Sequence[StepSample]]) -> list[float]:
    """Each round's speed against the others: the median over its shapes of
    ``log(its seconds / the shape's median seconds over all rounds)`` (0: typical,
    +0.2: about 22% slower)."""
    medians = _shape_medians(rounds)
    return [
        statistics.median(math.log(t / medians[k]) for k, t in _shapes(r)) if r else 0.0
        for r in rounds
    ]


def _shape_medians(rounds: Sequence[Sequence[StepSample]]) -> dict[_Shape, float]:
    by_shape: dict[_Shape, list[float]] = {}
    for r in rounds:
        for k, t in _shapes(r):
            by_shape.setdefault(k, []).append(t)
    return {k: statistics.median(v) for k, v in by_shape.items()}


def _outliers(speeds: Sequence[float]) -> list[bool]:
    """Which rounds' speeds are outliers (see the module docstring)."""
    if len(speeds) < 3:
        return [False] * len(speeds)
    center = statistics.median(speeds)
    mad = 1.4826 * statistics.median(abs(v - center) for v in speeds)
    limit = max(OUTLIER_MADS * mad, MIN_OUTLIER)
    return [abs(v - center) > limit for v in speeds]


def pool_rounds(profiles: Sequence[CostProfile], *, name: str | None = None) -> CostProfile:
    """One profile fitted to several calibration rounds of the same server (see the
    module docstring); the first round's name, provenance and range are kept.

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
    """How spread the rounds were (the profile's ``fit["rounds"]``)."""
    by_shape: dict[_Shape, list[float]] = {}
    for i in use:
        for k, t in _shapes(steps[i]):
            by_shape.setdefault(k, []).append(t)
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
