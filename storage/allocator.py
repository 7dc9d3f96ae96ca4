"""Free block ids of one paged KV pool (vLLM's free queue minus the cached blocks).

Blocks come out in id order at first; freed blocks are reused first (LIFO, as vLLM
prepends uncached blocks "for better GPU locality"). Cached blocks are not here:
the index owns them until it evicts them.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import BlockOwnershipError, PrefixKVError

__all__ = ["BlockAllocator"]


class BlockAllocator:
    """Hands out block ids ``0 .. num_blocks-1``; all or nothing.

    Args:
        num_blocks: pool size (> 0).

    Raises:
        PrefixKVError: a non-positive or non-int size.
    """

    __slots__ = ("_free_set", "_stack", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        if type(num_blocks) is not int or num_blocks <= 0:
            raise PrefixKVError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.num_blocks = num_blocks
        # The stack's end is the head of the queue: pop from there, push freed there.
        self._stack = list(range(num_blocks - 1, -1, -1))
        self._free_set = set(self._stack)

    @property
    def num_free_blocks(self) -> int:
        """Blocks available now. O(1)."""
        return len(self._stack)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Take ``num_blocks`` blocks, or ``None`` (and nothing) when fewer are free.

        Complexity: O(num_blocks), in C.
        """
        if type(num_blocks) is not int or num_blocks < 0:
            raise PrefixKVError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        stack = self._stack
        if num_blocks > len(stack):
            return None
        if num_blocks == 0:
            return []
        out = stack[-num_blocks:]
        del stack[-num_blocks:]
        out.reverse()
        self._free_set.difference_update(out)
        return out

    def free(self, block_ids: Iterable[int]) -> None:
        """Return blocks; the first of ``block_ids`` is handed out again first.

        Raises:
            BlockOwnershipError: an id that is not an int, out of range (another
                pool's), repeated, or already free; nothing is freed then.

        Complexity: O(len(block_ids)), in C.
        """
        ids = block_ids if isinstance(block_ids, list) else list(block_ids)
        if not ids:
            return
        if len(ids) == 1:  # a request's partial last block: the common case
            bid = ids[0]
            if type(bid) is int and 0 <= bid < self.num_blocks and bid not in self._free_set:
                self._free_set.add(bid)
                self._stack.append(bid)
                return
        if set(map(type, ids)) != {int}:
            bad = next(b for b in ids if type(b) is not int)
            raise BlockOwnershipError(f"block ids must be ints, got {bad!r}")
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= self.num_blocks:
            bad = lo if lo < 0 else hi
            raise BlockOwnershipError(
                f"block {bad} is not in this pool of {self.num_blocks} blocks"
            )
        unique = set(ids)
        if len(unique) != len(ids):
            raise BlockOwnershipError(f"a block id is freed twice in one call: {ids}")
        if not self._free_set.isdisjoint(unique):
            bad = min(self._free_set & unique)
            raise BlockOwnershipError(f"double free of block {bad}")
        self._free_set |= unique
        self._stack.extend(reversed(ids))

    def is_free(self, block_id: int) -> bool:
        """Whether ``block_id`` is free. O(1)."""
        return block_id in self._free_set

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order they will be handed out. O(n)."""
        return self._stack[::-1]

    def check_invariants(self) -> None:
        """The stack and the set agree, with no repeats.

        Raises:
            AssertionError: describing the mismatch.
        """
        assert len(self._stack) == len(self._free_set), (
            f"free stack has {len(self._stack)} entries, set has {len(self._free_set)}"
        )
        assert set(self._stack) == self._free_set, "free stack and free set differ"
        assert all(0 <= b < self.num_blocks for b in self._stack), "free id out of range"
