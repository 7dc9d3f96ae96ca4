"""A radix tree of blocks with worker sets, in the design of Dynamo's KV indexer.

Dynamo's ``RadixTree`` (``lib/kv-router/src/indexer``) keys each node's children by
the *local* hash of one block's tokens and keeps, per worker, a lookup from the
engine's chained block hash to the node it stored. So engine hashes stay opaque (a
replica may hash with any seed or algorithm: only the parent link of a
``BlockStored`` is looked up by it), and a request is matched by walking its blocks'
content hashes from the root, intersecting worker sets and recording the depth at
which each worker drops out.

A block's content hash folds in what its ``BlockStored`` shows of the namespace (the
LoRA name, the block's extra keys: cache salt, multimodal ids), and a request's the
same from its own namespace, so equal tokens in two namespaces are two nodes.

A ``BlockStored`` whose parent the worker is not known to hold (its events were lost)
cannot be placed and is skipped, as Dynamo does; ``BlockRemoved`` of a hash the worker
does not hold is counted and ignored. A node no worker holds and with no children is
pruned.

NOTE: nodes are not objects. A node is an int; its edges live in one dict keyed by
``(parent, local hash)`` and its fields in parallel lists (worker bitmask, parent,
local hash, child count), with freed ids reused. Hundreds of thousands of small
objects with parent/child links would make every cyclic garbage collection walk the
whole tree, which cost more than the updates themselves; ints in lists are not
tracked. Worker sets are bitmasks (one bit per worker), so the walk is an ``&`` per
block.
"""

from __future__ import annotations

from array import array

from prefixkv.adapters.events.wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
)
from prefixkv.indexes.tokens import TOKEN_TYPECODE

from .bitmask import WorkerBitmasks
from .cluster_index import StreamCheck, wire_int
from .keys import HashScheme, RouteKeys, Worker, local_block_hashes, namespace_keys

__all__ = ["RadixBlockIndex"]

_ROOT = 0


