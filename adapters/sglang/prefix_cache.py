"""THE SGLang 0.5.23 prefix cache (``RadixCache``'s API) over any prefixkv index.

One class, engine-free (no sglang, no torch) and compiled: the fidelity fixtures of
``make test`` replay it, and inside SGLang it is the ``BasePrefixCache`` that
``--radix-cache-backend prefixkv-*`` builds (``plugin.py`` subclasses it and only
converts SGLang's types). SGLang's scheduler drives it as it drives ``RadixCache``:

    admission   match_prefix (capped at len - 1), lock the node, allocate the rest
                (the scheduler's, evicting through ``evict``), write the request's row
    checkpoint  insert the row's pages, free duplicates, move the lock  (SG-3)
    release     final checkpoint split at the prompt, free the private pages, unlock
                (SG-4; ``cache_finished_req``)

Why on the index and a page pool, not on ``CacheManager``: SGLang's tree cache owns no
block tables. The scheduler allocates slots and keeps each request's row in its
``req_to_token_pool``; the request carries its own cache state (``req.kv``,
``req.last_node``, ``req.lock``); the tree holds only what is cached. Sitting on the
manager would put a second copy of every request's table beside SGLang's own rows,
which is what made the old plug-in bypass it. So the cache sits where ``RadixCache``
does: on a :class:`~.pools.PagePool` (free pages) and a :class:`~.pools.ReqToPagePool`
(rows of pages), both the scheduler's, and calls the :class:`CacheObserver` hooks at
the manager's moments (``on_admit``, a checkpoint's new pages, evictions, released
pages, ``on_release``, ``reset``), so accounting works on either lifecycle. Pages are
what vLLM calls blocks: the cache works in page ids, sizes are in tokens.

One namespace rule (:meth:`PrefixCache.namespace`): SGLang's ``RadixKey`` fields,
``extra_key`` and ``cache_salt``, and the request's LoRA id as a field of its own.
SGLang's ``Req`` appends its LoRA id to ``extra_key``, so there a base-model
``extra_key="ab"`` and a LoRA ``"b"`` request with ``extra_key="a"`` share pages; here
they never do. Inside SGLang (``fold_lora``) lookups carry no LoRA id, so the plug-in
keeps SGLang's rule (the adapters README says why that is safe there).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, NamedTuple, cast

from prefixkv.indexes.base import CacheHandle, PrefixIndex, describe
from prefixkv.indexes.errors import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    PrefixKVError,
    RequestStateError,
)
from prefixkv.indexes.registry import make_index
from prefixkv.indexes.tokens import ExtraKey, TokenKey, make_extra_key
from prefixkv.indexes.validation import (
    MAX_BLOCKS,
    ceil_div,
    check_block_ids,
    check_bool,
    check_count,
)
from prefixkv.storage.allocator import BlockAllocator

from ..events.dialects import EventRecorder, attach_event_recorder
from ..events.wire import KVEvent
from ..observer import CacheObserver, combine_observers
from ..requests import ReqLike
from ..totals import CacheTotals
from ._mypyc import mypyc_attr
from .page_rows import PageRows
from .pools import PagePool, ReqToPagePool

__all__ = ["MatchResult", "PrefixCache", "PrefixNode"]


class PrefixNode:
    """What a request holds as ``req.last_node`` (and as ``req.lock``): a cached prefix.

    Attributes:
        handle: the index's handle for the prefix (``None`` for the root: nothing).
        page_ids: the prefix's pages are its first ``num_tokens // page_size``
            entries, in order (valid while the prefix is locked; a checkpoint's node
            shares its request's list, which grows past them).
        num_tokens: the prefix's length in tokens.
    """

    __slots__ = ("handle", "num_tokens", "page_ids")

    def __init__(self, handle: CacheHandle | None, page_ids: list[int], num_tokens: int) -> None:
        self.handle = handle
        self.page_ids = page_ids
        self.num_tokens = num_tokens

    def __repr__(self) -> str:
        return f"<prefixkv node: {self.num_tokens} tokens>"


class MatchResult(NamedTuple):
    """A lookup: the hit's pages, its node and its length (SGLang's ``MatchResult``).

    ``device_indices`` are page ids, which at page size 1 are SGLang's KV slots
    (``slot = page * page_size + offset``). They may be the index's own list (the
    radix tree lends a hit held by one node): read them, never mutate them.
    """

    device_indices: list[int]
    last_node: PrefixNode
    prefix_len: int


class _ReqState:
    # A checkpointed request's key and the cached part of its row (its first
    # cache_protected_len tokens' pages), kept across its checkpoints so each one
    # reads only the new pages and inserts from the last node: O(new pages), where
    # re-reading the row would cost O(request) (the index keeps its memo in the key).
    __slots__ = ("key", "req", "table")

    def __init__(self, req: object, key: TokenKey, table: list[int]) -> None:
        self.req = req
        self.key = key
        self.table = table


def simulated_parts(
    index: PrefixIndex | str,
    capacity_tokens: int,
    page_size: int | None,
    max_rows: int | None = None,
) -> tuple[PrefixIndex, BlockAllocator, PageRows]:
    """The index, page pool and rows of :meth:`PrefixCache.create_simulated`.

    Raises:
        PrefixKVError: a bad index name, page size or capacity.
    """
    if isinstance(index, str):
        index = make_index(index, block_size=1 if page_size is None else cast(Any, page_size))
    elif page_size is not None and page_size != index.block_size:
        raise PrefixKVError(f"page_size {page_size!r} != the index's block size {index.block_size}")
    if not isinstance(index, PrefixIndex):
        raise PrefixKVError(f"{index!r:.80} does not implement the PrefixIndex protocol")
    ps = index.block_size
    num_pages = capacity_tokens // ps if type(capacity_tokens) is int else 0
    if num_pages <= 0:
        raise PrefixKVError(
            f"capacity_tokens must hold at least one page of {ps}, got {capacity_tokens!r:.80}"
        )
    if max_rows is not None:
        check_count("max_running_requests", max_rows, lo=1)
    return index, BlockAllocator(num_pages), PageRows(max_rows)


@mypyc_attr(allow_interpreted_subclasses=True)
class PrefixCache:
    """SGLang's prefix cache on a prefixkv index, a page pool and request rows.

    Args:
        index: any :class:`~prefixkv.indexes.PrefixIndex`; its ``block_size`` is the
            page size.
        pool: the free pages (:class:`~.pools.PagePool`; a ``BlockAllocator`` is one).
        rows: the requests' rows of pages (:class:`~.pools.ReqToPagePool`).
        observers: hooks told about admissions, new cached pages, evictions,
            releases and resets (accounting, metrics); see ``observer.py``.
        enable_kv_cache_events: record the index's KV events for ``take_events``.
        fold_lora: key a request's LoRA only by its place in ``extra_key``, as
            SGLang does (the plug-in: SGLang's lookups carry no LoRA id); by default
            ``req.lora_id`` is a namespace field of its own.

    Requests are SGLang's ``Req`` or :class:`~prefixkv.adapters.requests.SimpleReq`
    (:class:`~prefixkv.adapters.requests.ReqLike`): the cache reads their tokens and
    namespace and keeps their cache state where SGLang does (``req.kv``,
    ``req.last_node``, ``req.lock``). Sizes are in tokens. Thread safety: none (the
    scheduler thread). Errors: a named ``PrefixKVError``, and nothing changed.
    """

    def __init__(
        self,
        index: PrefixIndex,
        pool: PagePool,
        rows: ReqToPagePool,
        *,
        observers: Sequence[CacheObserver] = (),
        enable_kv_cache_events: bool = False,
        fold_lora: bool = False,
    ) -> None:
        if not isinstance(index, PrefixIndex):
            raise PrefixKVError(f"{index!r:.80} does not implement the PrefixIndex protocol")
        if not isinstance(pool, PagePool):
            raise PrefixKVError(f"pool must be a PagePool (a BlockAllocator), got {pool!r:.80}")
        if not isinstance(rows, ReqToPagePool):
            raise PrefixKVError(f"rows must be a ReqToPagePool (PageRows), got {rows!r:.80}")
        observer = combine_observers(observers)
        self.index: PrefixIndex = index
        self.pool: PagePool = pool
        self.rows: ReqToPagePool = rows
        self.page_size: int = index.block_size
        self.totals = CacheTotals()
        self.root_node = PrefixNode(None, [], 0)
        self.event_recorder: EventRecorder | None = None
        if check_bool("enable_kv_cache_events", enable_kv_cache_events):
            self.event_recorder = attach_event_recorder(index)
        self._observer: CacheObserver | None = observer
        self.fold_lora = check_bool("fold_lora", fold_lora)
        self._caches = describe(index).caches
        self._reqs: dict[Hashable, _ReqState] = {}

    @classmethod
    def create_simulated(
        cls,
        index: PrefixIndex | str = "radix",
        capacity_tokens: int = 65536,
        page_size: int | None = None,
        *,
        max_running_requests: int | None = None,
        observers: Sequence[CacheObserver] = (),
        enable_kv_cache_events: bool = False,
        fold_lora: bool = False,
    ) -> PrefixCache:
        """A cache on its own pools, without an engine (SGLang's ``create_simulated``).

        Args:
            index: an index, or a registry name (``"radix"`` default; built with the
                index's own block-ownership checks, which guard :meth:`insert`).
            capacity_tokens: the page pool in tokens (whole pages are used).
            page_size: tokens per page when ``index`` is a name (default 1).
            max_running_requests: rows for running requests (default: unbounded).
            observers: as in the constructor.
            enable_kv_cache_events, fold_lora: as in the constructor.

        Raises:
            PrefixKVError: a bad index, page size or capacity.
        """
        parts = simulated_parts(index, capacity_tokens, page_size, max_running_requests)
        return cls(
            *parts,
            observers=observers,
            enable_kv_cache_events=enable_kv_cache_events,
            fold_lora=fold_lora,
        )

    # ------------------------------------------------------------ the tree API

    def namespace(
        self, extra_key: str | None, cache_salt: str | None, lora_id: str | None = None
    ) -> ExtraKey | None:
        """The namespace of SGLang's ``RadixKey(extra_key, cache_salt)`` and a LoRA id.

        Each is a field of its own (:func:`~prefixkv.indexes.tokens.make_extra_key`),
        so no two different triples share a page. ``extra_key`` is SGLang's as the
        request carries it (its ``Req`` appends the LoRA id; ``""`` is a namespace of
        its own, as in SGLang); an empty ``cache_salt`` is no salt.

        Raises:
            InvalidTokenError: a field that is not a str (or int), or not valid
                Unicode.
        """
        salt = None if cache_salt is None or cache_salt == "" else cache_salt
        if extra_key is None and salt is None and lora_id is None:
            return None
        return make_extra_key(
            extra=cast(Any, extra_key), cache_salt=cast(Any, salt), lora=cast(Any, lora_id)
        )

    def request_namespace(self, req: ReqLike) -> ExtraKey | None:
        """A request's namespace: its ``extra_key``, ``cache_salt`` and ``lora_id``
        (the LoRA id left to ``extra_key`` alone with ``fold_lora``).

        Raises:
            InvalidTokenError: as :meth:`namespace`.
        """
        lora: Any = None if self.fold_lora else req.lora_id  # checked there
        return self.namespace(cast(Any, req.extra_key), cast(Any, req.cache_salt), lora)

    def _key(
        self, tokens: Iterable[int], extra_key: object, cache_salt: object, lora_id: object
    ) -> TokenKey:
        ns = self.namespace(cast(Any, extra_key), cast(Any, cache_salt), cast(Any, lora_id))
        return TokenKey(tokens, ns)

    def _req_key(self, req: ReqLike, tokens: Iterable[int], priority: object) -> TokenKey:
        return TokenKey(tokens, self.request_namespace(req), cast(Any, priority))

    def match_req(self, req: ReqLike, *, max_prefix_len: int | None = None) -> MatchResult:
        """Longest cached prefix of the request's prompt in its own namespace
        (SGLang's ``match_prefix_for_req``); as :meth:`match_prefix` otherwise.

        Raises:
            InvalidTokenError, PrefixKVError: as :meth:`match_prefix`.
        """
        return self._match(self._req_key(req, req.origin_input_ids, 0), max_prefix_len)

    def match_prefix(
        self,
        token_ids: Sequence[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        lora_id: str | None = None,
        max_prefix_len: int | None = None,
    ) -> MatchResult:
        """Longest cached prefix of ``token_ids``, page-aligned; locks nothing.

        May split a radix node where the match ends and stamps the path (SG-5), as
        SGLang's does.

        Args:
            token_ids: the sequence.
            extra_key: SGLang's ``RadixKey.extra_key``.
            cache_salt: SGLang's ``RadixKey.cache_salt``.
            lora_id: the request's LoRA id (see :meth:`namespace`).
            max_prefix_len: cap on the hit (SGLang's ``limit``: the scheduler passes
                ``len - 1``).

        Raises:
            InvalidTokenError: a bad token id or namespace.
            PrefixKVError: a bad ``max_prefix_len``.
        """
        return self._match(self._key(token_ids, extra_key, cache_salt, lora_id), max_prefix_len)

    def _match(self, key: TokenKey, max_prefix_len: object) -> MatchResult:
        limit = None
        if max_prefix_len is not None:
            limit = check_count("max_prefix_len", max_prefix_len)
        m = self.index.match_prefix(key, limit)
        if m.num_tokens == 0:
            return MatchResult([], self.root_node, 0)
        node = PrefixNode(m.handle, m.block_ids, m.num_tokens)
        return MatchResult(m.block_ids, node, m.num_tokens)

    def insert(
        self,
        token_ids: Sequence[int],
        value: Iterable[int],
        extra_key: str | None = None,
        cache_salt: str | None = None,
        *,
        lora_id: str | None = None,
    ) -> int:
        """Insert ``token_ids`` held in pages ``value``; returns the already cached length.

        ``value`` holds one page per whole page of ``token_ids``: pages the caller
        allocated from the pool, or, for a cached prefix, the tree's own pages for
        exactly those tokens. Pages past the returned length become the cache's; as
        in SGLang, the caller frees its own copies of the part that was cached.

        Precondition, as in SGLang's ``RadixCache.insert`` (which checks none of it):
        no other running request holds a page of ``value`` privately. That cannot be
        seen here (``insert`` names no request; the rows are the scheduler's); such a
        page would end up shared by the cache and that request. A running request's
        own pages go in through ``cache_unfinished_req`` / ``cache_finished_req``.

        Raises:
            BlockOwnershipError: too few pages, a malformed, out-of-range, repeated
                or free page, or one the index caches for other tokens; nothing
                changes.
            InvalidTokenError: a bad token id or namespace.
        """
        key = self._key(token_ids, extra_key, cache_salt, lora_id)
        pages = len(key) // self.page_size
        ids = check_block_ids(value, "insert", self.pool.num_blocks)
        if len(ids) < pages:
            raise BlockOwnershipError(f"insert: {pages} pages to insert, {len(ids)} page ids given")
        ids = ids[:pages]
        for p in ids:
            if self.pool.is_free(p):
                raise BlockOwnershipError(f"insert: page {p} is free; insert pages you allocated")
        return self.index.insert(key, ids).num_cached_tokens

    def evict(self, num_tokens: int) -> int:
        """Evict unlocked leaves until ``num_tokens`` tokens are free (SG-6).

        Returns:
            Tokens freed: whole leaves go, so it may be more than asked.

        Raises:
            PrefixKVError: ``num_tokens`` is not a non-negative int.
        """
        return self._evict(check_count("num_tokens", num_tokens, MAX_BLOCKS * self.page_size))

    def _evict(self, num_tokens: int) -> int:
        evicted = self._evict_pages(ceil_div(num_tokens, self.page_size))
        if evicted:
            self.pool.free(evicted)
        return len(evicted) * self.page_size

    def _evict_pages(self, num_pages: int) -> list[int]:
        # Evict unlocked leaves until num_pages pages are out of the index (whole leaves:
        # maybe more) and hand them to the caller, not to the pool: the scheduler's
        # allocation (simulated._take_pages) reuses them at once, so a page the index
        # held stays the pool's caller's throughout, neither freed nor handed out again
        # (two ledger passes a page saved at page size 1). The caller frees the rest.
        pages = min(num_pages, self.pool.num_blocks)
        if pages <= 0:
            return []
        evicted = self.index.evict(pages)
        if evicted:
            self.totals.num_evicted_blocks += len(evicted)
            if self._observer is not None:
                self._observer.on_evict(evicted)
        return evicted

    def inc_lock_ref(self, node: PrefixNode) -> int:
        """Lock ``node`` and its ancestors (RX-5).

        Returns:
            Minus the tokens that stopped being evictable (SGLang's ``delta``).

        Raises:
            InvalidHandleError: not a node of this cache; ``StaleHandleError`` when
                it was evicted since the lookup. Nothing changes.
        """
        n = self._node(node)
        before = self.index.stats().num_evictable_blocks
        self._lock(n)
        return (self.index.stats().num_evictable_blocks - before) * self.page_size

    def dec_lock_ref(self, node: PrefixNode) -> int:
        """Release one lock on ``node`` and its ancestors; unlocking never deletes.

        Returns:
            The tokens that became evictable (SGLang's ``delta``).

        Raises:
            InvalidHandleError: not a node of this cache. ``LockStateError``: not locked.
        """
        n = self._node(node)
        before = self.index.stats().num_evictable_blocks
        self._unlock(n)
        return (self.index.stats().num_evictable_blocks - before) * self.page_size

    def lock(self, node: PrefixNode) -> PrefixNode:
        """Take one lock on ``node`` for one holder; returns what ``unlock`` takes."""
        n = self._node(node)
        self._lock(n)
        return n

    def unlock(self, lock: PrefixNode | None) -> None:
        """Release a lock ``lock`` returned (``None``: nothing)."""
        if lock is not None:
            self._unlock(self._node(lock))

    def _node(self, node: object) -> PrefixNode:
        if type(node) is not PrefixNode:
            raise InvalidHandleError(f"{node!r:.80} is not a node this cache returned")
        return node

    def _lock(self, node: PrefixNode) -> None:
        if node.handle is not None:
            self.index.lock(node.handle)

    def _unlock(self, node: PrefixNode) -> None:
        if node.handle is not None:
            self._release(self.index.unlock(node.handle))

    def _release(self, pages: list[int]) -> None:
        # Pages the index handed back at an unlock (dropped while locked): free now.
        if pages:
            if self._observer is not None:
                self._observer.on_release(pages)
            self.pool.free(pages)

    # ------------------------------------------------------- the request flow

    def on_admit(self, req: ReqLike, match: MatchResult) -> None:
        """The scheduler admitted ``req`` with ``match``: count it, tell the observers.

        SGLang's scheduler counts its hits itself; prefixkv's totals and observers
        hear of an admission here (the manager's ``admit`` moment).

        Raises:
            PrefixKVError: ``match`` is not a ``MatchResult``; nothing is counted.
        """
        if not isinstance(match, MatchResult):
            raise PrefixKVError(f"match must be a MatchResult, got {match!r:.80}")
        prompt = req.origin_input_ids
        t = self.totals
        t.num_requests += 1
        t.num_query_tokens += len(prompt)
        t.num_hit_tokens += match.prefix_len
        if self._observer is not None:
            key = self._req_key(req, prompt, req.priority or 0)
            self._observer.on_admit(req.rid, key, match.device_indices, match.prefix_len)

    def cache_unfinished_req(self, req: ReqLike) -> None:
        """Checkpoint a running request's committed tokens (SG-3; SGLang's
        ``checkpoint_kv_cache``): insert its whole pages, free its duplicates, move
        its lock to the new node.

        Raises:
            RequestStateError: ``req`` holds no row (not admitted, or released), or
                its id is another running request's.
            InvalidTokenError: a bad token among the new ones. Nothing changes.
        """
        self._checkpoint(req, req.kv.kv_committed_len, False)

    def checkpoint(self, req: ReqLike, *, up_to: int, final: bool = False) -> None:
        """Insert the request's first ``up_to`` tokens (page-aligned) and re-anchor it.

        SGLang's ``checkpoint``: frees the row's pages whose content the index held
        already and points the row at the index's copies, splits at the prompt's
        end (outputs become a leaf of their own, evicted first), sets
        ``req.kv.cache_protected_len`` and moves ``req.lock`` / ``req.last_node`` to
        the new node. ``final`` (SGLang: ``req.finished()``) walks the whole path,
        restamping it, as SGLang's insert at release does; otherwise the insert
        continues from the request's node (O(new pages)).

        Raises:
            RequestStateError, InvalidTokenError: as :meth:`cache_unfinished_req`.
            PrefixKVError: ``up_to`` beyond the request's slots or tokens.
        """
        self._checkpoint(req, up_to, check_bool("final", final))

    def _checkpoint(self, req: ReqLike, up_to: object, final: bool) -> None:
        kv = req.kv
        row = held_row(req)
        ps = self.page_size
        n = check_count("up_to", up_to, kv.kv_allocated_len)
        protected = kv.cache_protected_len
        start = protected // ps
        state = self._request_state(req, row, n, start)
        key, pages = state.key, state.table
        n -= n % ps
        if n == 0 or (n <= protected and not final):
            return
        # A first checkpoint's table holds its pages already (one copy of the row);
        # a later one's holds the cached part, equal to the row's, and the new pages
        # follow from the row.
        if len(pages) != n // ps:
            del pages[start:]  # the row's cached part; its new pages follow
            pages += self.rows.read(row, start, n // ps)
        old = req.last_node
        prefix = None if final or type(old) is not PrefixNode else old.handle
        result = self.index.insert(key, pages, n, prefix)
        base, theirs = result.first_block, result.block_ids
        got = base + len(theirs)
        # Only pages the index held before may differ from the row's (InsertResult):
        # past them it keeps the pages given, so the compare stops there.
        top = min(got, result.num_cached_tokens // ps)
        if top > start and pages[start:top] != theirs[start - base : top - base]:
            dups = [i for i in range(start, top) if pages[i] != theirs[i - base]]
            if dups:  # computed again while cached (a batch, SG-3): keep the tree's
                self.pool.free([pages[i] for i in dups])
                for i in dups:
                    pages[i] = theirs[i - base]
                self.rows.write(row, start, pages[start:top])
        del pages[got:]
        new = self.root_node if got == 0 else PrefixNode(result.handle, pages, got * ps)
        lock = req.lock
        if lock is old and type(old) is PrefixNode and old.handle is not None and got:
            self._release(self.index.relock(old.handle, result.handle))
        else:
            self._lock(new)
            self.unlock(cast(Any, lock))
        req.lock = new
        req.last_node = new
        kv.cache_protected_len = max(protected, got * ps)
        kv.cache_inserted_len = max(kv.cache_inserted_len, got * ps)
        if got > start and self._observer is not None:
            self._observer.on_register(key, pages, start, got)
        prompt = len(req.origin_input_ids) // ps * ps
        if protected < prompt < got * ps:  # a node boundary at the prompt's end (SG-4)
            self.index.insert(key, pages, prompt)

    def cache_finished_req(self, req: ReqLike, is_insert: bool = True) -> None:
        """Release a request (SG-4; SGLang's ``release_kv_cache``).

        With ``is_insert`` its committed tokens are checkpointed first (the prompt
        and every fed token; the last sampled token has no KV); without, nothing more
        is cached (a retraction or abort). Then its private pages are freed (tail
        first), its lock released and its row freed.

        Raises:
            RequestStateError: ``req`` holds no row (not admitted, or released).
            InvalidTokenError: a bad token among the new ones. Nothing changes.
        """
        kv = req.kv
        row = held_row(req)
        if check_bool("is_insert", is_insert):
            self._checkpoint(req, kv.kv_committed_len, True)
        lock = req.lock
        self.unlock(cast(Any, lock))  # the step that can refuse: first
        req.lock = None
        ps = self.page_size
        private = self.rows.read(
            row, kv.cache_protected_len // ps, ceil_div(kv.kv_allocated_len, ps)
        )
        private.reverse()  # the tail is reused first
        self.pool.free(private)
        self.on_release(req)
        self.rows.free(row)
        kv.req_pool_idx = None

    def on_release(self, req: ReqLike, *, checkpointed: bool = True) -> None:
        """The request's row is being released (SGLang's hook): drop its state here.

        Tells the observers the request ended; its row is still readable.
        """
        check_bool("checkpointed", checkpointed)
        state = self._reqs.get(req.rid)
        if state is not None and state.req is req:
            del self._reqs[req.rid]
        else:
            state = None
        if self._observer is not None:
            kv = req.kv
            row = kv.req_pool_idx
            n = kv.kv_committed_len
            ps = self.page_size
            n_pages = ceil_div(kv.kv_allocated_len, ps)
            pages = [] if row is None else self.rows.read(row, 0, n_pages)
            if state is None:
                key = self._req_key(req, _tokens(req, 0, n), 0)
            else:
                key = state.key
                if len(key) < n:
                    key.append(_tokens(req, len(key), n))
            self._observer.on_finish(req.rid, key, pages, kv.cache_protected_len // ps, n)

    def _request_state(self, req: ReqLike, row: int, num_tokens: int, start: int) -> _ReqState:
        # The request's state, its key holding at least its first num_tokens tokens
        # (made at its first checkpoint, from its row's cached first start pages).
        rid = req.rid
        try:
            state = self._reqs.get(rid)
        except TypeError:
            raise RequestStateError(f"request id {rid!r:.80} is not hashable") from None
        if state is None:
            tokens = _tokens(req, 0, num_tokens)
            key = self._req_key(req, tokens, req.priority or 0)
            # The cached part and the pages to insert now (the checkpoint's, aligned).
            have = max(start, num_tokens // self.page_size)
            state = _ReqState(req, key, self.rows.read(row, 0, have))
            self._reqs[rid] = state
            return state
        if state.req is not req:
            raise RequestStateError(f"request id {rid!r:.80} is another running request's")
        key = state.key
        have = len(key)
        if have < num_tokens:
            key.append(_tokens(req, have, num_tokens))
        return state

    # ---------------------------------------------------------------- sizes

    def evictable_size(self) -> int:
        """Cached tokens no request has locked."""
        return self.index.stats().num_evictable_blocks * self.page_size

    def protected_size(self) -> int:
        """Cached tokens some request has locked."""
        return self.index.stats().num_locked_blocks * self.page_size

    def total_size(self) -> int:
        """Cached tokens."""
        return self.index.stats().num_cached_blocks * self.page_size

    def available_size(self) -> int:
        """Free tokens in the pool (SGLang's ``token_to_kv_pool_allocator.available_size``)."""
        return self.pool.num_free_blocks * self.page_size

    def token_usage(self, max_total_num_tokens: int) -> float:
        """The share of a pool of ``max_total_num_tokens`` tokens in use, as SGLang
        0.5.23's scheduler reports it (``token_usage``, ``_get_token_info`` in
        ``managers/scheduler_components/pool_stats_observer.py``)::

            num_used = self.max_total_num_tokens - (available_size + evictable_size)
            token_usage = num_used / self.max_total_num_tokens

        Evictable cached tokens count as free, locked ones as used. The capacity is the
        scheduler's (SGLang's tree cache does not know it); the simulated pool's is its
        pages times the page size.

        Raises:
            PrefixKVError: ``max_total_num_tokens`` is not an int >= 1.
        """
        total = check_count("max_total_num_tokens", max_total_num_tokens, lo=1)
        num_used = total - (self.available_size() + self.evictable_size())
        return num_used / total

    def supports_prefix_sharing(self) -> bool:
        """Whether the index keeps anything (``False`` for the ``none`` index)."""
        return self._caches

    def take_events(self) -> list[KVEvent]:
        """KV events since the last call (vLLM wire structs; the radix tree's are
        SGLang's page events); empty unless built with ``enable_kv_cache_events``."""
        return [] if self.event_recorder is None else self.event_recorder.take_events()

    def reset(self) -> None:
        """Drop the whole cache; its pages return to the pool.

        Raises:
            CacheInUseError: a request holds a lock or cache state; nothing changes.
        """
        if self._reqs:
            raise CacheInUseError(f"cannot reset: {len(self._reqs)} requests are running")
        self.pool.free(self.index.reset())
        if self._observer is not None:
            self._observer.on_reset()

    def pretty_print(self) -> None:
        """Print the index's sizes (SGLang prints its tree)."""
        print(f"prefixkv {type(self.index).__name__}: {self.index.stats()}")

    def check_invariants(self, running: Iterable[ReqLike] | None = None) -> None:
        """The index's invariants; with every running request, pool conservation.

        Conservation: free + cached + the running requests' private pages == pages
        (pages allocated by hand and not inserted break it). No request's row names a
        free page, and no private page is held twice.

        Raises:
            AssertionError: describing the broken state.
        """
        self.index.check_invariants()
        pool = self.pool
        if isinstance(pool, BlockAllocator):
            pool.check_invariants()
        if running is None:
            return
        ps = self.page_size
        seen: set[int] = set()
        for req in running:
            kv = req.kv
            row = kv.req_pool_idx
            assert row is not None, f"request {req.rid!r} holds no row"
            assert kv.cache_protected_len % ps == 0, f"{req.rid!r}: unaligned protected part"
            pages = self.rows.read(row, 0, ceil_div(kv.kv_allocated_len, ps))
            for i, p in enumerate(pages):
                assert not pool.is_free(p), f"{req.rid!r} reads page {p} at {i}, which is free"
            for p in pages[kv.cache_protected_len // ps :]:
                assert p not in seen, f"page {p} held privately twice"
                seen.add(p)
        cached = self.index.stats().num_cached_blocks
        free = pool.num_free_blocks
        assert free + cached + len(seen) == pool.num_blocks, (
            f"pages leak or double count: free {free} + cached {cached} + private "
            f"{len(seen)} != {pool.num_blocks}"
        )


def held_row(req: ReqLike) -> int:
    """``req``'s ``req_to_token`` row.

    Raises:
        RequestStateError: ``req`` holds no row (not admitted, or released).
    """
    row = req.kv.req_pool_idx
    if row is None:
        raise RequestStateError(f"request {req.rid!r:.80} holds no row: not admitted")
    return row


def _tokens(req: ReqLike, start: int, stop: int) -> Sequence[int]:
    # Tokens start..stop-1 of the request: its prompt, then its sampled tokens
    # (SGLang's full_untruncated_fill_ids).
    origin = req.origin_input_ids
    p = len(origin)
    if stop <= p:
        return origin[start:stop]
    out = req.output_ids
    if stop - p > len(out):
        raise PrefixKVError(
            f"request {req.rid!r:.80} has {p + len(out)} tokens; cannot cache {stop}"
        )
    if start >= p:
        return out[start - p : stop - p]
    return [*origin[start:], *out[: stop - p]]
