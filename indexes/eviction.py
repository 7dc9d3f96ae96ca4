"""Eviction policies for the radix tree (SGLang's ``evict_policy.py``).

A policy maps a node's statistics to a sort key; the tree evicts the unlocked leaf
with the smallest key first. New policies plug in without touching the tree code
(SPEC RX-7).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Protocol

from sortedcontainers import SortedList

from .errors import PrefixKVError

__all__ = [
    "EVICTION_POLICIES",
    "EvictionPolicy",
    "EvictionQueue",
    "NodeStats",
    "make_eviction_policy",
]


class NodeStats(Protocol):
    """What a policy may read from a tree node."""

    @property
    def last_access(self) -> int:
        """Tick of the last match or insert through the node."""
        ...

    @property
    def hit_count(self) -> int:
        """Requests that inserted through the node (SGLang's ``hit_count``)."""
        ...

    @property
    def priority(self) -> int:
        """Highest request priority that inserted through the node."""
        ...

    @property
    def created(self) -> int:
        """Tick at which the node was created."""
        ...


class EvictionPolicy(Protocol):
    """Orders eviction candidates: smaller ``sort_key`` is evicted first.

    A policy may also set ``monotone = True`` to say that a node's key never decreases
    as its statistics change (its last access moves forward, its hit count and
    priority only grow), as every built-in policy's does. The queue then files a
    touched candidate again only when it reaches the front, not on every touch;
    without it (an MRU policy, say), every touch re-files the candidate at once.
    """

    name: str

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """The node's eviction key."""
        ...


class LRUPolicy:
    """Least recently used first (SGLang's default)."""

    name = "lru"
    monotone = True

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(last_access,)``."""
        return (node.last_access,)


class LFUPolicy:
    """Least frequently used first, LRU among equals."""

    name = "lfu"
    monotone = True

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(hit_count, last_access)``."""
        return (node.hit_count, node.last_access)


class PriorityPolicy:
    """Lowest request priority first, LRU among equals."""

    name = "priority"
    monotone = True

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(priority, last_access)``."""
        return (node.priority, node.last_access)


class FIFOPolicy:
    """Oldest node first, whatever its use."""

    name = "fifo"
    monotone = True

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(created,)``."""
        return (node.created,)


EVICTION_POLICIES: Mapping[str, Callable[[], EvictionPolicy]] = MappingProxyType(
    {"lru": LRUPolicy, "lfu": LFUPolicy, "priority": PriorityPolicy, "fifo": FIFOPolicy}
)
"""Built-in policies by name."""


def make_eviction_policy(policy: str | EvictionPolicy) -> EvictionPolicy:
    """A policy by name, or ``policy`` itself when it already is one.

    Raises:
        PrefixKVError: an unknown name (the message lists the known ones).
    """
    if not isinstance(policy, str):
        if not callable(getattr(policy, "sort_key", None)):
            raise PrefixKVError(f"eviction policy {policy!r} has no sort_key(node) method")
        return policy
    factory = EVICTION_POLICIES.get(policy)
    if factory is None:
        raise PrefixKVError(
            f"unknown eviction policy {policy!r}; known: {', '.join(EVICTION_POLICIES)}"
        )
    return factory()


class EvictionQueue:
    """The eviction candidates (unlocked leaves), smallest policy key first.

    Unlike SGLang, which heapifies every evictable leaf on each ``evict`` call, the
    candidates stay in a sorted list updated as nodes change: O(log n) per add,
    removal or pop. Each node records the key it is filed under in its ``evict_key``
    attribute (``None`` when not a candidate); ties are broken by the node's unique
    ``created`` tick.

    With a ``monotone`` policy a candidate touched since it was filed keeps its old
    (smaller) entry until it reaches the front, where ``pop`` files it again under
    its current key: the order is that of current keys, as if every touch had
    re-filed it, but a match through a candidate costs no re-filing (a sorted-list
    removal and insertion, most of a short match's time).
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._lazy = getattr(policy, "monotone", False) is True
        self._items: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[tuple[tuple[int, ...], int], Any]]:
        return iter(self._items)

    def _key(self, node: Any) -> tuple[tuple[int, ...], int]:
        return (self.policy.sort_key(node), node.created)

    def add(self, node: Any) -> None:
        """File ``node`` under its current key. O(log n)."""
        key = self._key(node)
        node.evict_key = key
        self._items.add((key, node))

    def discard(self, node: Any) -> None:
        """Take ``node`` out if it is a candidate. O(log n)."""
        if node.evict_key is not None:
            self._items.remove((node.evict_key, node))
            node.evict_key = None

    def rekey(self, node: Any) -> None:
        """Note that a candidate's statistics changed: re-file it now, or (monotone
        policy) when it reaches the front. O(log n), or O(1)."""
        if node.evict_key is not None and not self._lazy:
            self.discard(node)
            self.add(node)

    def pop(self) -> Any:
        """Remove and return the candidate to evict first. O(log n) amortized."""
        while True:
            filed, node = self._items.pop(0)
            if self._lazy:
                key = self._key(node)
                if key != filed:  # touched since filed: its key only grew
                    node.evict_key = key
                    self._items.add((key, node))
                    continue
            node.evict_key = None
            return node

    def clear(self) -> None:
        """Forget every candidate (the nodes' keys are left as they are)."""
        self._items.clear()

    def check_invariants(self) -> None:
        """Every entry is filed under its node's current key (monotone policy: under
        a key no greater than its current one).

        Raises:
            AssertionError: a stale key.
        """
        for key, node in self._items:
            assert node.evict_key == key, "candidate key out of date"
            now = self._key(node)
            if self._lazy:
                assert key <= now, "a monotone policy's key decreased"
            else:
                assert key == now, "stale eviction key"
