"""CPU instructions per radix ``match_prefix`` call on head_to_head's workloads (callgrind).

Wall time on a shared machine moves by 2x from minute to minute; the instructions a
lookup executes do not. This replays each workload of ``peers/head_to_head.py`` through
the SGLang engine class as head_to_head does (radix tree, page 1, a pool that never
evicts) under valgrind's callgrind, and prints the inclusive instructions of
``RadixIndex.match_prefix`` per call, with its calls and the hits' sum (equal before and
after a change that keeps the tree's behaviour). Counting the compiled method, it needs
the Python of an environment where the compiled wheel is installed:

    make wheel-venv
    build/wheel-venv/bin/python benchmarks/match_profile.py [--workload multi_turn]

Needs ``valgrind`` (Debian: ``apt install valgrind``); about a minute per workload.
"""

from __future__ import annotations

from callgrind import count, workload_command
from peers.head_to_head import WORKLOADS, TimedIndex

from prefixkv.adapters.lab.replay import replay
from prefixkv.adapters.lab.workloads import make_workload
from prefixkv.indexes import make_index
from prefixkv.indexes.registry import pool_owned_options

METHOD = "CPyPy_radix___RadixIndex___match_prefix"  # the compiled method, as Python calls it


def run_child(workload: str) -> None:
    """The profiled replay; prints its match_prefix calls and the hits' sum."""
    reqs = make_workload(WORKLOADS[workload][0], **WORKLOADS[workload][1])
    cap = sum(len(r.tokens) + len(r.output) for r in reqs) + 8 * len(reqs)  # as head_to_head
    index = TimedIndex(make_index("radix", block_size=1, **pool_owned_options("radix")))
    result = replay(reqs, index, cap, driver="sglang")
    print(index.calls["match_prefix"], sum(h["hit_tokens"] for h in result.hits))


def profile(workload: str) -> tuple[float, int, int]:
    """Instructions per match_prefix call, the calls and the hits' sum of one workload."""
    said, costs = count([__file__, "--child", workload])
    calls, hits = (int(x) for x in said.split())
    return costs.get(METHOD, 0) / calls, calls, hits


def main() -> None:
    args = workload_command(__doc__ or "", WORKLOADS, run_child, "match_profile.py")
    if args is None:
        return
    print(f"{'workload':21} {'instructions/call':>17} {'calls':>6} {'hit tokens':>10}")
    for workload in args.workload or list(WORKLOADS):
        per_call, calls, hits = profile(workload)
        print(f"{workload:21} {per_call:17,.0f} {calls:6} {hits:10}")


if __name__ == "__main__":
    main()
