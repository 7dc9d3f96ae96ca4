"""The engine-neutral request lifecycle every backend goes through.

``admit`` -> the engine writes KV for the uncached tokens -> ``commit`` registers
what now has KV -> ``append`` during decode -> ``finish`` (or ``abort``). The
manager owns the block tables and the allocator; the index owns cached blocks and
is asked to ``evict`` when the allocator runs short (SGLang's ownership model,
which gives vLLM's hits too; see the README). vLLM's engine class (``KVCacheManager``) is
a thin layer on it; SGLang's (``PrefixCache``) keeps its own rows over the index and a
page pool.

A running request's block table, and who owns each part::

    table: [ hit | registered since     | private: computed or being computed ]
           0     num_hit_blocks         num_registered_blocks            len(table)
           <--- the index's, locked by us ---><------ ours, freed at release ------>

Registering moves the boundary right: the index adopts our blocks (or, when it had
the same content already, gives us its own and our copies are duplicates). Blocks the
allocator hands out are tagged ``Owner.MANAGER`` whether a request or the index holds
them; ``check_invariants`` counts both.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple, cast

from prefixkv.indexes.base import (
    CacheHandle,
    PrefixIndex,
    PrefixMatch,
    SupportsCommonPrefix,
    SupportsEvictBlocks,
    SupportsExtendLocked,
)
from prefixkv.indexes.errors import (
    CacheInUseError,
    InvalidTokenError,
    NamespaceConflictError,
    PrefixKVError,
    RequestStateError,
)
from prefixkv.indexes.hash_chain import HashChainIndex
from prefixkv.indexes.tokens import (
    TOKEN_TYPECODE,
    ExtraKey,
    TokenKey,
    checked_tokens,
    key_error,
    normalize_extra_key,
)
from prefixkv.indexes.validation import ceil_div, check_block_ids, check_bool, check_count
from prefixkv.storage.allocator import BlockAllocator, Owner

from .events.dialects import EventRecorder, attach_event_recorder
from .events.wire import KVEvent
from .observer import CacheObserver, combine_observers
from .totals import CacheTotals

__all__ = ["Admission", "CacheManager", "Lookup", "RequestId"]

RequestId = Hashable


class Admission(NamedTuple):
    """A request the manager took in.

    Attributes:
        request_id: the request.
        hit_tokens: prompt tokens served from the cache; compute from here.
        block_table: the request's blocks now (a copy; see ``block_table()``).
    """

    request_id: RequestId
    hit_tokens: int
    block_table: list[int]


class Lookup:
    """A lookup bound to the key it was made for (``CacheManager.match``).

    vLLM's scheduler looks a request up first and allocates second; ``admit`` takes
    the lookup back and validates it against the state at allocation time (a stale
    one raises ``StaleHandleError``), so it can never be applied to another key.

    A plain class, not a NamedTuple: one is made per lookup, and compiled, a
    NamedTuple is built (and its properties read) through Python-level calls, a few
    thousand instructions a request.

    Attributes:
        key: the key looked up.
        match: what the index answered.
    """

    __slots__ = ("key", "match")

    def __init__(self, key: TokenKey, match: PrefixMatch) -> None:
        self.key = key
        self.match = match

    @property
    def num_tokens(self) -> int:
        """Hit length in tokens."""
        return self.match.num_tokens

    @property
    def block_ids(self) -> list[int]:
        """The hit's blocks."""
        return self.match.block_ids

    def __repr__(self) -> str:
        return f"Lookup(key={self.key!r}, match={self.match!r})"


class _Seq:
    """A running request's record. A plain class: compiled, a dataclass with a default
    factory was built through a Python-level call, a few thousand instructions an
    admission."""

    __slots__ = ("handle", "key", "num_computed", "num_registered_blocks", "private_duplicates",
                 "prompt_len", "table")  # fmt: skip

    def __init__(
        self,
        key: TokenKey,
        prompt_len: int,
        table: list[int],
        handle: CacheHandle,
        num_computed: int,
        num_registered_blocks: int,
    ) -> None:
        self.key = key
        self.prompt_len = prompt_len
        self.table = table
        self.handle = handle
        self.num_computed = num_computed  # tokens whose KV is written (or promised, vLLM-style)
        self.num_registered_blocks = num_registered_blocks  # leading blocks the index holds
        self.private_duplicates: list[int] = []


