"""The hash chain's evictable-block queue: an intrusive doubly linked list (vLLM's
``FreeKVCacheBlockQueue``).

Not a ``deque``: a cache hit must pull a block out of the middle of the queue, and
``deque.remove`` is O(n). Here each block carries its own ``prev``/``next`` links,
so ``remove`` is O(1) and no node objects are allocated. Head = evicted first.
"""

from __future__ import annotations

from collections.abc import Iterator

from .block_map import CachedBlock

__all__ = ["FreeBlockQueue"]


class FreeBlockQueue:
    """LRU queue of evictable blocks with O(1) ``append``, ``popleft`` and ``remove``."""

    __slots__ = ("_head", "_len", "_tail")

    def __init__(self) -> None:
        # Sentinels (block_id -1) remove the empty-list branches from every operation.
        self._head = CachedBlock(-1, None)
        self._tail = CachedBlock(-1, None)
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def append(self, block: CachedBlock) -> None:
        """Queue ``block`` as the most recently used. O(1)."""
        last = self._tail.prev
        assert last is not None
        last.next = block
        block.prev = last
        block.next = self._tail
        self._tail.prev = block
        self._len += 1

    def remove(self, block: CachedBlock) -> None:
        """Take ``block`` out of the queue, wherever it is. O(1)."""
        prev, nxt = block.prev, block.next
        if prev is None or nxt is None:
            raise AssertionError(f"block {block.block_id} is not in the free queue")
        prev.next = nxt
        nxt.prev = prev
        block.prev = block.next = None
        self._len -= 1

    def pin(self, blocks: list[CachedBlock]) -> None:
        """``ref_cnt += 1`` on each block, unqueueing those that were evictable.

        One call per run (a hit, a request's new blocks): the list surgery is done
        inline, which in CPython costs a fraction of a method call per block.
        Complexity: O(len(blocks)).
        """
        removed = 0
        for block in blocks:
            if block.ref_cnt == 0:
                prev, nxt = block.prev, block.next
                if prev is None or nxt is None:
                    raise AssertionError(f"block {block.block_id} is not in the free queue")
                prev.next = nxt
                nxt.prev = prev
                block.prev = block.next = None
                removed += 1
            block.ref_cnt += 1
        self._len -= removed

    def release(self, blocks: list[CachedBlock]) -> list[CachedBlock]:
        """``ref_cnt -= 1`` on each block, last block first (vLLM frees tail first).

        Blocks reaching 0 join the tail of the queue in that order, so a run's tail is
        evicted before its head; those without a hash (dropped while locked) are not
        queued but returned. Complexity: O(len(blocks)).
        """
        orphans: list[CachedBlock] = []
        tail = self._tail
        last = tail.prev
        assert last is not None
        added = 0
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    orphans.append(block)
                    continue
                last.next = block
                block.prev = last
                last = block
                added += 1
        last.next = tail
        tail.prev = last
        self._len += added
        return orphans

    def popleft(self) -> CachedBlock:
        """Remove and return the least recently used block. O(1).

        Raises:
            IndexError: the queue is empty.
        """
        first = self._head.next
        if first is self._tail or first is None:
            raise IndexError("pop from an empty free queue")
        self.remove(first)
        return first

    def clear(self) -> None:
        """Unlink every block. O(n)."""
        for block in list(self):
            block.prev = block.next = None
        self._head.next = self._tail
        self._tail.prev = self._head
        self._len = 0

    def __iter__(self) -> Iterator[CachedBlock]:
        """Blocks from the head (next to evict) to the tail."""
        node = self._head.next
        while node is not None and node is not self._tail:
            yield node
            node = node.next

    def check_invariants(self) -> None:
        """Links agree in both directions and the length is right."""
        seen = 0
        prev = self._head
        node = self._head.next
        while node is not self._tail:
            assert node is not None, "free queue broken: forward walk fell off the list"
            assert node.prev is prev, f"free queue broken at block {node.block_id}: prev link"
            assert node.ref_cnt == 0, f"block {node.block_id} queued with ref_cnt {node.ref_cnt}"
            seen += 1
            assert seen <= self._len, f"free queue holds more than its length {self._len}"
            prev, node = node, node.next
        assert self._tail.prev is prev, "free queue broken: tail link"
        assert seen == self._len, f"free queue length {self._len} but {seen} linked blocks"
