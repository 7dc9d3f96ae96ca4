"""Capacity anchors: the infinite-cache hit ratio, the working set that reaches it and the
knee, each in tokens, blocks and GiB; with ``--capacity-search`` found by bisection over
K-live replays, else the knee is the sweep's point farthest above its chord (Kneedle)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ..backends import BackendSpec, Bars, Scalar, min_capacity, roomy_capacity
from ..replay import ReplayError
from ..sim import CostProfile
from ..sim.runs import KLiveHits, RunRow, SweepHit
from ..workloads import Workload
from .k_live import replay_hit_ratio

__all__ = [
    "KNEE_SHARE",
    "PRECISION",
    "CapacityAnchor",
    "CapacitySearch",
    "knee",
    "smallest_reaching",
    "workload_anchors",
]

KNEE_SHARE = 0.98
"""The knee is the smallest capacity reaching this share of the infinite-cache hit ratio."""

PRECISION = 0.05
"""Each searched anchor is found to within this relative capacity."""

_EXACT = 1e-12  # hit ratios this close are equal


def knee(points: Sequence[tuple[int, float]]) -> tuple[int, float] | None:
    """The ``(capacity, hit ratio)`` point farthest above the chord, log capacity (``None``:
    fewer than three points, or none above it)."""
    pts = sorted(points)
    if len(pts) < 3:
        return None
    (c0, h0), (c1, h1) = pts[0], pts[-1]
    if h1 <= h0 or c1 <= c0:
        return None
    span = math.log(c1) - math.log(c0)
    best, above = None, 0.0
    for c, h in pts:
        gap = (h - h0) / (h1 - h0) - (math.log(c) - math.log(c0)) / span
        if gap > above:
            best, above = (c, h), gap
    return best


def smallest_reaching(
    hit_at: Callable[[int], float | None], low: int, high: int, target: float
) -> int:
    """The smallest capacity in ``(low, high]`` (within :data:`PRECISION`) whose hit ratio
    reaches ``target``, ``high`` reaching it and ``low`` not (``None`` misses)."""
    while high > low * (1 + PRECISION) and high - low > 1:
        mid = min(max(round(math.sqrt(low * high)), low + 1), high - 1)
        hit = hit_at(mid)
        if hit is not None and hit >= target - _EXACT:
            high = mid
        else:
            low = mid
    return high


class CapacitySearch:
    """One backend's K-live replays at the capacities a search asks for, each made once
    (``known``: ``(capacity, hit ratio)`` pairs measured before; ``None``: does not fit)."""

    def __init__(
        self, replay: Callable[[int], float | None], known: Iterable[tuple[int, float | None]] = ()
    ) -> None:
        self._replay = replay
        self.hits: dict[int, float | None] = dict(known)
        self.replays = 0

    def hit_at(self, capacity: int) -> float | None:
        """The hit ratio at ``capacity`` (replayed once, then remembered)."""
        if capacity not in self.hits:
            self.replays += 1
            self.hits[capacity] = self._replay(capacity)
        return self.hits[capacity]

    def anchors(self, infinite: float, tight: int, roomy: int) -> tuple[tuple[int, float], int]:
        """The knee (the smallest capacity reaching :data:`KNEE_SHARE` of ``infinite``, with
        its hit ratio) and the working set (the smallest reaching ``infinite``)."""
        working_set = self.smallest(infinite, tight, roomy)
        knee_at = self.smallest(KNEE_SHARE * infinite, tight, working_set)
        return (knee_at, self.hit_at(knee_at) or 0.0), working_set

    def smallest(self, target: float, tight: int, roomy: int) -> int:
        """The smallest capacity (within :data:`PRECISION`) reaching ``target``."""
        if target <= 0:
            return tight
        reached = {c for c, h in self.hits.items() if h is not None and h >= target - _EXACT}
        high = min((c for c in reached if c <= roomy), default=roomy)
        low = max((c for c in self.hits if c not in reached and c < high), default=tight - 1)
        low = max(1, low)
        return high if low >= high else smallest_reaching(self.hit_at, low, high, target)


@dataclass(frozen=True, slots=True)
class CapacityAnchor:
    """One backend's capacity anchors on one workload (tokens; ``None``: not found).

    ``infinite_capacity_tokens`` is the roomy capacity (nothing evicted), ``num_points`` the
    sweep's points the knee was looked for in, ``knee_rule`` how it was found.
    """

    workload: str
    backend: str
    block_size: int
    infinite_capacity_tokens: int
    infinite_hit_ratio: float
    knee_tokens: int | None
    knee_hit_ratio: float | None
    kv_bytes_per_token: int | None
    model: str
    num_points: int = 0
    working_set_tokens: int | None = None
    knee_rule: str = "kneedle"
    search_replays: int = 0

    def gib(self, tokens: int | None) -> float | None:
        """``tokens`` of KV in GiB (``None`` without the bytes per token)."""
        if tokens is None or not self.kv_bytes_per_token:
            return None
        return tokens * self.kv_bytes_per_token / 2**30

    def describe(self, tokens: int | None) -> str:
        """``"1,234,567 tokens = 77,160 blocks = 376.8 GiB"``."""
        if tokens is None:
            return "-"
        text = f"{tokens:,} tokens = {tokens // self.block_size:,} blocks"
        gib = self.gib(tokens)
        return text if gib is None else f"{text} = {gib:,.1f} GiB"

    def row(self) -> dict[str, Scalar]:
        """The anchors as one flat record."""

        def size(name: str, tokens: int | None) -> dict[str, Scalar]:
            blocks = None if tokens is None else tokens // self.block_size
            return {
                f"{name}_tokens": tokens,
                f"{name}_blocks": blocks,
                f"{name}_gib": self.gib(tokens),
            }

        return {
            "workload": self.workload,
            "backend": self.backend,
            "block_size": self.block_size,
            **size("infinite_capacity", self.infinite_capacity_tokens),
            "infinite_hit_ratio": self.infinite_hit_ratio,
            **size("knee", self.knee_tokens),
            "knee_hit_ratio": self.knee_hit_ratio,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_model": self.model,
            **size("working_set", self.working_set_tokens),
            "knee_rule": self.knee_rule,
            "search_replays": self.search_replays,
        }


def workload_anchors(
    workload: Workload,
    backends: Sequence[BackendSpec],
    runs: Sequence[RunRow],
    sweep: Sequence[RunRow],
    capacity_tokens: int,
    *,
    concurrency: int,
    search: bool,
    profile: CostProfile | None,
    bars: Bars | None,
) -> list[CapacityAnchor]:
    """Each backend's anchors, from its table run ``runs`` at ``capacity_tokens``, the
    sweep, and (``search``) more replays."""
    roomy = roomy_capacity(workload.stats, backends)
    tight = min_capacity(workload.stats, backends, concurrency)
    kv_bytes, model = (None, "") if profile is None else (profile.kv_bytes_per_token, profile.model)
    out = []
    for b, run in zip(backends, runs, strict=True):
        points = [
            (p.labels["capacity_tokens"], hit)
            for p in sweep
            if p.labels["backend"] == b.label and (hit := p.part(SweepHit).hit_ratio) is not None
        ]
        infinite = table_hit = run.part(KLiveHits).hit_ratio
        at_roomy = [h for c, h in points if c >= roomy]
        if capacity_tokens < roomy and at_roomy:  # the sweep's last point at or past roomy
            infinite = at_roomy[-1]
        elif capacity_tokens < roomy:  # else one more replay there
            infinite = replay_hit_ratio(workload, b, roomy, concurrency, bars, "1/1")[0]
        bend, working_set, rule, replays = knee(points), None, "kneedle", 0
        if search:
            finder = CapacitySearch(
                functools.partial(_hit_ratio, workload, b, concurrency, bars),
                [*points, (capacity_tokens, table_hit), (roomy, infinite)],
            )
            bend, working_set = finder.anchors(infinite, tight, roomy)
            rule, replays = f"{KNEE_SHARE:.0%} of the infinite-cache hit ratio", finder.replays
        knee_tokens, knee_hit = bend or (None, None)
        out.append(
            CapacityAnchor(
                workload.name,
                b.label,
                b.block_size,
                roomy,
                infinite,
                knee_tokens,
                knee_hit,
                kv_bytes,
                model,
                len(points),
                working_set,
                rule,
                replays,
            )
        )
    return out


def _hit_ratio(
    workload: Workload, spec: BackendSpec, concurrency: int, bars: Bars | None, capacity: int
) -> float | None:
    what = f"sweep {capacity:,} tok"
    try:
        return replay_hit_ratio(workload, spec, capacity, concurrency, bars, what)[0]
    except ReplayError:
        return None
