"""Bytes of index structures per cached block, measured with tracemalloc.

For each backend, cached blocks as one long sequence and as many 16-block
sequences sharing their first half (the hash chain: block objects, hash entries and
the hash bytes; the radix tree: nodes, token segments, block lists). Block-id ints
belong to the allocator and are not counted. vLLM's figure comes from
``benchmarks/peers/vllm_memory.py`` (297 bytes per cached block for vLLM 0.33 in the
README's run).

    python benchmarks/memory_per_block.py --blocks 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc

from prefixkv.indexes import TokenKey, make_index
from prefixkv.indexes.registry import pool_owned_options


def measure(
    name: str, block_size: int, num_blocks: int, seq_blocks: int, **options: object
) -> float:
    """Bytes per cached block for ``num_blocks`` blocks cached as sequences of
    ``seq_blocks`` blocks that share their first half (a tree of many leaves)."""
    bs = block_size
    half = seq_blocks // 2 * bs
    shared = list(range(1, half + 1))
    keys = [TokenKey(shared + [10**6 + s * 10**3 + t for t in range(seq_blocks * bs - half)])
            for s in range(num_blocks // seq_blocks)]  # fmt: skip
    ids = iter(range(10**9))
    tables = [[next(ids) for _ in range(seq_blocks)] for _ in keys]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = make_index(name, block_size=block_size, **options)
    for key, table in zip(keys, tables, strict=True):
        index.insert(key, table)  # hashes are computed (and kept by the index) in here
    del keys  # the requests are gone; what stays is the index's
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / index.stats().num_cached_blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=100_000)
    args = ap.parse_args()
    n = args.blocks
    rows = [
        ("hash_chain", 16, {}),
        ("hash_chain", 16, {"verify": True}),
        ("radix", 16, pool_owned_options("radix")),
        ("radix", 1, pool_owned_options("radix")),
        ("radix", 1, {}),
    ]
    for seq_blocks in (n, 16):
        for name, bs, opts in rows:
            blocks = n * 16 // bs if bs == 1 and seq_blocks == 16 else n
            per_block = measure(name, bs, blocks, min(seq_blocks, blocks), **opts)
            label = name + "".join(f" {k}={v}" for k, v in opts.items())
            shape = "one sequence" if seq_blocks == n else "16-block sequences, half shared"
            print(json.dumps({"index": label, "block_size": bs, "shape": shape,
                              "bytes_per_cached_block": round(per_block, 1),
                              "bytes_per_cached_token": round(per_block / bs, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
