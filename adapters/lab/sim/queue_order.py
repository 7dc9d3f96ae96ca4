"""The waiting queue's order: first come first served, or SGLang's cache-aware ``lpm``.

``fcfs`` keeps arrival order (vLLM's ``--scheduling-policy fcfs`` and SGLang's
``--schedule-policy fcfs``, both engines' default). ``lpm`` (longest prefix match)
mirrors SGLang 0.5.23's ``SchedulePolicy.calc_priority`` with ``lpm``: every waiting
request is matched against the cache (capped at ``len - 1``, as admission would
be); the queue is sorted, stably, longest hit first. Requests whose hit is short
(at most 32 tokens) are also matched against the other short-hit requests ahead of
them (SGLang's in-batch prefix caching): one sharing at least 32 leading tokens
with such a request goes to the back, so the first one's prefill is cached before
the rest run. With more than 128 requests waiting the queue is left as it is
(SGLang falls back to FCFS there to bound the matching work).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

from prefixkv.indexes.tokens import ExtraKey, TokenKey

__all__ = [
    "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD",
    "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD",
    "QUEUE_ORDERS",
    "WAITING_QUEUE_PREFIX_MATCH_MAX",
    "QueueOrder",
    "Waiting",
    "sort_by_longest_prefix",
]

QueueOrder = Literal["fcfs", "lpm"]
"""A waiting-queue order (what the engines' flags call a scheduling policy)."""
QUEUE_ORDERS: tuple[QueueOrder, ...] = ("fcfs", "lpm")
"""Waiting-queue orders: first come first served, SGLang's longest prefix match."""

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
"""SGLang: above this many waiting requests, ``lpm`` falls back to FCFS."""
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
"""SGLang: requests whose cached prefix is at most this long are checked against
the other waiting requests."""
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
"""SGLang: a checked request sharing at least this many leading tokens with an
earlier checked one waits behind the rest."""


class Waiting(Protocol):
    """A waiting request: anything that can give the key it would be admitted with."""

    def waiting_key(self) -> TokenKey:
        """Prompt plus the output so far."""
        ...


W = TypeVar("W", bound=Waiting)


def sort_by_longest_prefix(waiting: deque[W], match: Callable[[TokenKey], int]) -> deque[W]:
    """The queue in ``lpm`` order (a new deque; ``waiting`` is unchanged).

    Args:
        waiting: the queue, front first.
        match: a request's cached prefix length (read-only lookup, capped).

    Complexity: one ``match`` per request, O(n log n) sorting; O(1) for n > 128.
    """
    if len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
        return waiting
    width = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
    order: dict[int, float] = {}
    heads: set[tuple[ExtraKey | None, bytes]] = set()
    for seq in waiting:
        key = seq.waiting_key()
        hit = match(key)
        order[id(seq)] = -hit
        if hit > IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD or len(key) < width:
            continue
        # SGLang matches against a page-1 radix tree of the checked requests: a match
        # of >= width tokens is exactly an earlier one with the same first width tokens.
        head = (key.extra_key, key.tokens[:width].tobytes())
        if head in heads:
            order[id(seq)] = math.inf
        else:
            heads.add(head)
    return deque(sorted(waiting, key=lambda s: order[id(s)]))
