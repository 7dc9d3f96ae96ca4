"""The running cache totals the manager and the engine classes keep, like vLLM's
``PrefixCacheStats``: one counter record, apart from the boundary accounting
(``accounting.py``) so that the request lifecycle loads only this."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheTotals"]


@dataclass(slots=True)
class CacheTotals:
    """Running totals, like vLLM's ``PrefixCacheStats``.

    Attributes:
        num_requests: admitted requests.
        num_query_tokens: prompt tokens looked up.
        num_hit_tokens: prompt tokens served from the cache.
        num_rejected: admissions that did not fit (returned ``None``).
        num_evicted_blocks: blocks the manager evicted from the index.
    """

    num_requests: int = 0
    num_query_tokens: int = 0
    num_hit_tokens: int = 0
    num_rejected: int = 0
    num_evicted_blocks: int = 0

    @property
    def hit_ratio(self) -> float:
        """Hit tokens over query tokens (0 when nothing was queried)."""
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0
