"""Bytes per cached block in vLLM 0.33's prefix cache, for the memory comparison.

Run with the vLLM side environment's Python (tests/README.md, "The engine
tests and the recorders"); ``benchmarks/memory_per_block.py`` prints prefixkv's figure beside it.
Builds a ``BlockPool`` of N blocks and gives every block a chained hash through
the pool's own ``cache_full_blocks``, measuring the Python heap with tracemalloc.

    VLLM_VENV/bin/python benchmarks/peers/vllm_memory.py --blocks 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import tracemalloc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=100_000)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args()
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(args.block_size, hash_fn)
    n, bs = args.blocks, args.block_size
    prompt = list(range(1, n * bs + 2))  # one long prompt: n full blocks
    req = Request(request_id="r", prompt_token_ids=prompt,
                  sampling_params=SamplingParams(max_tokens=1), pooling_params=None,
                  arrival_time=0.0, block_hasher=hasher)  # fmt: skip
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pool = BlockPool(n + 1, enable_caching=True, hash_block_size=bs)
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(req, blocks, 0, n, bs, 0)
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    # The request's own hash list is the caller's, not the pool's: counted apart.
    print(json.dumps({"engine": "vllm 0.33", "blocks": n,
                      "bytes_per_cached_block": round((after - before) / n, 1)}))  # fmt: skip


if __name__ == "__main__":
    main()
