"""Workers as the bits of an int: a set of workers is a mask, and intersecting is ``&``.

The worker sets of Dynamo's radix tree (one per node) and of the approximate index
(one per block hash) are such masks, so matching a request is one ``&`` per block.
Each worker gets one bit; the bits of a forgotten replica are handed out again.
"""

from __future__ import annotations

from .keys import Worker

__all__ = ["WorkerBitmasks"]


class WorkerBitmasks:
    """The bit of each worker, for an index that keeps worker sets as masks.

    A subclass keeps its per-worker state keyed by bit: it makes it in
    :meth:`_new_worker` and drops it for the bits :meth:`_forget_workers` returns.
    """

    def __init__(self) -> None:
        self._bits: dict[Worker, int] = {}
        self._workers: dict[int, Worker] = {}  # bit -> worker
        self._free_bits: list[int] = []

    def _new_worker(self, bit: int) -> None:
        """Make the per-worker state of a new ``bit``."""

    def _bit(self, worker: Worker) -> int:
        """The worker's bit, given it on first sight. O(1)."""
        bit = self._bits.get(worker)
        if bit is None:
            bit = self._free_bits.pop() if self._free_bits else 1 << len(self._bits)
            self._bits[worker] = bit
            self._workers[bit] = worker
            self._new_worker(bit)
        return bit

    def _bits_of(self, replica: int, data_parallel_rank: int | None = None) -> list[int]:
        """The bits of the replica's workers (one rank's when given). O(workers)."""
        return [
            bit
            for worker, bit in self._bits.items()
            if worker.replica == replica
            and (data_parallel_rank is None or worker.data_parallel_rank == data_parallel_rank)
        ]

    def _forget_workers(self, replica: int) -> list[int]:
        """Free the bits of the replica's workers, for reuse; returns them. O(workers)."""
        freed = []
        for worker, bit in list(self._bits.items()):
            if worker.replica == replica:
                del self._bits[worker], self._workers[bit]
                self._free_bits.append(bit)
                freed.append(bit)
        return freed

    def _drop_out(self, out: dict[Worker, int], mask: int, depth: int) -> None:
        """Record ``depth`` as the match of each worker in ``mask``. O(bits set)."""
        workers = self._workers
        while mask:
            low = mask & -mask
            out[workers[low]] = depth
            mask ^= low
