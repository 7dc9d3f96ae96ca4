"""Anchors for choosing a capacity: the infinite-cache hit ratio, the working set that
reaches it and the knee of the hit-vs-capacity curve, each in tokens, blocks and GiB.

The infinite-cache hit ratio is a backend's K-live hit ratio at the roomy capacity
(every request's KV at once: nothing is evicted), the most any capacity can give it.
The working set is the smallest capacity that reaches it, and the knee the smallest
that reaches 98% of it, both found by bisection over replays
(:mod:`.capacity_search`). Without that search, the knee is the sweep's point
farthest above the straight line from its tightest to its roomiest point, with
capacity on a log scale (Kneedle, Satopää et al. 2011): past it, each doubling of the
cache buys less. GiB need the model's KV bytes per token, which the cost profile (or
the model config) gives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..backends import Scalar

__all__ = ["CapacityAnchor", "knee"]


def knee(points: Sequence[tuple[int, float]]) -> tuple[int, float] | None:
    """The knee of ``(capacity, hit ratio)`` points (any order), or ``None`` when
    there are fewer than three or the curve never rises above its chord."""
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


@dataclass(frozen=True, slots=True)
class CapacityAnchor:
    """One backend's capacity anchors on one workload.

    Attributes:
        workload, backend: which.
        block_size: its hit granularity (blocks are of this many tokens).
        infinite_capacity_tokens: the roomy capacity (nothing evicted).
        infinite_hit_ratio: its hit ratio there.
        knee_tokens: the knee's capacity (``None``: no sweep, or no knee).
        knee_hit_ratio: the hit ratio at the knee.
        kv_bytes_per_token: the profile's, for GiB (``None``: unknown).
        model: the model the bytes are of.
        num_points: the sweep's points the knee was looked for in.
        working_set_tokens: the smallest capacity reaching the infinite-cache hit
            ratio (``None``: not searched).
        knee_rule: how the knee was found (``"98% of infinite"`` by search, or
            ``"kneedle"`` over the sweep).
        search_replays: replays the search made.
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

    @property
    def working_set_text(self) -> str:
        """The working set as :meth:`describe` gives it, or how to find it."""
        if self.working_set_tokens is None:
            return "- (--capacity-search finds it)"
        return self.describe(self.working_set_tokens)

    @property
    def knee_text(self) -> str:
        """The knee as :meth:`describe` gives it, or why there is none."""
        if self.knee_tokens is not None:
            return self.describe(self.knee_tokens)
        if self.num_points < 3:
            return "- (--capacity-search finds it)"
        return "- (the sweep has no bend: --capacity-search finds it)"

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
        return {
            "workload": self.workload,
            "backend": self.backend,
            "block_size": self.block_size,
            **self._size("infinite_capacity", self.infinite_capacity_tokens),
            "infinite_hit_ratio": self.infinite_hit_ratio,
            **self._size("knee", self.knee_tokens),
            "knee_hit_ratio": self.knee_hit_ratio,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_model": self.model,
            **self._size("working_set", self.working_set_tokens),
            "knee_rule": self.knee_rule,
            "search_replays": self.search_replays,
        }

    def _size(self, name: str, tokens: int | None) -> dict[str, Scalar]:
        """``<name>_tokens``, ``<name>_blocks`` and ``<name>_gib``."""
        blocks = None if tokens is None else tokens // self.block_size
        return {f"{name}_tokens": tokens, f"{name}_blocks": blocks, f"{name}_gib": self.gib(tokens)}
