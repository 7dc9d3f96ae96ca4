"""Cache accounting: per-request records and the boundary tracker (an observer).

The tracker answers SPEC BB-8's question "how many tokens matched cached content but
were recomputed because of block boundaries or the len-1 cap?". It mirrors, from the
manager's hooks, the content of every cached block (its parent block and its tokens)
and the partial tails finished requests computed, and walks that mirror at token
granularity, independent of how the index itself is organised.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedList

from prefixkv.indexes.errors import RequestStateError
from prefixkv.indexes.tokens import TOKEN_BYTES, ExtraKey, TokenKey

from .observer import ObserverBase

__all__ = ["BoundaryTracker", "RequestRecord"]


@dataclass(slots=True)
class RequestRecord:
    """One request's cache accounting (SPEC BB-8), fixed at admission.

    Attributes:
        request_id: the request.
        prompt_len: prompt tokens.
        hit_tokens: tokens served from the cache.
        matched_tokens: tokens equal to cached content at token granularity.
        cap_lost_tokens: cached at the index's granularity but recomputed because a
            hit is capped at ``prompt_len - 1`` (the "recomputed last block").
        boundary_lost_tokens: matched tokens past the last whole cached block,
            recomputed because they share a block with different tokens.
    """

    request_id: str
    prompt_len: int
    hit_tokens: int
    matched_tokens: int = 0
    cap_lost_tokens: int = 0
    boundary_lost_tokens: int = 0

    @property
    def computed_tokens(self) -> int:
        """Prefill tokens this request computed (``prompt_len - hit_tokens``)."""
        return self.prompt_len - self.hit_tokens


_Node = int | tuple[str, ExtraKey | None]  # a block id, or a namespace's root


def _common_bytes(a: bytes, b: bytes) -> int:
    """Length of the common prefix of two byte strings (binary search over C compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # equal on [0, lo), different somewhere in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class _Children:
    """The cached blocks that follow one block (or a namespace's root).

    ``exact`` finds a child holding exactly the query's tokens in O(1); ``ordered``
    (child contents sorted as bytes) finds the child sharing the longest prefix with a
    partial query among its two neighbours in sorted order, in O(log n): the sibling
    count never enters a lookup.
    """

    exact: dict[bytes, list[int]] = field(default_factory=dict)
    ordered: SortedList = field(default_factory=SortedList)

    def add(self, content: bytes, bid: int) -> None:
        self.exact.setdefault(content, []).append(bid)
        self.ordered.add((content, bid))

    def remove(self, content: bytes, bid: int) -> None:
        same = self.exact[content]
        same.remove(bid)
        if not same:
            del self.exact[content]
        self.ordered.remove((content, bid))

    def longest(self, query: bytes) -> int:
        """Most leading bytes of ``query`` that some child's content starts with."""
        ordered = self.ordered
        i = ordered.bisect_left((query,))
        best = 0
        for j in (i - 1, i):
            if 0 <= j < len(ordered):
                best = max(best, _common_bytes(query, ordered[j][0]))
        return best


class BoundaryTracker(ObserverBase):
    """Token-level mirror of what an index holds, for BB-8 accounting; an observer.

    Attach with ``CacheManager(index, allocator, observers=[tracker])``. Each
    admission gets a :class:`RequestRecord` (``record(request_id)`` while it runs;
    ``records``, in admission order, with ``keep_records``).

    Args:
        block_size: the index's granularity.
        caches: ``False`` for an index that caches nothing (no boundary can lose a
            token it would never have kept); see ``IndexDescription.caches``.
        keep_records: keep every request's record in ``records``.

    Memory: one entry per cached block, at most ``MAX_TAILS`` tails per block. Time:
    registering a block is O(log siblings); an admission's walk is O(its blocks).
    """

    MAX_TAILS = 32

    def __init__(self, block_size: int, *, caches: bool = True, keep_records: bool = True) -> None:
        self.block_size = block_size
        self.caches = caches
        self.keep_records = keep_records
        self.records: list[RequestRecord] = []
        self._running: dict[Hashable, RequestRecord] = {}
        self._children: dict[_Node, _Children] = {}
        self._parent: dict[int, _Node] = {}
        self._content: dict[int, bytes] = {}
        self._tails: dict[_Node, deque[bytes]] = {}

    @staticmethod
    def _root(extra_key: ExtraKey | None) -> _Node:
        return ("root", extra_key)

    def record(self, request_id: Hashable) -> RequestRecord:
        """The record of a running request.

        Raises:
            RequestStateError: the request is not running.
        """
        rec = self._running.get(request_id)
        if rec is None:
            raise RequestStateError(f"request {request_id!r:.80} is not running")
        return rec

    # ----------------------------------------------------------------- hooks

    def on_admit(
        self, request_id: Hashable, key: TokenKey, hit_block_ids: Sequence[int], hit_tokens: int
    ) -> None:
        """Record the request's hit, matched and lost tokens."""
        n = len(key)
        rec = RequestRecord(str(request_id), n, hit_tokens)
        if self.caches:
            # held: what the index holds at its granularity; the len-1 cap keeps the part
            # past the hit. Matched tokens beyond it share a block with other tokens (the
            # prompt's very last token is recomputed by every index: not a loss).
            matched = self.matched_tokens(key, hit_block_ids)
            held = max(hit_tokens, matched // self.block_size * self.block_size)
            rec.matched_tokens = matched
            rec.cap_lost_tokens = min(held, n) - hit_tokens
            rec.boundary_lost_tokens = max(0, min(matched, n - 1) - held)
        self._running[request_id] = rec
        if self.keep_records:
            self.records.append(rec)

    def on_register(self, key: TokenKey, block_ids: Sequence[int], start: int, stop: int) -> None:
        """Mirror blocks ``start..stop-1``: each one's parent block and tokens."""
        bs = self.block_size
        data = key.tokens[start * bs : stop * bs].tobytes()
        step = bs * TOKEN_BYTES
        parent: _Node = block_ids[start - 1] if start else self._root(key.extra_key)
        for i in range(start, stop):
            bid = block_ids[i]
            if bid not in self._parent:
                content = data[(i - start) * step : (i - start + 1) * step]
                self._parent[bid] = parent
                self._content[bid] = content
                kids = self._children.get(parent)
                if kids is None:
                    kids = self._children[parent] = _Children()
                kids.add(content, bid)
            parent = bid

    def on_release(self, block_ids: Sequence[int]) -> None:
        """Forget blocks no longer matchable."""
        self.forget(block_ids)

    def on_evict(self, block_ids: Sequence[int]) -> None:
        """Forget evicted blocks."""
        self.forget(block_ids)

    def on_finish(
        self,
        request_id: Hashable,
        key: TokenKey,
        block_table: Sequence[int],
        num_registered_blocks: int,
        num_computed_tokens: int,
    ) -> None:
        """Keep the partial last block the request computed but no block index keeps."""
        self._running.pop(request_id, None)
        start = num_registered_blocks * self.block_size
        if not 0 < num_computed_tokens - start < self.block_size:
            return
        parent: _Node
        if num_registered_blocks:
            parent = block_table[num_registered_blocks - 1]
            if parent not in self._parent:
                return
        else:
            parent = self._root(key.extra_key)
        tails = self._tails.get(parent)
        if tails is None:
            tails = self._tails[parent] = deque(maxlen=self.MAX_TAILS)
        tails.append(key.tokens[start:num_computed_tokens].tobytes())

    def on_reset(self) -> None:
        """Forget everything cached (records stay)."""
        self._children.clear()
        self._parent.clear()
        self._content.clear()
        self._tails.clear()

    # ------------------------------------------------------------- the mirror

    def forget(self, block_ids: Sequence[int]) -> None:
        """Drop blocks the index no longer holds (and the tails computed after them)."""
        tails = self._tails
        for bid in block_ids:
            tails.pop(bid, None)
            parent = self._parent.pop(bid, None)
            if parent is None:
                continue
            kids = self._children[parent]
            kids.remove(self._content.pop(bid), bid)
            if not kids.exact:
                del self._children[parent]

    def matched_tokens(self, key: TokenKey, hit_block_ids: Sequence[int]) -> int:
        """Tokens of ``key`` equal to cached content, uncapped, at token granularity.

        Complexity: O(blocks of the key) dict probes, plus O(log siblings) for the
        last, partly matching block.
        """
        bs = self.block_size
        tokens = key.tokens
        node: _Node = hit_block_ids[-1] if hit_block_ids else self._root(key.extra_key)
        pos = len(hit_block_ids) * bs
        while pos < len(tokens):
            n = min(bs, len(tokens) - pos)
            query = tokens[pos : pos + n].tobytes()
            kids = self._children.get(node)
            if n == bs and kids is not None:
                same = kids.exact.get(query)
                if same:
                    node, pos = same[0], pos + bs
                    continue
            best = kids.longest(query) if kids is not None else 0
            for tail in self._tails.get(node, ()):
                best = max(best, _common_bytes(query, tail))
            return pos + best // TOKEN_BYTES
        return pos

    def check_invariants(self) -> None:
        """The mirror's maps agree.

        Raises:
            AssertionError: describing the mismatch.
        """
        assert set(self._parent) == set(self._content), "parents and contents differ"
        count = 0
        for parent, kids in self._children.items():
            assert kids.exact, f"empty child set kept under {parent!r}"
            assert len(kids.ordered) == sum(map(len, kids.exact.values())), "child views differ"
            for content, bid in kids.ordered:
                assert self._parent.get(bid) == parent and self._content[bid] == content
                count += 1
        assert count == len(self._parent), "a mirrored block is missing from its parent"
