"""Radix-tree prefix index in the style of SGLang's ``RadixCache``.

Nodes hold token segments (whole pages) and the blocks holding them; a match or an
insert that ends inside a segment splits the node there (SPEC RX-3, RX-4). Locks
propagate to the root (RX-5) and eviction frees unlocked leaves, leaf first and
upward (RX-6), ordered by a pluggable policy (RX-7) through an ``EvictionQueue``
updated incrementally (SGLang rebuilds a heap over every leaf on each ``evict``).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from .base import CacheHandle, IndexDescription, IndexStats, InsertResult, PrefixMatch
from .errors import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    LockStateError,
    StaleHandleError,
)
from .eviction import EvictionPolicy, EvictionQueue, make_eviction_policy
from .tokens import TOKEN_TYPECODE, ExtraKey, TokenKey, common_prefix_len
from .validation import (
    MAX_BLOCK_SIZE,
    MAX_BLOCKS,
    check_block_ids,
    check_bool,
    check_count,
    check_positive,
    check_sequence,
)

__all__ = ["RadixIndex"]

_ChildKey = int | bytes


@dataclass(slots=True, eq=False)
class _Node:
    """A tree node: ``key`` tokens held in ``value`` blocks (one per page)."""

    key: array[int]
    value: list[int]
    parent: _Node | None
    created: int
    last_access: int
    end: int  # tokens from the root through this node
    priority: int = 0
    hit_count: int = 0
    lock_ref: int = 0
    children: dict[_ChildKey, _Node] = field(default_factory=dict)
    evict_key: tuple[tuple[int, ...], int] | None = None  # its entry in the candidates
    dead: bool = False
    owner: object = None  # set on roots only: the tree they belong to
    namespace: ExtraKey | None = None  # roots only


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

    Args:
        block_size: page size in tokens (> 0).
        eviction: ``"lru"`` (default), ``"lfu"``, ``"priority"``, ``"fifo"`` or an
            :class:`~prefixkv.indexes.eviction.EvictionPolicy`.
        check_block_ids: refuse, in ``insert``, a block the tree already holds for
            other tokens (a set operation per new block). The facades, which draw
            every block from their own pool, turn it off; SGLang never checks.

    Thread safety: none; call from one scheduler thread.
    """

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

    # ----------------------------------------------------------------- helpers

    def _new_root(self, namespace: ExtraKey | None = None) -> _Node:
        root = _Node(array(TOKEN_TYPECODE), [], None, 0, 0, 0, lock_ref=1, priority=-sys.maxsize)
        root.owner = self
        root.namespace = namespace
        return root

    def _root(self, extra_key: ExtraKey | None, create: bool) -> _Node:
        root = self._roots.get(extra_key)
        if root is None:
            if not create:
                return self._empty_root
            root = self._roots[extra_key] = self._new_root(extra_key)
        return root

    def _child_key(self, tokens: array[int], pos: int) -> _ChildKey:
        if self.block_size == 1:
            return tokens[pos]
        return tokens[pos : pos + self.block_size].tobytes()

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

    def _split(self, child: _Node, split_len: int) -> _Node:
        # new_node -> child, new_node holding child's first split_len tokens.
        ps = self.block_size
        parent = child.parent
        assert parent is not None and 0 < split_len < len(child.key)
        tick = self._next_tick()
        new = _Node(
            child.key[:split_len],
            child.value[: split_len // ps],
            parent,
            tick,
            tick,
            child.end - len(child.key) + split_len,
            priority=child.priority,
            hit_count=child.hit_count,
            lock_ref=child.lock_ref,
        )
        parent.children[self._child_key(child.key, 0)] = new
        child.key = child.key[split_len:]
        child.value = child.value[split_len // ps :]
        child.parent = new
        new.children[self._child_key(child.key, 0)] = child
        self._num_nodes += 1
        return new

    # ------------------------------------------------------------------ lookup

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """Longest cached prefix, page-aligned; splits the last node if the match ends
        inside it (RX-3). Stamps the path with a fresh tick (SG-5).

        Complexity: O(depth) Python steps; segments compare in C.
        """
        ps = self.block_size
        tokens = key.tokens
        limit = len(tokens)
        if max_num_tokens is not None:
            limit = min(check_count("max_num_tokens", max_num_tokens, sys.maxsize), limit)
        limit -= limit % ps
        node = self._root(key.extra_key, create=False)
        if limit == 0 or not node.children:
            return PrefixMatch(0, [], node)
        tick = self._next_tick()
        node.last_access = tick
        pos = 0
        path_blocks: list[int] = []
        children = node.children
        # The hot loop of every admission: helpers are inlined, locals cached.
        while pos < limit:
            child = children.get(tokens[pos] if ps == 1 else tokens[pos : pos + ps].tobytes())
            if child is None:
                break
            if child.evict_key is None:
                child.last_access = tick
            else:
                self._touch(child, tick)
            seg = child.key
            size = len(seg)
            if size <= limit - pos and seg == tokens[pos : pos + size]:
                m = size  # the whole segment matches: one C compare, no call
            else:
                m = common_prefix_len(seg, 0, tokens, pos, min(size, limit - pos))
                if ps != 1:
                    m -= m % ps
            if m < size:
                node = self._split(child, m)
                pos += m
                path_blocks += node.value
                break
            node = child
            pos += m
            path_blocks += child.value
            children = child.children
        return PrefixMatch(pos, path_blocks, node)

    def cached_blocks(self, key: TokenKey, max_num_tokens: int | None = None) -> list[int]:
        """The blocks ``match_prefix`` would return, without splitting or stamping.

        Complexity: O(depth) Python steps; segments compare in C.
        """
        ps = self.block_size
        tokens = key.tokens
        limit = len(tokens)
        if max_num_tokens is not None:
            limit = min(check_count("max_num_tokens", max_num_tokens, sys.maxsize), limit)
        limit -= limit % ps
        node = self._root(key.extra_key, create=False)
        pos = 0
        out: list[int] = []
        while pos < limit:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            m = common_prefix_len(child.key, 0, tokens, pos, min(len(child.key), limit - pos))
            m -= m % ps
            out += child.value[: m // ps]
            pos += m
            if m < len(child.key):
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
        are duplicates to free. With ``prefix`` (a node the caller holds, whose
        path its first blocks are), only the blocks after it are checked against
        the blocks the tree owns.

        Raises:
            BlockOwnershipError: too few or malformed block ids, or a block the
                tree holds already for other tokens; nothing changes.

        Complexity: O(depth) Python steps, segments compare in C, plus
        O(blocks after ``prefix``) for the ownership check.
        """
        ps = self.block_size
        tokens = key.tokens
        n = (
            len(tokens)
            if num_tokens is None
            else check_count("num_tokens", num_tokens, len(tokens))
        )
        n -= n % ps
        pages = n // ps
        check_sequence("block_ids", block_ids)
        if len(block_ids) < pages:
            raise BlockOwnershipError(
                f"{pages} pages to insert but only {len(block_ids)} block ids given"
            )
        # The part under ``prefix`` is the tree's own path: only the rest is checked.
        skip = min(prefix.end, n) // ps if type(prefix) is _Node and not prefix.dead else 0
        if self.check_block_ids:
            self._check_fresh_blocks(key, block_ids, skip, pages, n)
        inserted_before = key.index_memo(self)
        priority = key.priority
        node = self._root(key.extra_key, create=n > 0)
        if n == 0:
            return InsertResult(0, [], node)
        tick = self._next_tick()
        node.last_access = tick
        pos = 0
        first = skip * ps  # blocks before this token are the caller's prefix: not returned
        path_blocks: list[int] = []
        while pos < n:
            child = node.children.get(tokens[pos] if ps == 1 else tokens[pos : pos + ps].tobytes())
            if child is None:
                break
            if child.evict_key is None:
                child.last_access = tick
            else:
                self._touch(child, tick)
            seg = child.key
            if len(seg) <= n - pos and seg == tokens[pos : pos + len(seg)]:
                m = len(seg)
            else:
                m = common_prefix_len(seg, 0, tokens, pos, min(len(seg), n - pos))
                m -= m % ps
            start = pos
            pos += m
            node = self._split(child, m) if m < len(seg) else child
            if priority > node.priority:
                node.priority = priority
                self._queue.rekey(node)
            if pos > inserted_before:
                node.hit_count += 1
                self._queue.rekey(node)
            if pos > first:
                path_blocks += node.value[max(0, first - start) // ps :]
        num_cached = pos
        if pos < n:
            tick = self._next_tick()
            leaf = _Node(
                tokens[pos:n],
                list(block_ids[pos // ps : pages]),
                node,
                tick,
                tick,
                n,
                priority=priority,
                hit_count=1 if n > inserted_before else 0,
            )
            node.children[self._child_key(tokens, pos)] = leaf
            self._num_nodes += 1
            self._evictable += len(leaf.value)
            if self.check_block_ids:
                self._owned.update(leaf.value)
            self._update_leaf_status(node)
            self._queue.add(leaf)
            path_blocks += leaf.value[max(0, first - pos) // ps :]
            node = leaf
        if n > inserted_before:
            key.set_index_memo(self, n)
        return InsertResult(num_cached, path_blocks, node, skip)

    def _check_fresh_blocks(
        self, key: TokenKey, block_ids: Sequence[int], skip: int, pages: int, n: int
    ) -> None:
        fresh = set(check_block_ids(block_ids[skip:pages], "insert"))
        if self._owned and not self._owned.isdisjoint(fresh):
            self._check_reused_blocks(key, list(block_ids[:pages]), n)

    def _check_reused_blocks(self, key: TokenKey, own: list[int], n: int) -> None:
        # Slow path: some given blocks are in the tree. That is fine only where the
        # tree holds exactly that block for exactly these tokens (a re-insert of a hit).
        ps = self.block_size
        tokens = key.tokens
        node = self._root(key.extra_key, create=False)
        pos = 0
        while pos < n:
            child = node.children.get(self._child_key(tokens, pos))
            if child is None:
                break
            seg = child.key
            m = common_prefix_len(seg, 0, tokens, pos, min(len(seg), n - pos))
            m -= m % ps
            if own[pos // ps : (pos + m) // ps] != child.value[: m // ps]:
                break
            pos += m
            if m < len(seg):
                break
            node = child
        tail = own[pos // ps :]
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
        root = handle
        while root.parent is not None:
            root = root.parent
        if root.owner is not self:
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
                    f"unlock of a radix node ({len(node.key)} tokens, lock_ref {node.lock_ref}) "
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
        """Lock ``new``, then unlock ``old`` (SGLang's checkpoint moves ``req.lock``)."""
        self._own(old)
        self.lock(new)
        return self.unlock(old)

    # ---------------------------------------------------------------- eviction

    def evict(self, num_blocks: int) -> list[int]:
        """Free unlocked leaves in policy order until ``num_blocks`` blocks are free (RX-6).

        Whole leaves go, so more than asked may come back; a parent becomes a
        candidate once its last child is evicted.

        Complexity: O(log n) per evicted leaf.
        """
        check_count("num_blocks", num_blocks, MAX_BLOCKS)
        out: list[int] = []
        queue = self._queue
        while len(out) < num_blocks and queue:
            node = queue.pop()
            out += node.value
            if self.check_block_ids:
                self._owned.difference_update(node.value)
            parent = node.parent
            assert parent is not None
            del parent.children[self._child_key(node.key, 0)]
            self._evictable -= len(node.value)
            self._num_nodes -= 1
            node.dead = True
            node.parent = None
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
                node.dead = True
                stack.extend(node.children.values())
        self._roots.clear()
        self._queue.clear()
        self._owned.clear()
        self._num_nodes = 0
        self._evictable = 0
        return out

    # ----------------------------------------------------------------- queries

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
                for ck, child in node.children.items():
                    assert child.parent is node, "child's parent link is wrong"
                    assert not child.dead, "a dead node is still linked"
                    assert self._child_key(child.key, 0) == ck, "child stored under a wrong key"
                    assert len(child.key) > 0 and len(child.key) % ps == 0, (
                        f"segment of {len(child.key)} tokens is not whole pages of {ps}"
                    )
                    assert len(child.value) == len(child.key) // ps, "blocks and pages disagree"
                    assert child.end == node.end + len(child.key), "node end position is wrong"
                    assert child.lock_ref >= 0, f"negative lock_ref {child.lock_ref}"
                    if node.parent is not None:
                        assert node.lock_ref >= child.lock_ref, "parent locked less than child"
                    for b in child.value:
                        assert b not in seen_blocks, f"block {b} appears twice in the tree"
                        seen_blocks.add(b)
                    nodes += 1
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
        self._queue.check()
