"""Admission time with the boundary tracker attached, as cached siblings grow.

A shared first block is followed by N cached sibling blocks (N different second
blocks, as when many conversations share a system prompt). Each timed admission
shares the first block and part of one sibling, so the tracker must find the sibling
with the longest common prefix: a walk over every sibling costs O(N) per admission,
the sorted mirror O(log N). The same admissions without the tracker are the floor.

    python benchmarks/tracker_siblings.py [--siblings 1000,2000,4000,8000,16000]

Method: hash chain, 16-token blocks, a pool that never evicts; for each N, 200
admissions (admit, then abort so the cache stays the same), the median of 5 rounds
of the mean per admission, garbage collector paused.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from prefixkv.adapters.accounting import BoundaryTracker
from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes import make_index
from prefixkv.storage import BlockAllocator

BS = 16


def build(n: int, tracked: bool, rng: random.Random) -> tuple[CacheManager, list[int]]:
    tracker = [BoundaryTracker(BS, keep_records=False)] if tracked else []
    m = CacheManager(
        make_index("hash_chain", block_size=BS, seed=0),
        BlockAllocator(4 * n + 64),
        observers=tracker,
    )
    head = [rng.randrange(1, 30000) for _ in range(BS)]
    for i in range(n):
        prompt = head + [rng.randrange(1, 30000) for _ in range(BS)] + [1]
        m.admit(f"s{i}", prompt)
        m.commit(f"s{i}", len(prompt))
        m.finish(f"s{i}")
    return m, head


def time_admissions(m: CacheManager, head: list[int], rng: random.Random, count: int) -> float:
    prompts = [head + [rng.randrange(1, 30000) for _ in range(2 * BS)] for _ in range(count)]
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            m.admit(i, p)
            m.abort(i)
        return (time.perf_counter() - t0) / count
    finally:
        gc.enable()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--siblings", default="1000,2000,4000,8000,16000")
    ap.add_argument("--admissions", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    print(f"{'siblings':>9} {'tracked us':>11} {'untracked us':>13}")
    for n in (int(x) for x in args.siblings.split(",")):
        row = []
        for tracked in (True, False):
            rng = random.Random(n)
            m, head = build(n, tracked, rng)
            runs = [time_admissions(m, head, rng, args.admissions) for _ in range(args.rounds)]
            row.append(statistics.median(runs) * 1e6)
            m.check_invariants()
        print(f"{n:>9} {row[0]:>11.1f} {row[1]:>13.1f}")


if __name__ == "__main__":
    main()
