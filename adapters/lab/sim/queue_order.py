"""The waiting queue's order: first come first served, or SGLang's cache-aware ``lpm``.

``lpm`` follows SGLang 0.5.23's ``SchedulePolicy.calc_priority``: every waiting request
is matched against the cache (capped at ``len - 1``) and the queue sorted, stably,
longest hit first. A short-hit request sharing its first 32 tokens with an earlier
short-hit one goes to the back (in-batch prefix caching). Over 128 waiting: FCFS.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

from prefixkv.indexes.tokens import ExtraKey, TokenKey

__all__ = ["QUEUE_ORDERS", "QueueOrder", "sort_by_longest_prefix"]

QueueOrder = Literal["fcfs", "lpm"]
"""A waiting-queue order (what the engines' flags call a scheduling policy)."""
QUEUE_ORDERS: tuple[QueueOrder, ...] = ("fcfs", "lpm")

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32


class Waiting(Protocol):
    """A waiting request."""

    def waiting_key(self) -> TokenKey:
        """Prompt plus the output so far."""
        ...


W = TypeVar("W", bound=Waiting)


def sort_by_longest_prefix(waiting: deque[W], match: Callable[[TokenKey], int]) -> deque[W]:
    """The queue in ``lpm`` order (a new deque), ``match`` giving a key's cached prefix."""
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
        # SGLang's page-1 tree of checked requests: a match of >= width tokens is an
        # earlier one with the same first width tokens.
        head = (key.extra_key, key.tokens[:width].tobytes())
        if head in heads:
            order[id(seq)] = math.inf
        else:
            heads.add(head)
    return deque(sorted(waiting, key=lambda s: order[id(s)]))
