"""Radix-tree prefix index in the style of SGLang's ``RadixCache``.

Nodes hold token segments (whole pages) and the blocks holding them; a match or an
insert that ends inside a segment splits the node there (SPEC RX-3, RX-4). Locks
propagate to the root (RX-5) and eviction frees unlocked leaves, leaf first and
upward (RX-6), ordered by a pluggable policy (RX-7) through an ``EvictionQueue``
updated incrementally (SGLang rebuilds a heap over every leaf on each ``evict``).
An optional event sink hears what SGLang's ``KVCacheEventRecorder`` records: each new
node's pages (``record_store``), each evicted node (``record_remove``) and each reset,
with SGLang's page digests, computed only while a sink is attached.

A node's segment is kept as the bytes of its tokens, and a walk reads the request's
tokens as one ``bytes`` copy: compiled, a slice of bytes and its compare are native
calls (a memcpy and a memcmp), where an ``array`` slice took a boxed index pair, a slice
object and a per-token compare loop at every node passed.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import ClassVar, Final, NamedTuple

from .base import CacheHandle, EventSink, IndexDescription, IndexStats, InsertResult, PrefixMatch
from .errors import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    LockStateError,
    StaleHandleError,
)
from .eviction import EvictionPolicy, EvictionQueue, make_eviction_policy
from .sglang_hashing import namespace_prior, page_hashes
from .tokens import TOKEN_BYTES, TOKEN_TYPECODE, ExtraKey, TokenKey, key_error
from .validation import (
    MAX_BLOCK_SIZE,
    MAX_BLOCKS,
    check_block_ids,
    check_bool,
    check_count,
    check_enough_block_ids,
    check_positive,
)

__all__ = ["RadixIndex"]

_ChildKey = int | bytes
_W: Final = TOKEN_BYTES  # bytes per token in a segment
_MAX_COUNT: Final = sys.maxsize


def _child_key(data: bytes, at: int, page: int) -> _ChildKey:
    """How a parent files the child whose segment starts at byte ``at`` of ``data``:
    by its first token at page size 1 (``page`` == one token's bytes), read
    little-endian from its bytes (the token itself on little-endian machines), else by
    its whole first page's bytes."""
    if page != _W:
        return data[at : at + page]
    if _W == 4:  # four native byte reads: no boxed index, no slice
        return data[at] | data[at + 1] << 8 | data[at + 2] << 16 | data[at + 3] << 24
    return int.from_bytes(data[at : at + _W], "little")


def _common_prefix(a: bytes, a_at: int, b: bytes, b_at: int, n: int) -> int:
    """Bytes ``a[a_at:]`` and ``b[b_at:]`` share at their start, at most ``n``.

    One compare when the runs agree, else a binary search over slice compares: every
    step a memcmp, no per-byte Python loop. O(n) in C, O(log n) steps.
    """
    if a[a_at : a_at + n] == b[b_at : b_at + n]:
        return n
    lo, hi = 0, n  # they agree on [0, lo) and differ somewhere in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[a_at + lo : a_at + mid] == b[b_at + lo : b_at + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _only_child(children: dict[_ChildKey, _Node]) -> _Node:
    """The one child of a node that has one."""
    for child in children.values():
        return child
    raise AssertionError("a node without children has no only child")


def _matched(seg: bytes, data: bytes, at: int, stop: int, page: int) -> int:
    """The bytes of segment ``seg`` that ``data`` holds from byte ``at`` on, before
    ``stop``, in whole pages of ``page`` bytes: one compare when all of it is there
    (the first segment in place, a later one as a slice of the tokens), else a binary
    search (:func:`_common_prefix`)."""
    end = at + len(seg)
    if end <= stop and (data.startswith(seg) if at == 0 else data[at:end] == seg):
        return len(seg)
    m = _common_prefix(seg, 0, data, at, min(len(seg), stop - at))
    return m - m % page


def _take_path(node: _Node) -> list[int]:
    """The hit path ``node`` kept, taken from it: the match that jumped there keeps the
    hit it ends with on the node it ends at."""
    path = node.path
    assert path is not None
    node.path = None
    node.path_key = b""
    return path


def _bury(node: _Node) -> None:
    """Mark an evicted (or reset) node dead and drop what it kept for lookups."""
    node.dead = True
    node.parent = None
    node.path = None
    node.path_key = b""
    node.jump = None


def _check_path(node: _Node) -> None:
    """A node's cached hit path is its blocks and tokens from the root; its jump, a
    descendant or itself (for ``check_invariants``)."""
    if node.path is not None:
        blocks: list[int] = []
        keys: list[bytes] = []
        up: _Node | None = node
        while up is not None and up.parent is not None:
            blocks[:0] = up.value
            keys.insert(0, up.key)
            up = up.parent
        assert node.path == blocks, "a kept hit path's blocks differ from the tree's"
        assert node.path_key.startswith(b"".join(keys)), "a cached hit path's tokens differ"
    else:
        assert node.path_key == b"", "a hit path's tokens are kept without its blocks"
    far = node.jump
    while far is not None and far is not node:
        far = far.parent
    assert node.jump is None or far is node or node.jump.dead, "a jump leaves its branch"


def _tokens(segment: bytes) -> array[int]:
    """A segment's token ids."""
    return array(TOKEN_TYPECODE, segment)


class _Node:
    """A tree node: ``key``, the bytes of its tokens, held in ``value`` blocks (one
    per page).

    A plain class with every field set in ``__init__``: a dataclass's defaults cost a
    lookup each per node when compiled.
    """

    __slots__ = ("children", "created", "dead", "end", "evict_key", "hashes", "hit_count",
                 "jump", "key", "last_access", "lent", "lock_ref", "namespace", "only",
                 "parent", "path", "path_key", "priority", "tree", "value")  # fmt: skip

    def __init__(
        self,
        key: bytes,
        value: list[int],
        parent: _Node | None,
        created: int,
        last_access: int,
        end: int,  # tokens from the root through this node
        priority: int = 0,
        hit_count: int = 0,
        lock_ref: int = 0,
        tree: RadixIndex | None = None,  # the tree it belongs to: handles check it in O(1)
    ) -> None:
        self.key = key
        self.value = value
        self.parent = parent
        self.created = created
        self.last_access = last_access
        self.end = end
        self.priority = priority
        self.hit_count = hit_count
        self.lock_ref = lock_ref
        self.tree = tree
        self.children: dict[_ChildKey, _Node] = {}
        # The child when there is exactly one (most nodes of a long path): a walk takes it
        # without building a key, and its segment compare tells whether it matches.
        self.only: _Node | None = None
        self.evict_key: tuple[tuple[int, ...], int] | None = None  # its candidates entry
        self.dead = False
        self.namespace: ExtraKey | None = None  # roots only
        self.hashes: list[bytes] | None = None  # SGLang's page digests, for events (lazy)
        # ``value`` itself was handed out as a match's block ids: nothing may change the
        # list (eviction copies it rather than reusing it).
        self.lent = False
        # The kept hit path (see _keep_path): on a node a match over several nodes
        # ended at, its blocks from the root (``path``, the list that match returned)
        # and the request's tokens; on the nearest node below a branch point above
        # it, ``jump`` to it.
        self.path: list[int] | None = None
        self.path_key = b""
        self.jump: _Node | None = None


def _not_counted(obj: object) -> int:
    """Where references are not counted (not CPython): any count, ``_UNSHARED_REFS``
    then saying that every kept list is held elsewhere (never extended in place)."""
    return 0


_refcount: Final[Callable[[object], int]] = getattr(sys, "getrefcount", _not_counted)


def _path_refs(node: _Node) -> int:
    """References to the list ``node`` keeps as its hit path, as ``sys.getrefcount``
    counts them in this very expression (its temporaries included)."""
    return _refcount(node.path)


def _refs_when_unshared() -> int:
    """:func:`_path_refs` of a list that only its node holds: the same code counting
    the same temporaries, so the figure fits whichever build runs it."""
    probe = _Node(b"", [], None, 0, 0, 0)
    probe.path = [0]
    return _path_refs(probe)


_UNSHARED_REFS: Final = _refs_when_unshared() if _refcount is not _not_counted else -1


def _held_elsewhere(node: _Node) -> bool:
    """Whether anything but ``node`` holds its kept hit path: a match it was lent to
    whose caller keeps it (a request still running, a caller's result).

    A lent list must never change under its holder, so the tree extends it only when
    its reference count says the node is its one holder: no other object, frame or
    container can read it then (the tree runs on one thread)."""
    return _path_refs(node) > _UNSHARED_REFS


class _Memo(NamedTuple):
    """What the tree remembers about a key: tokens it inserted, the node it ended at."""

    inserted: int
    node: _Node | None


_NO_MEMO: Final = _Memo(0, None)


class RadixIndex:
    """SGLang's radix tree over paged blocks: token-exact hits at page size 1.

    Semantics (SPEC RX-1..RX-7, SG-2, SG-5, SG-6):

    * ``block_size`` is SGLang's ``page_size`` (default 1). Keys are cut to whole
      pages for both match and insert; children are keyed by their first token
      (page size 1) or their whole first page.
    * Every node on a matched or inserted path gets the operation's recency
      stamp; a node created by a split or an insert gets a later one, as with
      SGLang's ``time.monotonic()`` stamps (here an instance tick counter).
    * Locks count up the path to the root; unlocking never deletes.
    * ``evict`` frees whole unlocked leaves in policy order and may overshoot; a
      parent joins the candidates once its last child is gone.
    * Namespaces (``extra_key``) get separate subtrees, so they never share nodes.
    * ``hit_count`` (the ``lfu`` policy) counts inserts through a node by distinct
      registrations of a key, as SGLang does with ``cache_inserted_len``.
    * Events (``set_event_sink``): ``on_stored`` per new node (its pages, chained to
      its parent's last page), ``on_removed`` per evicted node, ``on_cleared`` on
      reset, with SGLang's page digests (:mod:`~prefixkv.indexes.sglang_hashing`);
      splits announce nothing, they divide a node's digests, as SGLang's do.

    Args:
        block_size: page size in tokens (> 0).
        eviction: ``"lru"`` (default), ``"lfu"``, ``"priority"``, ``"fifo"`` or an
            :class:`~prefixkv.indexes.eviction.EvictionPolicy`.
        check_block_ids: refuse, in ``insert``, a block the tree already holds for
            other tokens (a set operation per new block). The engine classes, which draw
            every block from their own pool, turn it off; SGLang never checks.

    Thread safety: none; call from one scheduler thread.
    """

    kv_event_dialect: ClassVar[str] = "sglang"
    DESCRIPTION: ClassVar[IndexDescription] = IndexDescription(
        unit="page",
        models="sglang",
        default_block_size=1,
        # A manager draws every block from its own pool and checks ownership in the
        # allocator's ledger: the tree's per-block check would repeat it per token.
        pool_owned_options=MappingProxyType({"check_block_ids": False}),
    )

    def __init__(
        self,
        block_size: int = 1,
        *,
        eviction: str | EvictionPolicy = "lru",
        check_block_ids: bool = True,
    ) -> None:
        self.block_size = check_positive("block_size", block_size, MAX_BLOCK_SIZE)
        self._page = self.block_size * _W  # a page's bytes in a segment
        self.policy = make_eviction_policy(eviction)
        self._roots: dict[ExtraKey | None, _Node] = {}
        self._empty_root = self._new_root()
        self._queue = EvictionQueue(self.policy)
        # Every block in the tree, to refuse one given again for other tokens. It costs
        # a set operation per block (per token at page size 1), so a caller whose blocks
        # cannot clash (CacheManager draws them from its own allocator) may turn it off.
        self.check_block_ids = check_bool("check_block_ids", check_block_ids)
        self._owned: set[int] = set()
        self._tick = 0
        self._num_nodes = 0
        self._evictable = 0
        self._protected = 0
        self._num_evicted = 0
        self._sink: EventSink | None = None

    def set_event_sink(self, sink: EventSink | None) -> None:
        """Report cache-content changes to ``sink`` from now on (``None``: stop). O(1)."""
        self._sink = sink

    # ----------------------------------------------------------------- helpers

    def _new_root(self, namespace: ExtraKey | None = None) -> _Node:
        root = _Node(b"", [], None, 0, 0, 0, lock_ref=1, priority=-sys.maxsize, tree=self)
        root.namespace = namespace
        return root

    def _root(self, extra_key: ExtraKey | None, create: bool) -> _Node:
        root = self._roots.get(extra_key)
        if root is None:
            if not create:
                return self._empty_root
            root = self._roots[extra_key] = self._new_root(extra_key)
        return root

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def _touch(self, node: _Node, tick: int) -> None:
        node.last_access = tick
        self._queue.rekey(node)

    def _update_leaf_status(self, node: _Node) -> None:
        should = node.lock_ref == 0 and not node.children and node.parent is not None
        if should and node.evict_key is None:
            self._queue.add(node)
        elif not should:
            self._queue.discard(node)

    def _split(self, child: _Node, cut: int) -> _Node:
        # new_node -> child, new_node holding child's first cut bytes (whole pages).
        page = self._page
        parent = child.parent
        assert parent is not None and 0 < cut < len(child.key) and cut % page == 0
        pages = cut // page
        tick = self._next_tick()
        new = _Node(
            child.key[:cut],
            child.value[:pages],
            parent,
            tick,
            tick,
            child.end - (len(child.key) - cut) // _W,
            priority=child.priority,
            hit_count=child.hit_count,
            lock_ref=child.lock_ref,
            tree=self,
        )
        parent.children[_child_key(child.key, 0, page)] = new
        if parent.only is child:
            parent.only = new
        child.key = child.key[cut:]
        child.value = child.value[pages:]
        child.lent = False  # both halves are new lists
        if child.hashes is not None:  # SGLang's split_node_hash_value
            new.hashes = child.hashes[:pages]
            child.hashes = child.hashes[pages:]
        child.parent = new
        new.children[_child_key(child.key, 0, page)] = child
        new.only = child
        self._num_nodes += 1
        return new

    # ------------------------------------------------------------------ lookup

    def _walk(
        self,
        node: _Node,
        data: bytes,
        at: int,
        stop: int,
        tick: int,
        blocks: list[int],
        lend: bool = False,
    ) -> tuple[_Node, int, list[int] | None, list[int]]:
        """Follow the tokens whose bytes are ``data`` down from ``node``, which ends at
        byte ``at``, to at most byte ``stop``, stamping each node passed with ``tick``,
        splitting the last one where the tokens end or diverge inside it (RX-3, RX-4),
        and appending the blocks of the nodes passed to ``blocks``: mini-sglang's
        ``_tree_walk``, O(nodes passed) steps, each a dict lookup and a memcmp.

        With ``lend`` (a match from the root), the blocks passed are ``lone`` then
        ``blocks``: a first node's own list while it is the only node passed, or, after
        a jump (:meth:`_jump`), a kept hit path, as ``lone``, or as ``blocks`` to extend
        in place where no caller holds it (:func:`_held_elsewhere`). Returns the last
        node reached, the byte of ``data`` it ends at, lone and blocks.
        """
        page = self._page
        lone: list[int] | None = None  # (lend) blocks passed before those in blocks
        jumped = False
        while at < stop:
            child = node.only  # with one child, no key to build: the compare finds out
            if child is None:
                child = node.children.get(_child_key(data, at, page))
                if child is None:
                    break
            seg = child.key
            m = _matched(seg, data, at, stop, page)
            if m == 0:  # an only child that differs from its first page on
                break
            if child.evict_key is None:
                child.last_access = tick
            else:
                self._touch(child, tick)
            at += m
            if m < len(seg):
                node = self._split(child, m)
            else:
                node = child
                far = child.jump
                if lend and far is not None and self._jump(far, child, data, stop, tick):
                    held, node, at, jumped = _held_elsewhere(far), far, far.end * _W, True
                    path = _take_path(far)  # held: the rest apart, then one copy; else in place
                    lone, blocks = (path if held else None), ([] if held else path)
                    continue
            if lend and lone is None and not blocks:
                lone = node.value
            elif lone is not None and not jumped:
                blocks, lone = lone + node.value, None  # one exact-size copy
            else:
                blocks += node.value
            if m < len(seg):
                break
        return node, at, lone, blocks

    def _jump(self, far: _Node, below: _Node, data: bytes, stop: int, tick: int) -> bool:
        """Whether a match that reached ``below`` may go on at its descendant ``far``: a
        cached hit path (:meth:`_keep_path`) within ``stop`` whose tokens ``data`` starts
        with (one memcmp for the whole path). Stamps the nodes between them then, as
        the walk would have: O(nodes skipped) attribute writes, no compare, no copy."""
        if far.path is None or far.end * _W > stop or not data.startswith(far.path_key):
            return False
        node = far
        while node is not below:
            if node.evict_key is None:
                node.last_access = tick
            else:
                self._touch(node, tick)
            parent = node.parent
            assert parent is not None  # below is an ancestor of far
            node = parent
        return True

    def _keep_path(self, node: _Node, data: bytes, path: list[int]) -> None:
        """Keep the hit of a match over several nodes ending at ``node``, ``path`` (the
        list it returns), with the request's tokens ``data`` (the hit's first), and
        point the nearest node below a branch point above it at it: the next match
        there whose tokens start with ``data`` (a conversation's next turn) jumps to
        ``node``, stamps the nodes it skips and lists only those after it
        (:func:`_take_path`).

        A node's blocks from the root never change while it lives (splits keep them,
        only leaves are evicted), so a kept path stays exact. One path per jump: the
        one it pointed at before is dropped, so the tree keeps at most one hit path
        per branch (and no block twice in it)."""
        holder = node
        parent = node.parent
        while parent is not None and parent.only is not None and parent.parent is not None:
            holder = parent
            parent = holder.parent
        old = holder.jump
        if old is not None and old is not node:
            old.path = None
            old.path_key = b""
        node.path = path
        node.path_key = data
        holder.jump = node

    def _limit(self, key: TokenKey, max_num_tokens: object) -> int:
        limit = len(key.tokens)
        if max_num_tokens is not None:
            # A cap below the length takes no call (compiled: a tagged compare);
            # check_count names what is wrong with a bad one.
            if type(max_num_tokens) is int and 0 <= max_num_tokens < limit:
                limit = max_num_tokens
            else:
                limit = min(check_count("max_num_tokens", max_num_tokens, _MAX_COUNT), limit)
        return limit - limit % self.block_size

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """Longest cached prefix, page-aligned; splits the last node if the match ends
        inside it (RX-3). Stamps the path with a fresh tick (SG-5).

        A hit held by one node (a shared prompt, a document) returns that node's own
        list of blocks, not a copy (at page size 1 a copy is a reference count per
        token, most of such a lookup): read ``block_ids``, never mutate it. The tree
        never changes a list while anything else holds it. A hit over several nodes is
        a list the tree keeps on its last node (:meth:`_keep_path`): the next match
        through that branch whose tokens extend this one's (a conversation's next
        turn) compares the kept path's tokens in one memcmp, stamps its nodes without
        visiting them one by one, and lists only the nodes past it: it returns the
        kept list itself when it ends there, the same list extended in place once
        every match it was lent to has let it go (a conversation's previous turn has
        finished), else one exact-size copy.

        Complexity: O(nodes passed) Python steps, a jump's nodes only stamped;
        segments compare in C; O(1) for a hit in one node or along a kept path no
        caller holds, plus O(blocks past it); else O(blocks).
        """
        limit = self._limit(key, max_num_tokens)
        root = self._root(key.extra_key, create=False)
        if limit == 0 or not root.children:
            return PrefixMatch(0, [], root)
        tick = self._next_tick()
        root.last_access = tick
        data = key.tokens.tobytes()
        node, at, lone, blocks = self._walk(root, data, 0, limit * _W, tick, [], True)
        if lone is None:  # a miss, or a hit over several nodes: a list of the tree's own
            if blocks:
                self._keep_path(node, data, blocks)
            return PrefixMatch(at // _W, blocks, node)
        if lone is node.value:  # a hit in one node (a shared prompt, a document): its list
            node.lent = True
            return PrefixMatch(at // _W, lone, node)
        return PrefixMatch(at // _W, self._rekeep(node, data, lone, blocks), node)

    def _rekeep(self, node: _Node, data: bytes, path: list[int], tail: list[int]) -> list[int]:
        """A match that jumped to a kept hit path another caller still holds and ends at
        ``node``: keep the hit there and return it, ``path`` itself when nothing
        follows it, else one exact-size copy of both lists (the held one is left as
        it is: no list of the path is freed inside a lookup)."""
        hit = path + tail if tail else path
        self._keep_path(node, data, hit)
        return hit

    def cached_blocks(self, key: TokenKey, max_num_tokens: int | None = None) -> list[int]:
        """The blocks ``match_prefix`` would return, without splitting or stamping.

        Complexity: O(depth) Python steps; segments compare in C.
        """
        if not isinstance(key, TokenKey):
            raise key_error("key", key)
        page = self._page
        data = key.tokens.tobytes()
        stop = self._limit(key, max_num_tokens) * _W
        node = self._root(key.extra_key, create=False)
        at = 0
        out: list[int] = []
        while at < stop:
            child = node.children.get(_child_key(data, at, page))
            if child is None:
                break
            seg = child.key
            m = _common_prefix(seg, 0, data, at, min(len(seg), stop - at))
            m -= m % page
            out += child.value[: m // page]
            at += m
            if m < len(seg):
                break
            node = child
        return out

    # ---------------------------------------------------------------- register

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """Insert the page-aligned first ``num_tokens`` tokens (RX-4, SGLang ``insert``).

        Walks like ``match_prefix``, splitting where the key diverges inside a
        segment, and adds one leaf for the rest, holding the caller's blocks for
        it. Blocks the tree already had for the leading part are kept: the
        returned ``block_ids`` are the tree's, and the caller's copies of that part
        are duplicates to free. When they are the new leaf's alone, they are its own
        list (as with ``match_prefix``): read them, never mutate them.

        With ``prefix`` equal to the node this key's previous insert returned (a
        decoding request registering its new tokens), the walk starts there: the
        nodes above keep their stamps, and the insert costs O(new tokens), not
        O(depth). Without it, the whole path is walked and stamped (SGLang's
        ``cache_finished_req``).

        Raises:
            BlockOwnershipError: too few or malformed block ids, or a block the
                tree holds already for other tokens; nothing changes.

        Complexity: O(nodes walked) Python steps, segments compare in C, plus
        O(new blocks) for the ownership check.
        """
        ps = self.block_size
        n = len(key) if num_tokens is None else check_count("num_tokens", num_tokens, len(key))
        n -= n % ps
        pages = n // ps
        check_enough_block_ids(block_ids, pages, "pages to insert")
        inserted_before, start = self._resume_point(key, prefix, n)
        skip = 0 if start is None else start.end // ps
        if self.check_block_ids:
            # The prefix the caller holds is the tree's own path: only the rest is checked.
            held = prefix.end if type(prefix) is _Node and not prefix.dead else 0
            self._check_fresh_blocks(key, block_ids, min(held, n) // ps, pages, n)
        node = self._root(key.extra_key, create=n > 0) if start is None else start
        if n == 0:
            return InsertResult(0, [], node)
        return self._insert_below(node, key, block_ids, skip, n, inserted_before)

    def _insert_below(
        self,
        node: _Node,
        key: TokenKey,
        block_ids: Sequence[int],
        skip: int,
        n: int,
        inserted_before: int,
    ) -> InsertResult:
        # insert's walk from ``node`` (the first ``skip`` pages are the path to it), then
        # the new leaf for the rest of the first ``n`` tokens
        ps = self.block_size
        tick = self._next_tick()
        node.last_access = tick
        first = skip * ps  # the walk reads the tokens from here (the start node's end)
        tokens = key.tokens
        data = tokens.tobytes() if first == 0 else tokens[first:n].tobytes()
        stop = (n - first) * _W
        blocks: list[int] = []
        start_node = node
        node, at, _, blocks = self._walk(start_node, data, 0, stop, tick, blocks)
        self._note_insert(node, start_node, key.priority, inserted_before)
        pos = first + at // _W
        num_cached = pos
        if pos < n:
            leaf = data[at:stop]
            node = self._add_leaf(node, key, leaf, block_ids, pos, inserted_before)
            if blocks:
                blocks += node.value
            else:  # only the new leaf: its own list, as match_prefix lends one
                node.lent = True
                blocks = node.value
            if self._sink is not None:
                self._announce(node, key.extra_key)
        key.set_index_memo(self, _Memo(max(n, inserted_before), node))
        return InsertResult(num_cached, blocks, node, skip)

    def _resume_point(
        self, key: TokenKey, prefix: CacheHandle | None, n: int
    ) -> tuple[int, _Node | None]:
        # The tokens this key inserted before, and the node an insert of its first n
        # tokens may start from: its previous insert's end, when the caller passes it
        # back as ``prefix`` and it is still in the tree and within the n tokens.
        memo = key.index_memo(self)
        inserted_before, last = memo if isinstance(memo, _Memo) else _NO_MEMO
        start = last if prefix is not None and prefix is last else None
        if start is not None and (start.dead or start.end > n):
            start = None
        return inserted_before, start

    def _note_insert(self, last: _Node, start: _Node, priority: int, inserted_before: int) -> None:
        # SGLang's insert raises a node's priority to the request's, and counts a hit on
        # the nodes past what this key inserted before (its cache_inserted_len): on the
        # nodes the walk passed, from the last one up to (not including) its start.
        node = last
        while node is not start:
            changed = False
            if priority > node.priority:
                node.priority = priority
                changed = True
            if node.end > inserted_before:
                node.hit_count += 1
                changed = True
            if changed:
                self._queue.rekey(node)
            parent = node.parent
            assert parent is not None  # start is an ancestor of last
            node = parent

    def _add_leaf(
        self,
        parent: _Node,
        key: TokenKey,
        segment: bytes,
        block_ids: Sequence[int],
        pos: int,
        inserted_before: int,
    ) -> _Node:
        # A leaf for the segment's tokens, which start at token pos of the key.
        ps = self.block_size
        n = pos + len(segment) // _W
        tick = self._next_tick()
        # A list's slice is a new list already (a pass per page saved at page size 1).
        pages = block_ids[pos // ps : n // ps]
        leaf = _Node(
            segment,
            pages if type(pages) is list else list(pages),
            parent,
            tick,
            tick,
            n,
            priority=key.priority,
            hit_count=1 if n > inserted_before else 0,
            tree=self,
        )
        parent.children[_child_key(segment, 0, self._page)] = leaf
        parent.only = leaf if len(parent.children) == 1 else None
        self._num_nodes += 1
        self._evictable += len(leaf.value)
        if self.check_block_ids:
            self._owned.update(leaf.value)
        self._update_leaf_status(parent)
        self._queue.add(leaf)
        return leaf

    def _page_hashes(self, node: _Node) -> list[bytes]:
        # SGLang's compute_node_event_hash_values: computed once, from the nearest
        # ancestor that has them (or the namespace's start), and kept on the node.
        if node.hashes is None:
            missing = []
            top = node
            while top.parent is not None and top.hashes is None:
                missing.append(top)
                top = top.parent
            if top.parent is None:
                prior = namespace_prior(top.namespace)
            else:
                assert top.hashes  # a node holds at least one page
                prior = top.hashes[-1]
            for m in reversed(missing):
                m.hashes = page_hashes(_tokens(m.key), prior, self.block_size)
                prior = m.hashes[-1]
        assert node.hashes is not None
        return node.hashes

    def _announce(self, leaf: _Node, extra_key: ExtraKey | None) -> None:
        # SGLang's record_store: the node's pages, chained to its parent's last page.
        assert self._sink is not None and leaf.parent is not None
        parent = leaf.parent
        self._sink.on_stored(
            self._page_hashes(leaf),
            None if parent.parent is None else self._page_hashes(parent)[-1],
            _tokens(leaf.key),
            self.block_size,
            extra_key,
        )

    def _check_fresh_blocks(
        self, key: TokenKey, block_ids: Sequence[int], skip: int, pages: int, n: int
    ) -> None:
        fresh = set(check_block_ids(block_ids[skip:pages], "insert"))
        if self._owned and not self._owned.isdisjoint(fresh):
            self._check_reused_blocks(key, list(block_ids[:pages]), n)

    def _check_reused_blocks(self, key: TokenKey, own: list[int], n: int) -> None:
        # Slow path: some given blocks are in the tree. That is fine only where the
        # tree holds exactly that block for exactly these tokens (a re-insert of a hit).
        page = self._page
        data = key.tokens.tobytes()
        stop = n * _W
        node = self._root(key.extra_key, create=False)
        at = held = 0  # bytes matched; pages where the tree holds the caller's blocks
        while at < stop:
            child = node.children.get(_child_key(data, at, page))
            if child is None:
                break
            seg = child.key
            k = _common_prefix(seg, 0, data, at, min(len(seg), stop - at)) // page
            if own[held : held + k] != child.value[:k]:
                break
            held += k
            at += k * page
            if k * page < len(seg):
                break
            node = child
        tail = own[held:]
        if not self._owned.isdisjoint(tail):
            bad = next(b for b in tail if b in self._owned)
            raise BlockOwnershipError(
                f"block {bad} is cached in the tree for other tokens; it cannot hold these"
            )

    # ----------------------------------------------------------------- locking

    def _own(self, handle: CacheHandle) -> _Node:
        # Roots are always valid handles (a miss): locking them is a no-op. A node is
        # the same prefix for its whole life (a split keeps its end); it dies only when
        # evicted or reset, which marks it dead.
        if type(handle) is not _Node:
            raise InvalidHandleError(f"handle {handle!r:.80} is not a radix tree node")
        if handle.dead:
            raise StaleHandleError(
                "the handle's node was evicted (or the tree reset) since the match; match again"
            )
        if handle.tree is not self:
            raise InvalidHandleError("handle belongs to another radix tree")
        return handle

    def count_evictable(self, handle: CacheHandle) -> int:
        """Validate ``handle`` and count the unlocked blocks on its path. O(depth)."""
        node: _Node | None = self._own(handle)
        n = 0
        while node is not None and node.parent is not None:
            if not node.lock_ref:
                n += len(node.value)
            node = node.parent
        return n

    def lock(self, handle: CacheHandle) -> None:
        """``inc_lock_ref``: one more lock on every node up to the root (RX-5).

        Raises:
            StaleHandleError: the node was evicted since the match; nothing changes.

        Complexity: O(depth).
        """
        node: _Node | None = self._own(handle)
        while node is not None and node.parent is not None:
            if node.lock_ref == 0:
                self._evictable -= len(node.value)
                self._protected += len(node.value)
                self._queue.discard(node)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, handle: CacheHandle) -> list[int]:
        """``dec_lock_ref``: one lock less up to the root; nodes at 0 become evictable.

        Raises:
            LockStateError: a node on the path is not locked (nothing changes).

        Complexity: O(depth).
        """
        start = self._own(handle)
        node: _Node | None = start
        while node is not None and node.parent is not None:
            if node.lock_ref <= 0:
                raise LockStateError(
                    f"unlock of a radix node ({len(node.key) // _W} tokens, lock_ref "
                    f"{node.lock_ref}) "
                    "that is not locked"
                )
            node = node.parent
        node = start
        while node is not None and node.parent is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self._evictable += len(node.value)
                self._protected -= len(node.value)
                if not node.children:
                    self._queue.add(node)
            node = node.parent
        return []

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """Lock ``new``, then unlock ``old`` (SGLang's checkpoint moves ``req.lock``).

        When ``new`` descends from ``old`` (a request's next insert), only the nodes
        between them change: O(new nodes), not O(depth).

        Raises:
            LockStateError: ``old`` is not locked; nothing changes.
        """
        o, n = self._own(old), self._own(new)
        if o.parent is not None and o.lock_ref <= 0:
            raise LockStateError("relock from a radix node that is not locked")
        between: list[_Node] = []
        node: _Node | None = n
        while node is not None and node is not o and node.end > o.end:
            between.append(node)
            node = node.parent
        if node is not o:  # not a descendant: the general move
            self.lock(n)
            return self.unlock(o)
        for node in between:
            if node.lock_ref == 0:
                self._evictable -= len(node.value)
                self._protected += len(node.value)
                self._queue.discard(node)
            node.lock_ref += 1
        return []

    # ---------------------------------------------------------------- eviction

    def evict(self, num_blocks: int) -> list[int]:
        """Free unlocked leaves in policy order until ``num_blocks`` blocks are free (RX-6).

        Whole leaves go, so more than asked may come back; a parent becomes a
        candidate once its last child is evicted.

        Complexity: O(log n) per evicted leaf.
        """
        n = check_count("num_blocks", num_blocks, MAX_BLOCKS)
        out: list[int] = []
        queue = self._queue
        sink = self._sink
        while len(out) < n and queue:
            node = queue.pop()
            if sink is not None:  # SGLang's record_remove: one node, its pages
                sink.on_removed(self._page_hashes(node))
            value = node.value
            if self.check_block_ids:
                self._owned.difference_update(value)
            if out or node.lent:  # a list a match handed out stays as it is
                out += value
            else:  # the dead node's own list, handed over: no copy (a page per token)
                out = value
                node.value = []
            parent = node.parent
            assert parent is not None
            del parent.children[_child_key(node.key, 0, self._page)]
            parent.only = _only_child(parent.children) if len(parent.children) == 1 else None
            self._evictable -= len(value)
            self._num_nodes -= 1
            _bury(node)
            if parent.parent is None:
                if not parent.children:
                    self._drop_root(parent)
            elif not parent.children and parent.lock_ref == 0:
                self._queue.add(parent)
        self._num_evicted += len(out)
        return out

    def _drop_root(self, root: _Node) -> None:
        # An empty namespace subtree costs memory per tenant; forget it.
        if self._roots.get(root.namespace) is root:
            del self._roots[root.namespace]

    def reset(self) -> list[int]:
        """Drop every node and return all cached blocks (SGLang ``reset``).

        Raises:
            CacheInUseError: a node is locked; nothing changes.
        """
        if self._protected:
            raise CacheInUseError(f"cannot reset: {self._protected} cached blocks are locked")
        out: list[int] = []
        for root in self._roots.values():
            stack = list(root.children.values())
            while stack:
                node = stack.pop()
                out += node.value
                _bury(node)
                stack.extend(node.children.values())
        self._roots.clear()
        self._queue.clear()
        self._owned.clear()
        self._num_nodes = 0
        self._evictable = 0
        if self._sink is not None:
            self._sink.on_cleared()
        return out

    # ----------------------------------------------------------------- queries

    def cached_block_hashes(self) -> list[bytes]:
        """SGLang's page digest of every cached page, once per page.

        What a sink attached since the tree was empty has been told is cached.
        Computes the digests not computed yet (as an attached sink would have).
        O(cached pages); for tests and consumers' checks.
        """
        out: list[bytes] = []
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            out += self._page_hashes(node)
            stack.extend(node.children.values())
        return out

    def evictable_size(self) -> int:
        """Evictable blocks (SGLang counts tokens: multiply by the page size)."""
        return self._evictable

    def protected_size(self) -> int:
        """Locked blocks."""
        return self._protected

    def stats(self) -> IndexStats:
        """Sizes and counters. O(1)."""
        return IndexStats(
            self._evictable + self._protected,
            self._evictable,
            self._protected,
            self._num_nodes,
            self._num_evicted,
        )

    def memory_bytes(self) -> int:
        """Estimated bytes held by the tree's own structures (not the KV)."""
        total = 64 * len(self._queue)  # a sorted-list entry and its key tuple
        total += sys.getsizeof(self._owned)
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            total += sys.getsizeof(node) + sys.getsizeof(node.key) + sys.getsizeof(node.value)
            total += sys.getsizeof(node.children) + 28 * len(node.value)
            if node.path is not None:  # a cached hit path (its ints are the nodes')
                total += sys.getsizeof(node.path) + sys.getsizeof(node.path_key)
            stack.extend(node.children.values())
        return total

    def check_invariants(self) -> None:
        """Tree shape, sizes, locks and the candidate set agree.

        Raises:
            AssertionError: describing the first inconsistency.
        """
        ps = self.block_size
        evictable = protected = nodes = 0
        expect_candidates: set[int] = set()
        seen_blocks: set[int] = set()
        for ns, root in self._roots.items():
            assert root.parent is None and root.namespace == ns, f"namespace {ns!r}: bad root"
            assert root.children, f"namespace {ns!r} kept an empty root"
            stack = [root]
            while stack:
                node = stack.pop()
                only = _only_child(node.children) if len(node.children) == 1 else None
                assert node.only is only, "a node's only child is out of date"
                for ck, child in node.children.items():
                    assert child.parent is node, "child's parent link is wrong"
                    assert not child.dead, "a dead node is still linked"
                    assert type(child.key) is bytes, "a segment is not bytes"
                    size = len(child.key) // _W
                    assert _child_key(child.key, 0, self._page) == ck, "child under a wrong key"
                    assert size > 0 and size % ps == 0 and len(child.key) % _W == 0, (
                        f"segment of {len(child.key)} bytes is not whole pages of {ps} tokens"
                    )
                    assert len(child.value) == size // ps, "blocks and pages disagree"
                    assert child.end == node.end + size, "node end position is wrong"
                    assert child.lock_ref >= 0, f"negative lock_ref {child.lock_ref}"
                    if node.parent is not None:
                        assert node.lock_ref >= child.lock_ref, "parent locked less than child"
                    for b in child.value:
                        assert b not in seen_blocks, f"block {b} appears twice in the tree"
                        seen_blocks.add(b)
                    nodes += 1
                    _check_path(child)
                    if child.lock_ref:
                        protected += len(child.value)
                    else:
                        evictable += len(child.value)
                        if not child.children:
                            expect_candidates.add(id(child))
                    stack.append(child)
        assert nodes == self._num_nodes, f"node count {self._num_nodes} but {nodes} nodes"
        if self.check_block_ids:
            assert seen_blocks == self._owned, "the owned-block set differs from the tree"
        assert evictable == self._evictable, f"evictable {self._evictable} but {evictable}"
        assert protected == self._protected, f"protected {self._protected} but {protected}"
        got = {id(node) for _, node in self._queue}
        assert got == expect_candidates, "eviction candidates differ from unlocked leaves"
        self._queue.check_invariants()
