"""Router decision latency: every policy, N workers, prompts of a given number of blocks.

The fleet's caches are filled first (the event-fed indexes from ``BlockStored`` events
of ``--docs`` documents spread over the workers, the approximate index from routing
them), bookings are spread over the workers, then ``--decisions`` requests are routed,
each a prefix of a document (random depth) followed by new blocks, ``--blocks`` blocks
in all. Per decision: the index match, the policy, the booking and the index update
(:meth:`Router.route`), timed by the wall clock and by the thread's CPU clock (which a
busy machine's preemptions do not inflate); hashing the prompt's blocks is timed
apart. One core, one thread.

    python benchmarks/cluster_router.py --workers 32 --blocks 100
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from array import array

from prefixkv.adapters.events.wire import BlockStored, KVEventBatch
from prefixkv.adapters.lab.sim.profile import load_profile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.keys import HashScheme, Worker
from prefixkv.adapters.router.policies import POLICIES, make_cluster_index, make_policy
from prefixkv.adapters.router.router import Router
from prefixkv.adapters.router.routing import parse_policy


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q / 100 * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=100, help="blocks per prompt")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--decisions", type=int, default=5000)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    bs = args.block_size
    scheme = HashScheme.prefixkv(bs, seed=0)
    profile = load_profile()
    docs = [
        array("I", (rng.randrange(1, 32000) for _ in range(args.blocks * bs)))
        for _ in range(args.docs)
    ]
    doc_hashes = [scheme.block_hashes(d) for d in docs]
    placement = [rng.sample(range(args.workers), rng.randint(1, 4)) for _ in docs]
    requests = []
    for i in range(args.decisions):
        d = rng.randrange(len(docs))
        depth = rng.randrange(1, args.blocks + 1)
        tail = array("I", (rng.randrange(1, 32000) for _ in range((args.blocks - depth) * bs)))
        requests.append(SimRequest(f"q{i}", docs[d][: depth * bs] + tail, 64, float(i)))

    for name in args.policies.split(","):
        spec = parse_policy(name, tuple(POLICIES))
        index = make_cluster_index(spec, scheme)
        router = Router(make_policy(spec), index, scheme, profile, seed=args.seed)
        for w in range(args.workers):
            router.add_replica(w, replay=lambda start, until: None, dump=lambda: None)
        if index is not None and index.event_fed:
            for d, workers in enumerate(placement):
                event = BlockStored(
                    doc_hashes[d], None, docs[d].tolist(), bs, None, "GPU", None, group_idx=0
                )
                for w in workers:
                    index.apply(w, KVEventBatch(0.0, [event], 0), 0.0)
        for d, workers in enumerate(placement):  # bookings (and the approximate index)
            for w in workers:
                req = SimRequest(f"warm-{d}-{w}", docs[d], 64, 0.0)
                if index is not None and not index.event_fed:
                    from prefixkv.adapters.router.keys import RouteKeys

                    index.on_routed(Worker(w), RouteKeys(req.prompt, scheme), 0.0)
                router.loads.reserve(
                    req.id, Worker(w), prefill_tokens=rng.randrange(0, 4096), prefill_s=0.1,
                    decode_blocks=rng.randrange(1, 200), now=0.0,
                )  # fmt: skip
        for w in range(args.workers):
            router.gauges(w, num_waiting=rng.randrange(0, 8), num_running=4, kv_usage=rng.random())
        wall, cpu, hashing = [], [], []
        for req in requests:
            c0 = time.thread_time_ns()
            d = router.route(req, req.arrival or 0.0)
            cpu_ns = time.thread_time_ns() - c0
            wall.append(d.decision_s * 1e6)
            hashing.append(d.hash_s * 1e6)
            cpu.append(cpu_ns / 1e3 - d.hash_s * 1e6)
            router.finished(req.id)
        print(
            json.dumps(
                {
                    "policy": name,
                    "index": index.kind if index is not None else "none",
                    "workers": args.workers,
                    "blocks": args.blocks,
                    "block_size": bs,
                    "decision_wall_p50_us": round(percentile(wall, 50), 1),
                    "decision_wall_p99_us": round(percentile(wall, 99), 1),
                    "decision_cpu_p99_us": round(percentile(cpu, 99), 1),
                    "hash_p50_us": round(percentile(hashing, 50), 1),
                    "hash_p99_us": round(percentile(hashing, 99), 1),
                    "decisions": len(wall),
                    "python": platform.python_version(),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
