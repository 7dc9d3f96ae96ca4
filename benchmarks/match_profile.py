"""CPU instructions per radix ``match_prefix`` and ``insert`` call on head_to_head's workloads.

Wall time on a shared machine moves by 2x from minute to minute; the instructions a
lookup executes do not. This replays each workload of ``peers/head_to_head.py`` through
the SGLang engine class as head_to_head does (radix tree, page 1, a pool that never
evicts) under valgrind's callgrind, and prints the inclusive instructions of
``RadixIndex.match_prefix`` and of ``RadixIndex.insert`` per call and per request (work
moved from a lookup into the inserts shows there), with the calls and the hits' sum
(equal before and after a change that keeps the tree's behaviour). Counting the compiled
methods, it needs the Python of an environment where the compiled wheel is installed:

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

# The compiled methods, as Python calls them.
MATCH = "CPyPy_radix___RadixIndex___match_prefix"
INSERT = "CPyPy_radix___RadixIndex___insert"


def run_child(workload: str) -> None:
    """The profiled replay; prints its requests, match_prefix and insert calls and the
    hits' sum."""
    reqs = make_workload(WORKLOADS[workload][0], **WORKLOADS[workload][1])
    cap = sum(len(r.tokens) + len(r.output) for r in reqs) + 8 * len(reqs)  # as head_to_head
    index = TimedIndex(make_index("radix", block_size=1, **pool_owned_options("radix")))
    result = replay(reqs, index, cap, driver="sglang")
    hits = sum(h["hit_tokens"] for h in result.hits)
    print(len(reqs), index.calls["match_prefix"], index.calls["insert"], hits)


def profile(workload: str) -> dict[str, int]:
    """One workload's requests, calls and hits' sum, and the instructions inside
    match_prefix and insert (all calls)."""
    said, costs = count([__file__, "--child", workload])
    requests, matches, inserts, hits = (int(x) for x in said.split())
    return {"requests": requests, "matches": matches, "inserts": inserts, "hits": hits,
            "match": costs.get(MATCH, 0), "insert": costs.get(INSERT, 0)}  # fmt: skip


def main() -> None:
    args = workload_command(__doc__ or "", WORKLOADS, run_child, "match_profile.py")
    if args is None:
        return
    print(f"{'':21} {'instructions per call':>23}  {'per request':>19}  {'calls':>13}")
    print(f"{'workload':21} {'match':>11} {'insert':>11}  {'match':>9} {'insert':>9}  "
          f"{'match':>6} {'insert':>6} {'hit tokens':>10}")  # fmt: skip
    for workload in args.workload or list(WORKLOADS):
        p = profile(workload)
        match, insert, n = p["match"], p["insert"], p["requests"]
        print(f"{workload:21} {match / p['matches']:11,.0f} {insert / p['inserts']:11,.0f}  "
              f"{match / n:9,.0f} {insert / n:9,.0f}  {p['matches']:6} {p['inserts']:6} "
              f"{p['hits']:10}")  # fmt: skip


if __name__ == "__main__":
    main()
