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
    """Orders eviction candidates: smaller ``sort_key`` is evicted first."""

    name: str

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """The node's eviction key."""
        ...


class LRUPolicy:
    """Least recently used first (SGLang's default)."""

    name = "lru"

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(last_access,)``."""
        return (node.last_access,)


class LFUPolicy:
    """Least frequently used first, LRU among equals."""

    name = "lfu"

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(hit_count, last_access)``."""
        return (node.hit_count, node.last_access)


class PriorityPolicy:
    """Lowest request priority first, LRU among equals."""

    name = "priority"

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        """``(priority, last_access)``."""
        return (node.priority, node.last_access)


class FIFOPolicy:
    """Oldest node first, whatever its use."""

    name = "fifo"

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
    removal, re-key or pop. Each node records the key it is filed under in its
    ``evict_key`` attribute (``None`` when not a candidate); ties are broken by the
    node's unique ``created`` tick.
    """

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._items: SortedList = SortedList()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[tuple[tuple[tuple[int, ...], int], Any]]:
        return iter(self._items)

    def add(self, node: Any) -> None:
        """File ``node`` under its current key. O(log n)."""
        key = (self.policy.sort_key(node), node.created)
        node.evict_key = key
        self._items.add((key, node))

    def discard(self, node: Any) -> None:
        """Take ``node`` out if it is a candidate. O(log n)."""
        if node.evict_key is not None:
            self._items.remove((node.evict_key, node))
            node.evict_key = None

    def rekey(self, node: Any) -> None:
        """Refile a candidate whose statistics changed. O(log n)."""
        if node.evict_key is not None:
            self.discard(node)
            self.add(node)

    def pop(self) -> Any:
        """Remove and return the candidate to evict first. O(log n)."""
        _, node = self._items.pop(0)
        node.evict_key = None
        return node

    def clear(self) -> None:
        """Forget every candidate (the nodes' keys are left as they are)."""
        self._items.clear()

    def check(self) -> None:
        """Every entry is filed under its node's current key.

        Raises:
            AssertionError: a stale key.
        """
        for key, node in self._items:
            assert node.evict_key == key, "candidate key out of date"
            assert key == (self.policy.sort_key(node), node.created), "stale eviction key"
