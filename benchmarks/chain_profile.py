"""CPU instructions per request in the hash chain's vLLM class on head_to_head's workloads.

Wall time on a shared machine moves by 2x from minute to minute; the instructions a
request executes do not. This replays each workload of ``peers/head_to_head.py`` through
prefixkv's vLLM ``KVCacheManager`` over the hash chain as head_to_head does (block 16, a
pool that never evicts, the calls head_to_head times) under valgrind's callgrind, and
prints the inclusive instructions per request of the calls head_to_head times
(``get_computed_blocks``, ``allocate_slots``, ``free``), with the hits' sum (equal before
and after a change that keeps the index's behaviour). ``--top N`` also lists the N
functions with the most inclusive instructions per request inside those calls. Counting
the compiled methods, it needs the Python of an environment where the compiled wheel is
installed:

    make wheel-venv
    build/wheel-venv/bin/python benchmarks/chain_profile.py [--workload multi_turn] [--top 20]

Needs ``valgrind`` (Debian: ``apt install valgrind``); about a minute per workload.
"""

from __future__ import annotations

import argparse

from callgrind import count, workload_command
from peers.head_to_head import WORKLOADS, _each_call

from prefixkv.adapters.lab.replay import replay
from prefixkv.adapters.lab.workloads import make_workload
from prefixkv.indexes import make_index
from prefixkv.indexes.registry import pool_owned_options

# The compiled methods as Python calls them (mypyc's wrapper names).
PREFIX = "CPyPy_kv_cache_manager___KVCacheManager___"
METHODS = tuple(PREFIX + m for m in ("get_computed_blocks", "allocate_slots", "free"))


def run_child(workload: str) -> None:
    """The profiled replay; prints its requests and the hits' sum."""
    reqs = make_workload(WORKLOADS[workload][0], **WORKLOADS[workload][1])
    blocks = sum(len(r.tokens) + len(r.output) for r in reqs) // 16 + 4 * len(reqs)
    index = make_index("hash_chain", block_size=16, **pool_owned_options("hash_chain"))
    result = replay(reqs, index, blocks, driver="vllm", on_step=_each_call)
    print(len(reqs), sum(h["hit_tokens"] for h in result.hits))


def profile(workload: str) -> tuple[dict[str, int], int, int]:
    """Inclusive instructions by function, the requests and the hits' sum of one workload."""
    # Collect inside the timed calls only: every function's count is then its share of them.
    said, costs = count([__file__, "--child", workload], collect=METHODS)
    n, hits = (int(x) for x in said.split())
    return costs, n, hits


def main() -> None:
    def top(ap: argparse.ArgumentParser) -> None:
        ap.add_argument("--top", type=int, default=0, help="also list the top N functions")

    args = workload_command(__doc__ or "", WORKLOADS, run_child, "chain_profile.py", top)
    if args is None:
        return
    print(f"{'workload':21} {'instructions/request':>20} {'requests':>8} {'hit tokens':>10}")
    for workload in args.workload or list(WORKLOADS):
        costs, n, hits = profile(workload)
        total = sum(costs.get(m, 0) for m in METHODS)
        by = ", ".join(f"{m[len(PREFIX) :]} {costs.get(m, 0) / n:,.0f}" for m in METHODS)
        print(f"{workload:21} {total / n:20,.0f} {n:8} {hits:10}  ({by})")
        if args.top:
            rows = [(k, v) for k, v in costs.items() if k not in METHODS and v > 0.01 * total]
            for name, cost in sorted(rows, key=lambda kv: -kv[1])[: args.top]:
                print(f"{cost / n:12,.0f}  {name}")


if __name__ == "__main__":
    main()
