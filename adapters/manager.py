"""The engine-neutral request lifecycle every backend goes through.

``admit`` -> the engine writes KV for the uncached tokens -> ``commit`` registers
what now has KV -> ``append`` during decode -> ``finish`` (or ``abort``). The
manager owns the block tables and the allocator; the index owns cached blocks and
is asked to ``evict`` when the allocator runs short (SGLang's ownership model,
which gives vLLM's hits too; see the README). Both facades are thin layers on it.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from prefixkv.indexes.base import CacheHandle, PrefixIndex, PrefixMatch
from prefixkv.indexes.errors import (
    CacheInUseError,
    InvalidTokenError,
    PrefixKVError,
    RequestStateError,
)
from prefixkv.indexes.null import NoPrefixIndex
from prefixkv.indexes.tokens import ExtraKey, TokenKey, as_token_array
from prefixkv.storage.allocator import BlockAllocator

from .accounting import BoundaryTracker, CacheTotals, RequestRecord

__all__ = ["Admission", "CacheManager", "RequestId"]

RequestId = Hashable


class Admission(NamedTuple):
    """A request the manager took in.

    Attributes:
        request_id: the request.
        num_cached_tokens: prompt tokens served from the cache; compute from here.
        block_table: the request's blocks now (a copy; see ``block_table()``).
    """

    request_id: RequestId
    num_cached_tokens: int
    block_table: list[int]


@dataclass(slots=True, eq=False)
class _Seq:
    key: TokenKey
    prompt_len: int
    table: list[int]
    handle: CacheHandle
    record: RequestRecord
    num_computed: int  # tokens whose KV is written (or promised, vLLM-style)
    num_registered_blocks: int  # leading table blocks the index holds for us
    private_duplicates: list[int] = field(default_factory=list)


class CacheManager:
    """Admission, registration and release of requests over one index and one pool.

    Args:
        index: any :class:`~prefixkv.indexes.PrefixIndex`.
        allocator: the pool's free blocks (same block size as the index).
        track_boundaries: keep a token-level mirror of the cached blocks to report
            matched-but-recomputed tokens per request (SPEC BB-8). Costs memory
            and time per registered block; off for speed runs.
        keep_records: keep every request's record in ``records`` (replays and
            reports want them; a long-running engine does not, so off by default:
            ``record(request_id)`` still serves running requests).

    Invariant (``check_integrity``): free + held-only + cached == ``num_blocks``.
    Thread safety: none; one scheduler thread.
    """

    def __init__(
        self,
        index: PrefixIndex,
        allocator: BlockAllocator,
        *,
        track_boundaries: bool = False,
        keep_records: bool = False,
    ) -> None:
        if not isinstance(index, PrefixIndex):
            raise PrefixKVError(f"{index!r} does not implement the PrefixIndex protocol")
        self.index = index
        self.allocator = allocator
        self.block_size = index.block_size
        self._seqs: dict[RequestId, _Seq] = {}
        # The null index holds nothing at any granularity: it has no boundary losses.
        caching = not isinstance(index, NoPrefixIndex)
        self._tracker = BoundaryTracker(index.block_size) if track_boundaries and caching else None
        self.totals = CacheTotals()
        self.keep_records = keep_records
        self._track = track_boundaries
        self.records: list[RequestRecord] = []

    # ------------------------------------------------------------ admission

    def _seq(self, request_id: RequestId) -> _Seq:
        seq = self._seqs.get(request_id)
        if seq is None:
            raise RequestStateError(f"request {request_id!r} is not running")
        return seq

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def make_key(
        self,
        tokens: Iterable[int] | TokenKey,
        extra_key: ExtraKey | str | None = None,
        priority: int = 0,
    ) -> TokenKey:
        """Validate a prompt into a key (rejects empty prompts).

        Raises:
            InvalidTokenError: an empty prompt or a bad token id.
        """
        key = tokens if isinstance(tokens, TokenKey) else TokenKey(tokens, extra_key, priority)
        if not len(key):
            raise InvalidTokenError("a prompt needs at least one token; got an empty prompt")
        return key

    def match(self, key: TokenKey) -> PrefixMatch:
        """Look ``key`` up, capped at ``len(key) - 1`` tokens (SPEC BB-1). Locks nothing."""
        return self.index.match_prefix(key, len(key) - 1)

    def admit(
        self,
        request_id: RequestId,
        tokens: Iterable[int] | TokenKey,
        extra_key: ExtraKey | str | None = None,
        *,
        priority: int = 0,
        num_tokens: int | None = None,
        reserve_blocks: int = 0,
        prefix_match: PrefixMatch | None = None,
    ) -> Admission | None:
        """Take a request in: match, lock the hit, allocate blocks for the rest.

        Args:
            request_id: unique among running requests.
            tokens: the prompt, or a prepared ``TokenKey``.
            extra_key: namespace (LoRA, cache salt, tenant); see ``make_extra_key``.
            priority: eviction hint for the radix tree's ``priority`` policy.
            num_tokens: tokens that need slots now (default: the whole prompt;
                fewer for chunked prefill; never fewer than the hit).
            reserve_blocks: evict until this many blocks beyond the need are free,
                best effort (SGLang's paged over-estimate); never fails on it.
            prefix_match: a match made by ``match`` just before (vLLM's scheduler
                looks up first, allocates second); default: match now.

        Returns:
            The admission, or ``None`` when the blocks do not fit even after
            evicting; then nothing is locked, allocated or evicted.

        Raises:
            RequestStateError: ``request_id`` is running already.
            InvalidTokenError: empty prompt or bad tokens.
        """
        if request_id in self._seqs:
            raise RequestStateError(f"request {request_id!r} is running already")
        key = self.make_key(tokens, extra_key, priority)
        want = len(key) if num_tokens is None else num_tokens
        if type(want) is not int or not 1 <= want <= len(key):
            raise PrefixKVError(f"num_tokens must be in [1, {len(key)}], got {num_tokens!r}")
        m = self.match(key) if prefix_match is None else prefix_match
        need = self._blocks_for(max(want, m.num_tokens)) - len(m.block_ids)
        if not self._fits(need, m.num_evictable_blocks):
            self.totals.num_rejected += 1
            return None
        self.index.lock(m.handle)
        new = self._take_blocks(need, reserve_blocks)
        table = [*m.block_ids, *new]
        record = RequestRecord(str(request_id), len(key), m.num_tokens)
        if self._tracker is not None:
            self._fill_boundary_record(record, key, m)
        elif self._track:
            record.matched_tokens = record.cap_lost_tokens = record.boundary_lost_tokens = 0
        self._seqs[request_id] = _Seq(
            key, len(key), table, m.handle, record, m.num_tokens, len(m.block_ids)
        )
        if self.keep_records:
            self.records.append(record)
        t = self.totals
        t.num_requests += 1
        t.num_query_tokens += len(key)
        t.num_hit_tokens += m.num_tokens
        return Admission(request_id, m.num_tokens, list(table))

    def _fill_boundary_record(self, record: RequestRecord, key: TokenKey, m: PrefixMatch) -> None:
        assert self._tracker is not None
        # held: what the index holds at its granularity; the len-1 cap keeps the part
        # past the hit. Matched tokens beyond it share a block with other tokens (the
        # prompt's very last token is recomputed by every index, so it is not a loss).
        matched = self._tracker.matched_tokens(key, m.block_ids)
        held = max(m.num_tokens, matched // self.block_size * self.block_size)
        record.matched_tokens = matched
        record.cap_lost_tokens = min(held, len(key)) - m.num_tokens
        record.boundary_lost_tokens = max(0, min(matched, len(key) - 1) - held)

    def _fits(self, need: int, hit_evictable: int) -> bool:
        # Locking the hit protects its evictable blocks, so they do not count.
        if need <= self.allocator.num_free_blocks:
            return True
        evictable = self.index.stats().num_evictable_blocks - hit_evictable
        return need <= self.allocator.num_free_blocks + evictable

    def _take_blocks(self, need: int, reserve: int = 0) -> list[int]:
        # Free blocks first, then evicted ones (vLLM pops unhashed free blocks before
        # cached ones); an index that overshoots (radix leaves) returns the surplus here.
        alloc = self.allocator
        free = alloc.num_free_blocks
        if free >= need + reserve:
            out = alloc.allocate(need)
            assert out is not None
            return out
        evicted = self._evict(need + reserve - free)
        use = max(0, min(need - free, len(evicted)))
        got = alloc.allocate(min(need, free))
        assert got is not None and len(got) + use == need, "admission check let in a misfit"
        got += evicted[:use]
        alloc.free(evicted[use:])
        return got

    # ---------------------------------------------------------- registration

    def commit(
        self, request_id: RequestId, num_tokens: int, *, swap_duplicates: bool = True
    ) -> None:
        """Register the request's first ``num_tokens`` tokens (their KV is written).

        Whole blocks become cached and stay locked by this request. Where the index
        already held a block for the same content under another block (the radix
        tree after a concurrent prefill), the request's copy is a duplicate:
        with ``swap_duplicates`` it is freed and the table points at the cached
        block (SGLang's ``cache_unfinished_req``); without, the request keeps its
        copy until it finishes (vLLM keeps block tables append-only).

        Raises:
            RequestStateError: unknown request.
            PrefixKVError: ``num_tokens`` beyond the request's tokens or slots.
        """
        seq = self._seqs.get(request_id)
        if seq is None:
            raise RequestStateError(f"request {request_id!r} is not running")
        limit = len(seq.key)
        slots = len(seq.table) * self.block_size
        if type(num_tokens) is not int or not 0 <= num_tokens <= min(limit, slots):
            raise PrefixKVError(
                f"request {request_id!r}: num_tokens must be in [0, {min(limit, slots)}], "
                f"got {num_tokens!r}"
            )
        if num_tokens > seq.num_computed:
            seq.num_computed = num_tokens
        if num_tokens // self.block_size > seq.num_registered_blocks:
            self._register(seq, num_tokens, swap_duplicates)

    def _register(self, seq: _Seq, num_tokens: int, swap: bool) -> None:
        result = self.index.insert(seq.key, seq.table, num_tokens, prefix=seq.handle)
        base = result.first_block
        theirs = result.block_ids
        n = base + len(theirs)
        start = seq.num_registered_blocks
        table = seq.table
        if n > start and table[start:n] != theirs[start - base :]:
            dups = [i for i in range(start, n) if table[i] != theirs[i - base]]
            if swap:
                self.allocator.free([table[i] for i in dups])
                for i in dups:
                    table[i] = theirs[i - base]
            else:
                seq.private_duplicates.extend(table[i] for i in dups)
        if self._tracker is not None:
            self._tracker.registered(seq.key, table[:start] + theirs[start - base :], start, n)
        released = self.index.relock(seq.handle, result.handle)
        seq.handle = result.handle
        seq.num_registered_blocks = max(n, start)
        self._release(released)

    def _release(self, block_ids: list[int]) -> None:
        if block_ids:
            if self._tracker is not None:
                self._tracker.forget(block_ids)
            self.allocator.free(block_ids)

    def append(
        self,
        request_id: RequestId,
        tokens: Iterable[int],
        *,
        num_slots: int | None = None,
        reserve_blocks: int = 0,
    ) -> bool:
        """Add tokens to the sequence and make sure its tokens have slots.

        Args:
            request_id: the request.
            tokens: new tokens (decoded ones; their KV is computed next).
            num_slots: how many leading tokens need slots (default: all, the
                appended ones included; fewer for a chunked prefill).
            reserve_blocks: evict until this many more blocks are free, best effort.

        Returns:
            ``False`` (and nothing changed) when a block is needed and none can be
            freed: the engine should preempt someone.

        Raises:
            RequestStateError: unknown request.
            InvalidTokenError: a bad token id.
        """
        seq = self._seq(request_id)
        new = as_token_array(tokens)
        total = len(seq.key) + len(new)
        if (
            self._grow(seq, total if num_slots is None else num_slots, total, reserve_blocks)
            is None
        ):
            return False
        seq.key.append(new)
        return True

    def advance(
        self,
        request_id: RequestId,
        num_slots: int,
        num_computed: int | None = None,
        *,
        reserve_blocks: int = 0,
        swap_duplicates: bool = True,
    ) -> list[int] | None:
        """One scheduler step for a running request: slots, then registration.

        Makes sure the first ``num_slots`` tokens have slots, then does
        ``commit(num_computed)`` (vLLM's ``allocate_slots``, which registers
        before the forward pass, passes ``swap_duplicates=False``). Slots may run
        ahead of the key's tokens; registered tokens must be in the key
        (``append`` adds them). A decode step that needs no new block costs O(1).

        Returns:
            The blocks added to the table (often none), or ``None`` (nothing
            changed) when no block can be freed.

        Raises:
            RequestStateError: unknown request.
            PrefixKVError: ``num_slots`` or ``num_computed`` out of range.
        """
        seq = self._seqs.get(request_id)
        if seq is None:
            raise RequestStateError(f"request {request_id!r} is not running")
        bs = self.block_size
        if (
            reserve_blocks <= 0
            and type(num_slots) is int
            and 0 <= num_slots <= len(seq.table) * bs
            and (
                num_computed is None
                or (
                    type(num_computed) is int
                    and 0 <= num_computed <= num_slots
                    and num_computed // bs <= seq.num_registered_blocks
                )
            )
        ):
            # The common decode step: no block to add, nothing new to register.
            if num_computed is not None and num_computed > seq.num_computed:
                seq.num_computed = min(num_computed, len(seq.key.tokens))
            return []
        new = self._grow(seq, num_slots, sys.maxsize, reserve_blocks)
        if new is not None and num_computed is not None:
            known = min(num_computed, len(seq.key.tokens))  # the key may lag its slots
            self.commit(request_id, known, swap_duplicates=swap_duplicates)
        return new

    def _grow(self, seq: _Seq, slots: int, limit: int, reserve: int) -> list[int] | None:
        if type(slots) is not int or not 0 <= slots <= limit:
            raise PrefixKVError(f"num_slots must be in [0, {limit}], got {slots!r}")
        need = -(-slots // self.block_size) - len(seq.table)
        if need <= 0 and reserve <= 0:
            return []
        if need > 0 and not self._fits(need, 0):
            return None
        new = self._take_blocks(max(need, 0), reserve)
        seq.table += new
        return new

    # -------------------------------------------------------------- release

    def finish(self, request_id: RequestId, *, split_at_prompt: bool = True) -> None:
        """Register what has KV, then release the request (SPEC SG-4, HC-7).

        The request's computed tokens are registered; with ``split_at_prompt`` the
        prompt is registered again on its own so a tree puts a node boundary at
        the prompt's end (its output becomes a separate leaf, evicted first).
        Then the lock is released (tail first) and private blocks are freed.

        Raises:
            RequestStateError: unknown or finished request.
        """
        seq = self._seq(request_id)
        if seq.num_computed // self.block_size > seq.num_registered_blocks:
            self._register(seq, seq.num_computed, True)
        if split_at_prompt and seq.num_computed > seq.prompt_len >= self.block_size:
            self.index.insert(seq.key, seq.table, seq.prompt_len, prefix=seq.handle)
        self._drop(request_id, seq)

    def abort(self, request_id: RequestId) -> None:
        """Release a request without registering anything more (preemption, cancel).

        Raises:
            RequestStateError: unknown or finished request.
        """
        self._drop(request_id, self._seq(request_id))

    def _drop(self, request_id: RequestId, seq: _Seq) -> None:
        del self._seqs[request_id]
        if self._tracker is not None:
            self._tracker.computed_tail(
                seq.key, seq.table, seq.num_registered_blocks, seq.num_computed
            )
        private = seq.table[seq.num_registered_blocks :] + seq.private_duplicates
        private.reverse()  # vLLM frees in reverse: the tail block is reused first
        self.allocator.free(private)
        self._release(self.index.unlock(seq.handle))

    # -------------------------------------------------------------- queries

    def block_table(self, request_id: RequestId) -> list[int]:
        """The request's current block table (a copy)."""
        return list(self._seq(request_id).table)

    def key(self, request_id: RequestId) -> TokenKey:
        """The request's key (its tokens so far)."""
        return self._seq(request_id).key

    def num_computed_tokens(self, request_id: RequestId) -> int:
        """Tokens of the request with KV (hit + committed)."""
        return self._seq(request_id).num_computed

    def record(self, request_id: RequestId) -> RequestRecord:
        """The request's accounting record."""
        return self._seq(request_id).record

    def running(self) -> list[RequestId]:
        """Requests admitted and not finished, oldest first."""
        return list(self._seqs)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._seqs

    def num_common_prefix_blocks(self, request_id: RequestId) -> int:
        """Leading blocks of the request's table shared by every running request (HC-11).

        Uses the index's ``num_common_prefix_blocks`` (O(result)) when it has one,
        else compares block tables.
        """
        seq = self._seq(request_id)
        n_req = len(self._seqs)
        fast = getattr(self.index, "num_common_prefix_blocks", None)
        if fast is not None:
            n = int(fast(seq.table[: seq.num_registered_blocks], n_req))
            if n == seq.num_registered_blocks and n_req == 1:
                n = len(seq.table)  # a lone request holds its private blocks too
            return n
        n = len(seq.table)
        for other in self._seqs.values():
            if other is not seq:
                n = min(n, _common_len(seq.table, other.table, n))
        return n

    def evict(self, num_blocks: int) -> int:
        """Evict at least ``num_blocks`` unlocked cached blocks into the pool.

        Returns:
            Blocks freed (the radix tree may free more than asked).
        """
        evicted = self._evict(num_blocks)
        self.allocator.free(evicted)
        return len(evicted)

    def _evict(self, num_blocks: int) -> list[int]:
        # The index gives blocks back; the caller decides where they go.
        evicted = self.index.evict(num_blocks)
        self.totals.num_evicted_blocks += len(evicted)
        if self._tracker is not None:
            self._tracker.forget(evicted)
        return evicted

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache entries of ``block_ids`` (vLLM KV-connector interface).

        Raises:
            PrefixKVError: the index cannot drop entries by block id.
        """
        drop = getattr(self.index, "evict_blocks", None)
        if drop is None:
            raise PrefixKVError(f"{type(self.index).__name__} cannot evict entries by block id")
        ids = list(block_ids)
        freed = drop(ids)
        if self._tracker is not None:
            self._tracker.forget(ids)
        self.totals.num_evicted_blocks += len(freed)
        self.allocator.free(freed)

    def reset(self) -> None:
        """Drop the whole prefix cache; its blocks return to the pool.

        Raises:
            CacheInUseError: requests are running; nothing changes.
        """
        if self._seqs:
            raise CacheInUseError(f"cannot reset: {len(self._seqs)} requests are running")
        self.allocator.free(self.index.reset())
        if self._tracker is not None:
            self._tracker.clear()

    @property
    def tracks_boundaries(self) -> bool:
        """Whether per-request BB-8 accounting is on (and the index can cache)."""
        return self._tracker is not None

    @property
    def usage(self) -> float:
        """Fraction of the pool not free (held or cached), like vLLM's ``usage``."""
        return 1.0 - self.allocator.num_free_blocks / self.allocator.num_blocks

    def num_held_only_blocks(self) -> int:
        """Blocks held by running requests and not owned by the index."""
        return sum(
            len(s.table) - s.num_registered_blocks + len(s.private_duplicates)
            for s in self._seqs.values()
        )

    def check_integrity(self) -> None:
        """Conservation: free + held-only + cached == num_blocks, with no overlap.

        Raises:
            AssertionError: describing the leak or double ownership.
        """
        alloc = self.allocator
        alloc.check_invariants()
        self.index.check_invariants()
        cached = self.index.stats().num_cached_blocks
        free = alloc.num_free_blocks
        held = self.num_held_only_blocks()
        assert free + held + cached == alloc.num_blocks, (
            f"blocks leak or double count: free {free} + held-only {held} + cached {cached} "
            f"!= {alloc.num_blocks}"
        )
        seen: set[int] = set()
        for rid, s in self._seqs.items():
            private = s.table[s.num_registered_blocks :] + s.private_duplicates
            for b in private:
                assert not alloc.is_free(b), f"request {rid!r} holds free block {b}"
                assert b not in seen, f"block {b} held privately twice"
                seen.add(b)
            for b in s.table[: s.num_registered_blocks]:
                assert not alloc.is_free(b), f"request {rid!r} reads free block {b}"
            assert len(s.table) * self.block_size >= s.num_computed, f"{rid!r} lacks slots"


def _common_len(a: list[int], b: list[int], limit: int) -> int:
    n = min(limit, len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])
