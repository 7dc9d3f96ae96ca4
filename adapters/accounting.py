"""Cache accounting: per-request hit records, running totals, and the boundary tracker.

The tracker answers SPEC BB-8's question "how many tokens matched cached content
but were recomputed because of block boundaries or the len-1 cap?": it mirrors the
content of every registered block (parent block, tokens) and walks it at token
granularity, independent of how the index itself is organised.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass

from prefixkv.indexes.tokens import ExtraKey, TokenKey, common_prefix_len

__all__ = ["BoundaryTracker", "CacheTotals", "RequestRecord"]


@dataclass(slots=True)
class RequestRecord:
    """One request's cache accounting (SPEC BB-8), fixed at admission.

    Attributes:
        request_id: the request.
        prompt_len: prompt tokens.
        hit_tokens: tokens served from the cache.
        matched_tokens: tokens equal to cached content at token granularity
            (``None`` unless the manager tracks boundaries).
        cap_lost_tokens: cached at the index's granularity but recomputed because a
            hit is capped at ``prompt_len - 1`` (the "recomputed last block").
        boundary_lost_tokens: matched tokens past the last whole cached block,
            recomputed because they share a block with different tokens.
        computed_tokens: prefill tokens computed (``prompt_len - hit_tokens``).
    """

    request_id: str
    prompt_len: int
    hit_tokens: int
    matched_tokens: int | None = None
    cap_lost_tokens: int | None = None
    boundary_lost_tokens: int | None = None

    @property
    def computed_tokens(self) -> int:
        """Prefill tokens this request computed."""
        return self.prompt_len - self.hit_tokens


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


_Node = int | tuple[str, ExtraKey | None]  # a block id, or a namespace's root


class BoundaryTracker:
    """Token-level mirror of what an index holds, for BB-8 accounting.

    ``registered`` is told about each block the index adopted (with its parent
    block), ``forget`` about each block it gave back, and ``computed_tail`` about
    the partial last block a request computed but no block-granular index could
    keep (the seed document's "a prefix tail short of a block never hits").
    ``matched_tokens`` then walks from the hit's last block through cached
    children and such tails at token granularity.

    Memory: one entry per cached block, and at most ``MAX_TAILS`` tails per block.
    Time: a walk costs O(children of the nodes it visits).
    """

    MAX_TAILS = 32

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._children: dict[_Node, dict[int, array[int]]] = {}
        self._parent: dict[int, _Node] = {}
        self._tails: dict[_Node, deque[array[int]]] = {}

    @staticmethod
    def _root(extra_key: ExtraKey | None) -> _Node:
        return ("root", extra_key)

    def registered(self, key: TokenKey, block_ids: list[int], start: int, stop: int) -> None:
        """Record ``block_ids[start:stop]`` as cached for those blocks of ``key``."""
        bs = self.block_size
        tokens = key.tokens
        for i in range(start, stop):
            bid = block_ids[i]
            if bid in self._parent:
                continue
            parent: _Node = block_ids[i - 1] if i else self._root(key.extra_key)
            self._parent[bid] = parent
            self._children.setdefault(parent, {})[bid] = tokens[i * bs : (i + 1) * bs]

    def computed_tail(
        self, key: TokenKey, block_ids: list[int], num_registered: int, num_computed: int
    ) -> None:
        """Record the tokens a finished request computed past its last registered block."""
        bs = self.block_size
        start = num_registered * bs
        if not 0 < num_computed - start < bs:
            return
        parent: _Node = (
            block_ids[num_registered - 1] if num_registered else self._root(key.extra_key)
        )
        if num_registered and parent not in self._parent:
            return
        tails = self._tails.get(parent)
        if tails is None:
            tails = self._tails[parent] = deque(maxlen=self.MAX_TAILS)
        tails.append(key.tokens[start:num_computed])

    def forget(self, block_ids: list[int]) -> None:
        """Drop blocks the index no longer holds (and the tails computed after them)."""
        tails = self._tails
        for bid in block_ids:
            tails.pop(bid, None)
            parent = self._parent.pop(bid, None)
            if parent is None:
                continue
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.pop(bid, None)
                if not siblings:
                    del self._children[parent]

    def clear(self) -> None:
        """Forget everything (after an index reset)."""
        self._children.clear()
        self._parent.clear()
        self._tails.clear()

    def matched_tokens(self, key: TokenKey, hit_block_ids: list[int]) -> int:
        """Tokens of ``key`` equal to cached content, uncapped, at token granularity."""
        bs = self.block_size
        tokens = key.tokens
        node: _Node = hit_block_ids[-1] if hit_block_ids else self._root(key.extra_key)
        pos = len(hit_block_ids) * bs
        while pos < len(tokens):
            kids = self._children.get(node)
            n = min(bs, len(tokens) - pos)
            best, best_bid = 0, -1
            if kids:
                for bid, content in kids.items():
                    m = common_prefix_len(content, 0, tokens, pos, n)
                    if m > best:
                        best, best_bid = m, bid
                        if m == n:
                            break
            if best < bs:
                for tail in self._tails.get(node, ()):
                    best = max(best, common_prefix_len(tail, 0, tokens, pos, min(n, len(tail))))
                return pos + best
            node, pos = best_bid, pos + bs
        return pos