class RadixBlockIndex(WorkerBitmasks):
    """Dynamo's radix tree: children by block content hash, a worker bitmask per node.

    Args:
        scheme: the fleet's block size (its hashes are not needed: see the module).
    """

    kind = "radix"
    event_fed = True

    def __init__(self, scheme: HashScheme) -> None:
        super().__init__()
        self.scheme = scheme
        self.block_size = scheme.block_size
        self._check = StreamCheck(scheme, verify_hashes=False)
        self.incompatible = self._check.incompatible
        # the tree: node 0 is the root
        self._edges: dict[tuple[int, int], int] = {}
        self._workers_of: list[int] = [0]
        self._parent: list[int] = [-1]
        self._local: list[int] = [0]
        self._nchildren: list[int] = [0]
        self._free_nodes: list[int] = []
        # per worker bit
        self._lookup: dict[int, dict[int, int]] = {}  # bit -> engine hash -> node
        self._copies: dict[int, dict[int, int]] = {}  # bit -> engine hash -> copies > 1
        self._stats = dict.fromkeys(
            (
                "block_events",
                "refused_block_events",
                "orphan_blocks",
                "unknown_removals",
                "cleared",
            ),
            0,
        )

    # ------------------------------------------------------------ workers

    def _new_worker(self, bit: int) -> None:
        self._lookup[bit] = {}
        self._copies[bit] = {}

    # ------------------------------------------------------------ nodes

    def _child(self, node: int, local: int) -> int:
        key = (node, local)
        child = self._edges.get(key)
        if child is not None:
            return child
        if self._free_nodes:
            child = self._free_nodes.pop()
            self._workers_of[child] = 0
            self._parent[child] = node
            self._local[child] = local
            self._nchildren[child] = 0
        else:
            child = len(self._parent)
            self._workers_of.append(0)
            self._parent.append(node)
            self._local.append(local)
            self._nchildren.append(0)
        self._edges[key] = child
        self._nchildren[node] += 1
        return child

    def _drop(self, node: int, bit: int) -> None:
        workers_of, parent, nchildren = self._workers_of, self._parent, self._nchildren
        workers_of[node] &= ~bit
        while node != _ROOT and not workers_of[node] and not nchildren[node]:
            up = parent[node]
            del self._edges[(up, self._local[node])]
            nchildren[up] -= 1
            self._free_nodes.append(node)
            node = up

    # ------------------------------------------------------------ updates

    def apply(self, replica: int, batch: EventBatch, now: float) -> None:
        """Apply one batch. Complexity: O(blocks in it) plus hashing their tokens."""
        rank = batch.data_parallel_rank or 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                if event.medium not in (MEDIUM_GPU, None):
                    continue
                if not self._check.accepts(replica, event):
                    self._stats["refused_block_events"] += len(event.block_hashes)
                    continue
                self._store(Worker(replica, rank, event.group_idx or 0), event)
            elif isinstance(event, BlockRemoved):
                if event.medium not in (MEDIUM_GPU, None):
                    continue
                if replica in self.incompatible:
                    self._stats["refused_block_events"] += len(event.block_hashes)
                    continue
                self._remove(Worker(replica, rank, event.group_idx or 0), event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear(replica, rank)

    def _store(self, worker: Worker, event: BlockStored) -> None:
        bit = self._bit(worker)
        lookup, copies = self._lookup[bit], self._copies[bit]
        hashes = event.block_hashes
        self._stats["block_events"] += len(hashes)
        if event.parent_block_hash is None:
            node = _ROOT
        else:
            found = lookup.get(wire_int(event.parent_block_hash))
            if found is None:
                self._stats["orphan_blocks"] += len(hashes)
                return
            node = found
        if len(event.token_ids) >= len(hashes) * self.block_size:
            data = array(TOKEN_TYPECODE, event.token_ids).tobytes()
            keys = namespace_keys(event.lora_name, event.extra_keys, len(hashes))
            locals_ = local_block_hashes(data, self.block_size, keys)
        else:  # hash-only event: the engine's hash is the only key there is
            locals_ = [wire_int(h) for h in hashes]
        workers_of = self._workers_of
        child_of = self._child
        for h, local in zip(hashes, locals_, strict=False):
            node = child_of(node, local)
            key = h if type(h) is int else wire_int(h)
            if key in lookup:
                copies[key] = copies.get(key, 1) + 1
            else:
                lookup[key] = node
            workers_of[node] |= bit

    def _remove(self, worker: Worker, hashes: list[bytes | int]) -> None:
        self._stats["block_events"] += len(hashes)
        bit = self._bits.get(worker)
        if bit is None:
            self._stats["unknown_removals"] += len(hashes)
            return
        lookup, copies = self._lookup[bit], self._copies[bit]
        for h in hashes:
            key = h if type(h) is int else wire_int(h)
            n = copies.get(key)
            if n is not None:
                if n > 2:
                    copies[key] = n - 1
                else:
                    del copies[key]
                continue
            node = lookup.pop(key, None)
            if node is None:
                self._stats["unknown_removals"] += 1
                continue
            self._drop(node, bit)

    def clear(self, replica: int, data_parallel_rank: int | None = None) -> None:
        """Drop the replica's blocks (one rank when given). O(blocks dropped)."""
        self._stats["cleared"] += 1
        for bit in self._bits_of(replica, data_parallel_rank):
            lookup = self._lookup[bit]
            for node in lookup.values():
                self._drop(node, bit)
            lookup.clear()
            self._copies[bit].clear()

    def forget(self, replica: int) -> None:
        """Drop the replica's blocks, checks and worker bits."""
        self.clear(replica)
        self._check.forget(replica)
        for bit in self._forget_workers(replica):
            del self._lookup[bit], self._copies[bit]

    # ------------------------------------------------------------ queries

    def match(self, keys: RouteKeys, now: float) -> dict[Worker, int]:
        """Depth at which each worker drops out of the request's path.

        Complexity: O(matched blocks) dict probes and ``&``, plus O(workers) at the end.
        """
        edges, workers_of, drop_out = self._edges, self._workers_of, self._drop_out
        node = _ROOT
        active = -1
        depth = 0
        out: dict[Worker, int] = {}
        for local in keys.local_hashes:
            child = edges.get((node, local))
            keep = workers_of[child] & active if child is not None else 0
            gone = active & ~keep if depth else 0
            if gone:
                drop_out(out, gone, depth)
            if child is None or not keep:
                return out
            active = keep
            node = child
            depth += 1
        if depth:
            drop_out(out, active, depth)
        return out

    def on_routed(self, worker: Worker, keys: RouteKeys, now: float) -> None:
        """Nothing: this index learns from events only."""

    def held(self, worker: Worker) -> dict[int, int]:
        """The engine hashes the worker holds, with copies. O(blocks held)."""
        bit = self._bits.get(worker)
        if bit is None:
            return {}
        copies = self._copies[bit]
        return {h: copies.get(h, 1) for h in self._lookup[bit]}

    def num_blocks(self, worker: Worker) -> int:
        """Distinct blocks the worker holds. O(1)."""
        bit = self._bits.get(worker)
        return len(self._lookup[bit]) if bit is not None else 0

    def stats(self) -> dict[str, int]:
        """Counters, plus ``entries`` (tree nodes, the root excluded)."""
        return {**self._stats, "entries": len(self._edges)}