class CacheManager:
    """Admission, registration and release of requests over one index and one pool.

    Args:
        index: any :class:`~prefixkv.indexes.PrefixIndex`.
        allocator: the pool's free blocks (same block size as the index).
        observers: optional hooks told about admissions, registrations, releases,
            evictions and resets (accounting, metrics); see ``observer.py``.
        enable_kv_cache_events: record the index's KV events (vLLM's switch of the
            same name): ``take_events()`` returns them as vLLM's wire structs, in the
            dialect the index speaks (vLLM's for the hash chain, SGLang's page events
            for the radix tree).

    Arguments are checked on entry: counts are ints, flags bools, a namespace what
    ``make_extra_key`` builds, a lookup what ``match`` returned, with a named error on
    both builds (the compiled build declares these parameters ``object``:
    pyproject.toml's ``[tool.prefixkv.mypyc.checked]``).

    Invariant (``check_invariants``): free + held-only + cached == ``num_blocks``.
    Thread safety: none; one scheduler thread.
    """

    def __init__(
        self,
        index: PrefixIndex,
        allocator: BlockAllocator,
        *,
        observers: Sequence[CacheObserver] = (),
        enable_kv_cache_events: bool = False,
    ) -> None:
        if not isinstance(index, PrefixIndex):
            raise PrefixKVError(f"{index!r:.80} does not implement the PrefixIndex protocol")
        if not isinstance(allocator, BlockAllocator):
            raise PrefixKVError(f"allocator must be a BlockAllocator, got {allocator!r:.80}")
        observer = combine_observers(observers)
        self.index: PrefixIndex = index
        self.allocator: BlockAllocator = allocator
        self.block_size: int = index.block_size
        # The index's evictable count, read each time the free blocks run short: its
        # own O(1) count where it has one (the hash chain), else from its stats.
        ix: PrefixIndex = index
        count = getattr(ix, "num_evictable_blocks", None)
        self._num_evictable: Callable[[], int] = (
            cast("Callable[[], int]", count)
            if callable(count)
            else lambda: ix.stats().num_evictable_blocks
        )
        # The index's insert-and-relock in one call where it has one (the hash chain):
        # a running request registering fresh blocks after its locked prefix.
        self._extend_locked: Callable[..., CacheHandle | None] | None = (
            ix.extend_locked if isinstance(ix, SupportsExtendLocked) else None
        )
        # The hash chain itself, called directly (compiled, a native call: the bound
        # method above is a generic one, with its arguments parsed at every decoded block).
        self._chain: HashChainIndex | None = ix if type(ix) is HashChainIndex else None
        self.totals = CacheTotals()
        self._seqs: dict[RequestId, _Seq] = {}
        self._key_holders: dict[int, RequestId] = {}  # id(key) -> its running request
        self._observer: CacheObserver | None = observer
        self._events: EventRecorder | None = None
        if check_bool("enable_kv_cache_events", enable_kv_cache_events):
            self._events = attach_event_recorder(index)

    # ------------------------------------------------------------ admission

    def _seq(self, request_id: RequestId) -> _Seq:
        try:
            seq = self._seqs.get(request_id)
        except TypeError:  # unhashable: it cannot name a running request
            seq = None
        if seq is None:
            raise RequestStateError(f"request {request_id!r:.80} is not running")
        return seq

    def _blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    def make_key(
        self,
        tokens: Iterable[int] | TokenKey,
        extra_key: str | ExtraKey | None = None,
        priority: int | None = None,
    ) -> TokenKey:
        """Validate a prompt into a key (rejects empty prompts).

        A prepared ``TokenKey`` keeps its own namespace and priority; passing a
        different one with it is an error, never silently dropped.

        Raises:
            InvalidTokenError: an empty prompt, a bad token id or namespace.
            NamespaceConflictError: ``extra_key`` or ``priority`` contradicts the key's.
        """
        if isinstance(tokens, TokenKey):
            key = tokens
            if extra_key is not None and normalize_extra_key(extra_key) != key.extra_key:
                raise NamespaceConflictError(
                    f"extra_key {extra_key!r:.80} conflicts with the key's own namespace "
                    f"{key.extra_key!r:.80}; build the key with it"
                )
            if priority is not None and priority != key.priority:
                raise NamespaceConflictError(
                    f"priority {priority!r} conflicts with the key's own priority {key.priority}"
                )
        else:
            key = TokenKey(tokens, extra_key, 0 if priority is None else priority)
        if not len(key):
            raise InvalidTokenError("a prompt needs at least one token; got an empty prompt")
        return key

    def match(self, key: TokenKey) -> Lookup:
        """Look ``key`` up, capped at ``len(key) - 1`` tokens (SPEC BB-1). Locks nothing."""
        if not isinstance(key, TokenKey):
            raise key_error("key", key)
        return Lookup(key, self.index.match_prefix(key, len(key) - 1))

    def admit(
        self,
        request_id: RequestId,
        tokens: Iterable[int] | TokenKey,
        extra_key: str | ExtraKey | None = None,
        *,
        priority: int | None = None,
        num_tokens: int | None = None,
        reserve_blocks: int = 0,
        lookup: Lookup | None = None,
    ) -> Admission | None:
        """Take a request in: match, lock the hit, allocate blocks for the rest.

        Every argument is checked before anything changes, and whether the blocks
        fit is decided from the state at allocation time (the lookup's blocks that
        are evictable *now* are the ones locking protects), so a ``None`` or an
        error leaves the manager exactly as it was.

        Args:
            request_id: unique among running requests (any hashable).
            tokens: the prompt, or a prepared ``TokenKey`` (not one a running
                request uses: a key is one request's).
            extra_key: namespace (LoRA, cache salt, tenant); see ``make_extra_key``.
                With a prepared key it must agree with the key's own.
            priority: eviction hint for the radix tree's ``priority`` policy
                (default 0; with a prepared key, the key's).
            num_tokens: tokens that need slots now (default: the whole prompt;
                fewer for chunked prefill; never fewer than the hit).
            reserve_blocks: evict until this many blocks beyond the need are free,
                best effort (SGLang's paged over-estimate); never fails on it.
            lookup: what ``match(key)`` returned just before (vLLM's scheduler looks
                up first, allocates second); default: match now.

        Returns:
            The admission, or ``None`` when the blocks do not fit even after
            evicting; then nothing is locked, allocated or evicted.

        Raises:
            RequestStateError: ``request_id`` is running already, or the key is
                another running request's.
            InvalidTokenError: empty prompt or bad tokens.
            NamespaceConflictError: ``extra_key``/``priority`` contradict the key.
            StaleHandleError: ``lookup`` was invalidated since it was made (an
                eviction, ``evict_blocks``, a reset); look up again.
            PrefixKVError: a bad count, or a lookup made for another key.
        """
        key = self._new_key(request_id, tokens, extra_key, priority)
        want = (
            len(key)
            if num_tokens is None
            else check_count("num_tokens", num_tokens, len(key), lo=1)
        )
        reserve = check_count("reserve_blocks", reserve_blocks, self.allocator.num_blocks)
        m = self._lookup_for(key, lookup)
        table = self._take_in(request_id, key, m, want, reserve)
        if table is None:
            return None
        return Admission(request_id, m.num_tokens, list(table))

    def _admit_looked_up(
        self, request_id: RequestId, lookup: Lookup, num_tokens: int
    ) -> list[int] | None:
        # admit(request_id, lookup.key, num_tokens=num_tokens, lookup=lookup) answering
        # only the blocks added past the hit (a fresh list), or None: vLLM's engine class
        # hands the scheduler just those, so it needs no Admission (a NamedTuple, built
        # through a Python-level call compiled) nor a copy of the whole table. Raises as
        # admit does.
        key = self._new_key(request_id, lookup.key, None, None)
        want = check_count("num_tokens", num_tokens, len(key), lo=1)
        m = self._lookup_for(key, lookup)
        table = self._take_in(request_id, key, m, want, 0)
        return None if table is None else table[len(m.block_ids) :]

    def _take_in(
        self, request_id: RequestId, key: TokenKey, m: PrefixMatch, want: int, reserve: int
    ) -> list[int] | None:
        # admit's change of state, its arguments checked: the hit locked, blocks taken
        # for the rest, the request recorded; its table (the record's own list), or None.
        new = self._lock_and_take(m, want, reserve)
        if new is None:
            self.totals.num_rejected += 1
            return None
        table = [*m.block_ids, *new]
        self._record_admission(request_id, key, m, table)
        return table

    def _lock_and_take(self, m: PrefixMatch, want: int, reserve: int) -> list[int] | None:
        # Lock the hit and take blocks for the rest of ``want`` tokens, or change nothing
        # (None). Whether they fit is decided now, before the lock.
        need = self._blocks_for(max(want, m.num_tokens)) - len(m.block_ids)
        if not self._fits(need, m):
            return None
        self.index.lock(m.handle)
        new = self._take_blocks(need, reserve)
        if new is None:  # the index evicted fewer blocks than it counted as evictable
            self._release(self.index.unlock(m.handle))
        return new

    def _record_admission(
        self, request_id: RequestId, key: TokenKey, m: PrefixMatch, table: list[int]
    ) -> None:
        # An admitted request: its record, its key's holder, the totals, the observer.
        self._seqs[request_id] = _Seq(
            key, len(key), table, m.handle, m.num_tokens, len(m.block_ids)
        )
        self._key_holders[id(key)] = request_id
        t = self.totals
        t.num_requests += 1
        t.num_query_tokens += len(key)
        t.num_hit_tokens += m.num_tokens
        if self._observer is not None:
            self._observer.on_admit(request_id, key, m.block_ids, m.num_tokens)

    def _new_key(
        self,
        request_id: RequestId,
        tokens: Iterable[int] | TokenKey,
        extra_key: object,
        priority: object,
    ) -> TokenKey:
        # A new request's id and key: not running, and the key no running request's.
        try:
            running = request_id in self._seqs
        except TypeError:
            raise RequestStateError(f"request id {request_id!r:.80} is not hashable") from None
        if running:
            raise RequestStateError(f"request {request_id!r:.80} is running already")
        key = self.make_key(tokens, cast(Any, extra_key), cast(Any, priority))
        holder = self._key_holders.get(id(key))
        if holder is not None:
            raise RequestStateError(
                f"this TokenKey is the key of running request {holder!r:.80}; give each "
                "request its own key"
            )
        return key

    def _lookup_for(self, key: TokenKey, lookup: object) -> PrefixMatch:
        if lookup is None:
            return self.index.match_prefix(key, len(key) - 1)
        if type(lookup) is Lookup and lookup.key is key:
            return lookup.match
        raise PrefixKVError(
            f"lookup must be what match(key) returned for this request's key, got {lookup!r:.80}"
        )

    def _fits(self, need: int, hit: PrefixMatch | None = None) -> bool:
        # Free blocks, then the evictable ones but the hit's (locking it protects them),
        # counted only when the free blocks fall short (a stale handle raises here then,
        # in count_evictable, as it would in lock).
        free = self.allocator.num_free_blocks
        if need <= free:
            return True
        hit_evictable = 0 if hit is None else self.index.count_evictable(hit.handle)
        return need <= free + self._num_evictable() - hit_evictable

    def _take_blocks(self, need: int, reserve: int = 0) -> list[int] | None:
        # Free blocks first, then evicted ones (vLLM pops unhashed free blocks before
        # cached ones); an index that overshoots (radix leaves) returns the surplus here.
        # None (with the evicted blocks back in the pool) if eviction fell short.
        alloc = self.allocator
        free = alloc.num_free_blocks
        if free >= need + reserve:
            return alloc.allocate(need, owner=Owner.MANAGER)
        evicted = self._evict(need + reserve - free)  # still ours: cached until now
        use = max(0, need - free)
        if use > len(evicted):
            alloc.free(evicted, owner=Owner.MANAGER)
            return None
        if use == need:  # every block an evicted one (a full pool): none taken from the pool
            if len(evicted) > use:
                alloc.free(evicted[use:], owner=Owner.MANAGER)
            return evicted[:use]
        got = alloc.allocate(need - use, owner=Owner.MANAGER)
        assert got is not None
        alloc.free(evicted[use:], owner=Owner.MANAGER)
        return got + evicted[:use]

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
        seq = self._seq(request_id)
        hi = min(len(seq.key), len(seq.table) * self.block_size)
        self._commit(seq, check_count("num_tokens", num_tokens, hi), bool(swap_duplicates))

    def _commit(self, seq: _Seq, num_tokens: int, swap: bool) -> None:
        if num_tokens > seq.num_computed:
            seq.num_computed = num_tokens
        if num_tokens // self.block_size > seq.num_registered_blocks:
            self._register(seq, num_tokens, swap)

    def _register(self, seq: _Seq, num_tokens: int, swap: bool, *, whole: bool = False) -> None:
        # A running request's insert continues from its own node (O(new blocks)); the
        # last one walks the whole path, which restamps it (SGLang's cache_finished_req).
        if not whole and self._extend_locked is not None:
            chain = self._chain
            if chain is not None:
                handle = chain.extend_locked(seq.key, seq.table, num_tokens, seq.handle)
            else:
                handle = self._extend_locked(seq.key, seq.table, num_tokens, seq.handle)
            if handle is not None:  # the index's own blocks are the table's: no duplicates
                self._registered(seq, handle, num_tokens // self.block_size)
                return
        prefix = None if whole else seq.handle
        result = self.index.insert(seq.key, seq.table, num_tokens, prefix)
        base = result.first_block
        theirs = result.block_ids
        n = base + len(theirs)
        start = seq.num_registered_blocks
        table = seq.table
        if n > start and table[start:n] != theirs[start - base :]:
            dups = [i for i in range(start, n) if table[i] != theirs[i - base]]
            if swap:
                self.allocator.free([table[i] for i in dups], owner=Owner.MANAGER)
                for i in dups:
                    table[i] = theirs[i - base]
            else:
                seq.private_duplicates.extend(table[i] for i in dups)
        released = self.index.relock(seq.handle, result.handle)
        self._registered(seq, result.handle, n)
        self._release(released)

    def _registered(self, seq: _Seq, handle: CacheHandle, n: int) -> None:
        # The request now holds ``handle``, its first ``n`` blocks registered.
        seq.handle = handle
        start = seq.num_registered_blocks
        if n > start:
            seq.num_registered_blocks = n
            if self._observer is not None:
                self._observer.on_register(seq.key, seq.table, start, n)

    def _release(self, block_ids: list[int]) -> None:
        # Blocks the index handed back at an unlock (their entries were dropped while
        # locked): no longer cached, back to the pool.
        if block_ids:
            if self._observer is not None:
                self._observer.on_release(block_ids)
            self.allocator.free(block_ids, owner=Owner.MANAGER)

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
        new = checked_tokens(tokens)  # a decode step's token: checked, not copied
        total = len(seq.key.tokens) + len(new)
        slots = total if num_slots is None else check_count("num_slots", num_slots, total)
        reserve = 0
        if type(reserve_blocks) is not int or reserve_blocks:
            reserve = check_count("reserve_blocks", reserve_blocks, self.allocator.num_blocks)
        if self._grow(seq, slots, reserve) is None:
            return False
        seq.key.append(new)
        return True

    def advance(
        self,
        request_id: RequestId,
        num_slots: int,
        num_computed: int | None = None,
        *,
        tokens: Iterable[int] | None = None,
        reserve_blocks: int = 0,
        swap_duplicates: bool = True,
    ) -> list[int] | None:
        """One scheduler step for a running request: slots, then registration.

        Makes sure the first ``num_slots`` tokens have slots, then does
        ``commit(num_computed)`` (vLLM's ``allocate_slots``, which registers
        before the forward pass, passes ``swap_duplicates=False``). Slots may run
        ahead of the key's tokens; registered tokens must be in the key: ``append``
        adds them, or ``tokens`` supplies them. A decode step that needs no new
        block costs O(1).

        Args:
            request_id: the request.
            num_slots: tokens that need slots (its computed tokens and the new ones).
            num_computed: tokens whose KV is written or promised by the end of the
                step (default: no registration).
            tokens: the request's whole sequence so far, of which the key holds a
                prefix (vLLM's ``request.all_token_ids``). Registration is capped at
                its length, and the key learns from it the tokens it lacks when a
                block is to be registered, as vLLM hashes a block once it fills.
            reserve_blocks: evict until this many more blocks are free, best effort.
            swap_duplicates: as in ``commit``.

        Returns:
            The blocks added to the table (often none), or ``None`` (nothing
            changed) when no block can be freed.

        Raises:
            RequestStateError: unknown request.
            PrefixKVError: ``num_slots`` or ``num_computed`` out of range.
            InvalidTokenError: ``tokens`` not a sequence, or a bad id among those
                the key learns.
        """
        seq = self._seq(request_id)
        if self._step_in_place(seq, num_slots, num_computed, reserve_blocks):
            return []
        if _is_array_step(num_slots, num_computed, reserve_blocks, tokens):
            return self._array_step(
                seq, cast(Any, num_slots), cast(int, num_computed), cast("array[int]", tokens),
                bool(swap_duplicates),
            )  # fmt: skip
        # Everything is checked before a block is added, so an error changes nothing.
        slots, computed, reserve = self._check_step(num_slots, num_computed, reserve_blocks)
        computed, learn = self._tokens_to_learn(seq, tokens, computed)
        new = self._grow(seq, slots, reserve)
        if new is not None and computed is not None:
            if learn:
                seq.key.append(learn)
            known = min(computed, len(seq.key.tokens))  # the key may lag its slots
            self._commit(seq, known, bool(swap_duplicates))
        return new

    def step_in_place(self, request_id: RequestId, num_tokens: int) -> bool:
        """``advance(request_id, num_tokens, num_tokens)`` when that step needs no block and
        registers none (most decode steps): done, ``True``; else ``False``, nothing changed.

        The engine classes try it first, so such a step reads nothing else of the request
        (``advance`` takes its tokens, for the step that fills a block). O(1).

        Raises:
            RequestStateError: unknown request.
        """
        return self._step_in_place(self._seq(request_id), num_tokens, num_tokens, 0)

    def step_if_running(self, request_id: RequestId, num_tokens: int) -> bool | None:
        """``step_in_place`` for a request that may not be running: ``None`` when it is
        not (nothing changed; an unhashable id is none).

        One lookup of the request where ``in`` then ``step_in_place`` made two: vLLM's
        engine class asks both at every decode step, with an int it has checked (typed
        ``int``: compiled, the count is neither boxed nor unboxed on the way). O(1).
        """
        try:
            seq = self._seqs.get(request_id)
        except TypeError:
            return None
        if seq is None:
            return None
        if not 0 <= num_tokens <= len(seq.table) * self.block_size:
            return False  # a block to add
        return self._computed_in_place(seq, num_tokens)

    def _step_in_place(
        self, seq: _Seq, num_slots: object, num_computed: object, reserve_blocks: object
    ) -> bool:
        # The common decode step, done in place: its slots are in the table already,
        # no block to reserve, nothing new to register. False: the checked path.
        bs = self.block_size
        if not (
            type(num_slots) is int
            and 0 <= num_slots <= len(seq.table) * bs
            and type(reserve_blocks) is int
            and reserve_blocks == 0
        ):
            return False
        if num_computed is None:
            return True
        if type(num_computed) is int and 0 <= num_computed <= num_slots:
            return self._computed_in_place(seq, num_computed)
        return False

    def _computed_in_place(self, seq: _Seq, num_computed: int) -> bool:
        # The tokens up to ``num_computed`` are written, with no new block to register
        # (False: there is one, the checked path registers it).
        if num_computed // self.block_size > seq.num_registered_blocks:
            return False
        if num_computed > seq.num_computed:
            seq.num_computed = min(num_computed, len(seq.key.tokens))
        return True

    def _array_step(
        self, seq: _Seq, num_slots: int, num_computed: int, tokens: array[int], swap: bool
    ) -> list[int] | None:
        # ``advance`` with counts and a token array that need no check (_is_array_step:
        # the engine class's step, a block filling or one more needed), without the
        # checked path's generic steps: slots, then the tokens the key lacks, then the
        # commit, as that path does them.
        new = self._grow(seq, num_slots, 0)
        if new is None:
            return None
        key = seq.key
        have = len(key.tokens)
        if num_computed // self.block_size > seq.num_registered_blocks and len(tokens) > have:
            key.append(tokens[have:])
        self._commit(seq, min(num_computed, len(key.tokens)), swap)
        return new

    def _check_step(
        self, num_slots: object, num_computed: object, reserve_blocks: object
    ) -> tuple[int, int | None, int]:
        """``advance``'s counts checked: slots, computed (None: no registration) and
        the blocks to reserve."""
        slots = check_count("num_slots", num_slots)
        computed = None
        if num_computed is not None:
            computed = check_count("num_computed", num_computed, slots)
        reserve = 0
        if type(reserve_blocks) is not int or reserve_blocks:
            reserve = check_count("reserve_blocks", reserve_blocks, self.allocator.num_blocks)
        return slots, computed, reserve

    def _tokens_to_learn(
        self, seq: _Seq, tokens: object, computed: int | None
    ) -> tuple[int | None, Sequence[int]]:
        # ``computed`` capped at the sequence's length, and the ids the key lacks when
        # a block is to be registered (checked; vLLM hashes a block once it fills).
        if tokens is None:
            return computed, ()
        if type(tokens) not in _SEQUENCE_TYPES and not _is_token_sequence(tokens):
            raise InvalidTokenError(f"tokens must be a sequence of ids, got {tokens!r:.80}")
        if computed is None:
            return None, ()
        known = cast("Sequence[int]", tokens)
        have = len(seq.key.tokens)
        computed = min(computed, len(known))
        if computed // self.block_size > seq.num_registered_blocks and len(known) > have:
            if type(known) is array and known.typecode == TOKEN_TYPECODE:
                return computed, known[have:]  # ids by their type: the slice is the copy
            return computed, checked_tokens(known[have:], have)  # positions in tokens
        return computed, ()

    def _grow(self, seq: _Seq, slots: int, reserve: int) -> list[int] | None:
        need = self._blocks_for(slots) - len(seq.table)
        if need <= 0 and reserve <= 0:
            return []
        if need > 0 and not self._fits(need):
            return None
        new = self._take_blocks(max(need, 0), reserve)
        if new is None:
            return None
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
            self._register(seq, seq.num_computed, True, whole=True)
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
        # Unlock first: it is the step that can refuse (and then nothing has changed).
        released = self.index.unlock(seq.handle)
        del self._seqs[request_id]
        del self._key_holders[id(seq.key)]
        if self._observer is not None:
            self._observer.on_finish(
                request_id, seq.key, seq.table, seq.num_registered_blocks, seq.num_computed
            )
        private = seq.table[seq.num_registered_blocks :] + seq.private_duplicates
        private.reverse()  # vLLM frees in reverse: the tail block is reused first
        self.allocator.free(private, owner=Owner.MANAGER)
        self._release(released)

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

    def running(self) -> list[RequestId]:
        """Requests admitted and not finished, oldest first."""
        return list(self._seqs)

    @property
    def observed(self) -> bool:
        """Whether observers hear this manager's changes (else what only they would
        read, a released request's last computed tokens, need not be told). O(1)."""
        return self._observer is not None

    def __contains__(self, request_id: object) -> bool:
        try:
            return request_id in self._seqs
        except TypeError:  # unhashable: never a running request's id
            return False

    def num_common_prefix_blocks(self, request_id: RequestId) -> int:
        """Leading blocks of the request's table shared by every running request (HC-11).

        Uses the index's ``num_common_prefix_blocks`` (O(result)) when it has one,
        else compares block tables.
        """
        seq = self._seq(request_id)
        n_req = len(self._seqs)
        if isinstance(self.index, SupportsCommonPrefix):
            n = self.index.num_common_prefix_blocks(seq.table[: seq.num_registered_blocks], n_req)
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
        evicted = self._evict(check_count("num_blocks", num_blocks))
        self.allocator.free(evicted, owner=Owner.MANAGER)
        return len(evicted)

    def _evict(self, num_blocks: int) -> list[int]:
        # The index gives blocks back; the caller decides where they go.
        evicted = self.index.evict(num_blocks)
        self.totals.num_evicted_blocks += len(evicted)
        if evicted and self._observer is not None:
            self._observer.on_evict(evicted)
        return evicted

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the cache entries of ``block_ids`` (vLLM KV-connector interface).

        Ids of blocks the index does not cache are ignored, as in vLLM; ids outside
        the pool are an error.

        Raises:
            PrefixKVError: the index cannot drop entries by block id.
            BlockOwnershipError: a malformed id or one outside the pool; nothing changes.
        """
        ids = check_block_ids(block_ids, "evict_blocks", self.allocator.num_blocks, unique=False)
        if not isinstance(self.index, SupportsEvictBlocks):
            raise PrefixKVError(f"{type(self.index).__name__} cannot evict entries by block id")
        freed = self.index.evict_blocks(ids)
        if self._observer is not None:
            self._observer.on_release(ids)
        self.totals.num_evicted_blocks += len(freed)
        self.allocator.free(freed, owner=Owner.MANAGER)

    def reset(self) -> None:
        """Drop the whole prefix cache; its blocks return to the pool.

        Raises:
            CacheInUseError: requests are running; nothing changes.
        """
        if self._seqs:
            raise CacheInUseError(f"cannot reset: {len(self._seqs)} requests are running")
        self.allocator.free(self.index.reset(), owner=Owner.MANAGER)
        if self._observer is not None:
            self._observer.on_reset()

    def take_events(self) -> list[KVEvent]:
        """The KV events since the last call, oldest first (vLLM's ``take_events``);
        empty unless built with ``enable_kv_cache_events``."""
        return [] if self._events is None else self._events.take_events()

    @property
    def usage(self) -> float:
        """Fraction of the pool in use, vLLM's ``usage``: evictable cached blocks count
        as free (they are in vLLM's free queue), held and locked ones as used."""
        free = self.allocator.num_free_blocks + self.index.stats().num_evictable_blocks
        return 1.0 - free / self.allocator.num_blocks

    def num_held_only_blocks(self) -> int:
        """Blocks held by running requests and not owned by the index."""
        return sum(
            len(s.table) - s.num_registered_blocks + len(s.private_duplicates)
            for s in self._seqs.values()
        )

    def check_invariants(self) -> None:
        """Conservation: free + held-only + cached (+ held by callers) == num_blocks.

        Every block a request holds or the index caches is the manager's in the
        allocator's ledger, and no block is held privately twice.

        Raises:
            AssertionError: describing the leak or double ownership.
        """
        alloc = self.allocator
        alloc.check_invariants()
        self.index.check_invariants()
        cached = self.index.stats().num_cached_blocks
        free = alloc.num_free_blocks
        held = self.num_held_only_blocks()
        ours = alloc.num_blocks_held_by(Owner.MANAGER)
        callers = alloc.num_blocks_held_by(Owner.CALLER)
        assert free + held + cached + callers == alloc.num_blocks, (
            f"blocks leak or double count: free {free} + held-only {held} + cached {cached} "
            f"+ held by callers {callers} != {alloc.num_blocks}"
        )
        assert ours == held + cached, (
            f"the ledger gives the manager {ours} blocks, it holds {held} + caches {cached}"
        )
        seen: set[int] = set()
        for rid, s in self._seqs.items():
            private = s.table[s.num_registered_blocks :] + s.private_duplicates
            for b in private:
                assert alloc.owner_of(b) is Owner.MANAGER, f"{rid!r} holds block {b}, not ours"
                assert b not in seen, f"block {b} held privately twice"
                seen.add(b)
            for b in s.table[: s.num_registered_blocks]:
                assert alloc.owner_of(b) is Owner.MANAGER, f"{rid!r} reads block {b}, not ours"
            assert len(s.table) * self.block_size >= s.num_computed, f"{rid!r} lacks slots"
            assert self._key_holders.get(id(s.key)) == rid, f"{rid!r}: key ownership lost"
        assert len(self._key_holders) == len(self._seqs), "a finished request still holds a key"


_SEQUENCE_TYPES: set[type] = {list, tuple, array}
"""Types ``advance`` has accepted as token sequences (vLLM's ``ConstantList`` joins at
its first step): the ``Sequence`` check is an ABC's, a few thousand instructions each
time, and a block-filling decode step makes it."""


def _is_array_step(
    num_slots: object, num_computed: object, reserve_blocks: object, tokens: object
) -> bool:
    """Whether ``advance``'s arguments pass its checks as they stand: counts in range, no
    reserve, the sequence a token array (its ids valid by type) holding the computed
    tokens. A block-filling step of vLLM's engine class in the lab's replays."""
    return (
        type(num_slots) is int
        and type(num_computed) is int
        and 0 <= num_computed <= num_slots
        and type(reserve_blocks) is int
        and reserve_blocks == 0
        and type(tokens) is array
        and tokens.typecode == TOKEN_TYPECODE
        and num_computed <= len(tokens)
    )


def _is_token_sequence(tokens: object) -> bool:
    if not isinstance(tokens, Sequence) or isinstance(tokens, (str, bytes)):
        return False
    if len(_SEQUENCE_TYPES) < 64:  # bounded, whatever classes a caller makes
        _SEQUENCE_TYPES.add(type(tokens))
    return True


def _common_len(a: list[int], b: list[int], limit: int) -> int:
    n = min(limit, len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])
