"""The no-cache baseline: an index that never hits and never holds a block.

Like mini-sglang's null cache, it lets an engine run the same code path with prefix
caching off, so "no cache" is measured through exactly the machinery the real
backends use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from .base import CacheHandle, EventSink, IndexDescription, IndexStats, InsertResult, PrefixMatch
from .errors import InvalidHandleError
from .tokens import TokenKey
from .validation import MAX_BLOCK_SIZE, MAX_BLOCKS, check_count, check_positive

__all__ = ["NoPrefixIndex"]


class _NullHandle:
    __slots__ = ("owner",)

    def __init__(self, owner: NoPrefixIndex) -> None:
        self.owner = owner


class NoPrefixIndex:
    """Always misses; ``insert`` registers nothing, so every block stays the caller's.

    Its event sink hears only resets (vLLM with prefix caching off still publishes
    ``AllBlocksCleared`` on ``reset_prefix_cache``).

    Args:
        block_size: the allocation granularity the engine uses (reported only).
    """

    kv_event_dialect: ClassVar[str] = "vllm"
    DESCRIPTION: ClassVar[IndexDescription] = IndexDescription(caches=False)

    def __init__(self, block_size: int = 16) -> None:
        self.block_size = check_positive("block_size", block_size, MAX_BLOCK_SIZE)
        self._handle = _NullHandle(self)
        self._sink: EventSink | None = None

    def set_event_sink(self, sink: EventSink | None) -> None:
        """Report resets to ``sink`` from now on (``None``: stop). O(1)."""
        self._sink = sink

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """A miss. O(1)."""
        return PrefixMatch(0, [], self._handle)

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """Registers nothing: the caller keeps (and later frees) all its blocks. O(1)."""
        return InsertResult(0, [], self._handle)

    def _check(self, handle: CacheHandle) -> None:
        if handle is not self._handle:
            raise InvalidHandleError(f"handle {handle!r} was not made by this index")

    def count_evictable(self, handle: CacheHandle) -> int:
        """No block to protect. O(1)."""
        self._check(handle)
        return 0

    def lock(self, handle: CacheHandle) -> None:
        """Nothing to pin. O(1)."""
        self._check(handle)

    def unlock(self, handle: CacheHandle) -> list[int]:
        """Nothing to release. O(1)."""
        self._check(handle)
        return []

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """Nothing to move. O(1)."""
        self._check(old)
        self._check(new)
        return []

    def evict(self, num_blocks: int) -> list[int]:
        """Nothing to evict. O(1)."""
        check_count("num_blocks", num_blocks, MAX_BLOCKS)
        return []

    def reset(self) -> list[int]:
        """Nothing to drop; the sink hears the reset. O(1)."""
        if self._sink is not None:
            self._sink.on_cleared()
        return []

    def stats(self) -> IndexStats:
        """All zero. O(1)."""
        return IndexStats(0, 0, 0, 0, 0)

    def memory_bytes(self) -> int:
        """The index holds no per-block structures."""
        return 0

    def check_invariants(self) -> None:
        """Nothing can break."""
