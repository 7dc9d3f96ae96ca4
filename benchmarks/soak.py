"""Soak run: a million requests through each backend under constant eviction.

Checks that memory stays bounded by the pool (the index never holds more blocks than
the pool has) and comes back to the empty baseline after ``reset``. Not a CI test:

    python benchmarks/soak.py --requests 1000000            # both backends, ~minutes
    python benchmarks/soak.py --requests 20000 --index radix

Prints one JSON line per checkpoint and a summary line per backend.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import sys
import time
from pathlib import Path

from prefixkv.adapters import CacheManager
from prefixkv.indexes import make_index
from prefixkv.storage import BlockAllocator


def rss_bytes() -> int:
    """Current resident set size (Linux ``/proc``; peak RSS elsewhere)."""
    statm = Path("/proc/self/statm")
    if statm.exists():
        return int(statm.read_text().split()[1]) * resource.getpagesize()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover


def prompts(seed: int, vocab: int) -> object:
    """Endless prompts: shared system prompts, branching conversations, fresh ones."""
    rng = random.Random(seed)
    systems = [[rng.randrange(vocab) for _ in range(rng.randrange(16, 96))] for _ in range(32)]
    recent: list[list[int]] = []
    while True:
        r = rng.random()
        if r < 0.5:
            p = rng.choice(systems) + [rng.randrange(vocab) for _ in range(rng.randrange(1, 64))]
        elif r < 0.8 and recent:
            base = rng.choice(recent)
            p = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(vocab) for _ in range(8)]
        else:
            p = [rng.randrange(vocab) for _ in range(rng.randrange(1, 160))]
        recent.append(p)
        if len(recent) > 256:
            recent.pop(0)
        yield p


def soak(
    name: str, block_size: int, num_blocks: int, requests: int, every: int
) -> dict[str, object]:
    gc.collect()
    baseline = rss_bytes()
    index = make_index(name, block_size=block_size)
    m = CacheManager(index, BlockAllocator(num_blocks))
    gen = prompts(0, 32000)
    peak_rss = peak_index = 0
    t0 = time.perf_counter()
    for i in range(1, requests + 1):
        p = next(gen)  # type: ignore[call-overload]
        rid = i
        adm = m.admit(rid, p)
        if adm is None:
            continue
        m.commit(rid, len(p))
        m.append(rid, [7, 8])
        m.commit(rid, len(p) + 2)
        m.finish(rid)
        if i % every == 0:
            stats = index.stats()
            assert stats.num_cached_blocks <= num_blocks
            measure = getattr(index, "memory_bytes", None)
            mem = int(measure()) if measure is not None else 0
            rss = rss_bytes()
            peak_rss, peak_index = max(peak_rss, rss), max(peak_index, mem)
            point = {
                "index": name,
                "requests": i,
                "rss_mb": round(rss / 2**20, 1),
                "index_mb": round(mem / 2**20, 2),
                "cached_blocks": stats.num_cached_blocks,
                "evicted_blocks": m.totals.num_evicted_blocks,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            print(json.dumps(point), flush=True)
    m.check_invariants()
    seconds = time.perf_counter() - t0
    m.reset()
    m.check_invariants()
    after_index = getattr(index, "memory_bytes", lambda: 0)()
    gc.collect()
    return {
        "index": name,
        "block_size": block_size,
        "num_blocks": num_blocks,
        "requests": requests,
        "seconds": round(seconds, 1),
        "evicted_blocks": m.totals.num_evicted_blocks,
        "hit_ratio": round(m.totals.hit_ratio, 4),
        "baseline_rss_mb": round(baseline / 2**20, 1),
        "peak_rss_mb": round(peak_rss / 2**20, 1),
        "peak_index_mb": round(peak_index / 2**20, 2),
        "index_bytes_after_reset": after_index,
        "cached_blocks_after_reset": index.stats().num_cached_blocks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--index", action="append", help="hash_chain, radix (default both)")
    ap.add_argument("--num-tokens", type=int, default=65536, help="pool size in tokens")
    ap.add_argument("--every", type=int, default=100_000, help="checkpoint interval")
    args = ap.parse_args()
    configs = {"hash_chain": 16, "radix": 1}
    for name in args.index or list(configs):
        bs = configs.get(name, 16)
        summary = soak(name, bs, args.num_tokens // bs, args.requests, args.every)
        print(json.dumps({"summary": summary}), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
