"""A thread-safe wrapper for any prefix index.

Indexes are not thread-safe: engines call them from one scheduler thread. When an
index must be shared (a router probing hits while a scheduler inserts), wrap it: every
call then holds one lock, so calls from different threads never interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .base import PrefixIndex
from .wrapper import IndexWrapper

__all__ = ["SynchronizedIndex"]

T = TypeVar("T")


class SynchronizedIndex(IndexWrapper):
    """``inner`` behind a lock: each call is atomic with respect to the others.

    Every call is locked, the optional capabilities (``evict_blocks``, …) too. A
    match and the lock of its handle are two calls; to keep another thread from
    evicting in between, hold :attr:`mutex` (re-entrant) around both.

    Args:
        inner: the index to share.
    """

    def __init__(self, inner: PrefixIndex) -> None:
        super().__init__(inner)
        self.mutex = threading.RLock()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self.mutex:
            return fn(*args, **kwargs)
