"""The capacity a workload needs, found by bisection over K-live replays.

Two anchors, each the smallest capacity (to within :data:`PRECISION`) whose K-live
hit ratio reaches a target, between the tight capacity (the largest requests live
at once) and the roomy one (every request's KV: nothing is evicted):

- the **working set**: the infinite-cache hit ratio itself. Above it the hit ratio
  stops improving: what stays cached there is the largest footprint of live
  requests plus the blocks a later request will hit (plus what the eviction order
  keeps that an oracle would drop). Not the sum of all tokens, which counts every
  block that is never read again.
- the **knee**: :data:`KNEE_SHARE` of the infinite-cache hit ratio (98%): past it,
  the last 2% of the hits cost the rest of the working set.

The hit ratio of an LRU-like cache rises with capacity almost everywhere, so a
bisection on a log scale finds each in about ``log2(ln(roomy / tight) / ln(1 +
PRECISION))`` replays; replays already made (the table's, the sweep's) seed the
bracket, and each capacity is replayed at most once for both anchors.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

__all__ = ["KNEE_SHARE", "PRECISION", "CapacitySearch", "smallest_reaching"]

KNEE_SHARE = 0.98
"""The knee is the smallest capacity reaching this share of the infinite-cache hit ratio."""

PRECISION = 0.05
"""Each anchor is found to within this relative capacity (5%)."""

_EXACT = 1e-12
"""Hit ratios this close are equal (the same hit tokens over the same prompt tokens)."""


def smallest_reaching(
    hit_at: Callable[[int], float | None],
    low: int,
    high: int,
    target: float,
) -> int:
    """The smallest capacity in ``(low, high]`` (within :data:`PRECISION`) whose hit ratio
    reaches ``target``, given that ``high`` reaches it and ``low`` does not, by
    bisection on a log scale (``None``, a capacity too small to run, misses)."""
    while high > low * (1 + PRECISION) and high - low > 1:
        mid = round(math.sqrt(low * high))
        mid = min(max(mid, low + 1), high - 1)
        hit = hit_at(mid)
        if hit is not None and hit >= target - _EXACT:
            high = mid
        else:
            low = mid
    return high


class CapacitySearch:
    """One backend's replays at the capacities the search asks for, each made once.

    Args:
        replay: hit ratio of a K-live replay at a capacity (``None``: does not fit).
        known: ``(capacity, hit ratio)`` pairs already measured.
    """

    def __init__(
        self,
        replay: Callable[[int], float | None],
        known: Iterable[tuple[int, float | None]] = (),
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

    def _bracket(self, target: float, tight: int, roomy: int) -> tuple[int, int]:
        """The largest known capacity below ``target`` and the smallest reaching it."""
        reached = {c for c, h in self.hits.items() if h is not None and h >= target - _EXACT}
        high = min((c for c in reached if c <= roomy), default=roomy)
        low = max((c for c in self.hits if c not in reached and c < high), default=tight - 1)
        return max(1, low), high

    def smallest(self, target: float, tight: int, roomy: int) -> int:
        """The smallest capacity (within :data:`PRECISION`) reaching ``target``; the
        roomy capacity reaches any target up to the infinite-cache hit ratio."""
        if target <= 0:
            return tight
        low, high = self._bracket(target, tight, roomy)
        if low >= high:
            return high
        return smallest_reaching(self.hit_at, low, high, target)
