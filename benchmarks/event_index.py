"""Throughput of the KV-event consumer: EventIndex updates, decoding, prefix queries.

A synthetic stream shaped like vLLM's: per replica, batches of one to four events;
``BlockStored`` chains of 1 to 64 blocks (random 64-bit hashes, as vLLM puts on the
wire), ``BlockRemoved`` of one earlier block each (vLLM sends one per evicted hash),
some stores repeated (vLLM's duplicate blocks). One core, one thread; the best of
``--repeat`` runs on a fresh index. Block events = hashes in BlockStored plus hashes
in BlockRemoved.

    python benchmarks/event_index.py --block-events 1000000 --replicas 8
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time
from collections.abc import Callable

import msgspec

from prefixkv.adapters.events.codec import EventDecoder
from prefixkv.adapters.events.index import EventIndex
from prefixkv.adapters.events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


def make_stream(
    rng: random.Random, block_events: int, replicas: int
) -> tuple[list[tuple[int, KVEventBatch]], list[list[int]]]:
    """``[(replica, batch)]`` with about ``block_events`` block events, and some chains."""
    live: list[list[int]] = [[] for _ in range(replicas)]
    chains: list[list[int]] = []
    stream: list[tuple[int, KVEventBatch]] = []
    count = 0
    while count < block_events:
        r = rng.randrange(replicas)
        events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        for _ in range(rng.randint(1, 4)):
            held = live[r]
            if rng.random() < 0.55 or len(held) < 64:
                if chains and rng.random() < 0.3:
                    chain = rng.choice(chains)[: rng.randint(1, 64)]  # a shared prefix
                else:
                    chain = [rng.getrandbits(64) for _ in range(rng.randint(1, 64))]
                    if len(chains) < 10_000:
                        chains.append(chain)
                hashes: list[bytes | int] = list(chain)
                tokens = [0] * 16 * len(chain)
                events.append(BlockStored(hashes, None, tokens, 16, None, "GPU", None, group_idx=0))
                held.extend(chain)
                count += len(chain)
            else:
                i = rng.randrange(len(held))
                held[i], held[-1] = held[-1], held[i]
                events.append(BlockRemoved([held.pop()], "GPU", group_idx=0))
                count += 1
        stream.append((r, KVEventBatch(ts=float(len(stream)), events=events, data_parallel_rank=0)))
    return stream, chains


def best(repeat: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block-events", type=int, default=1_000_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    stream, chains = make_stream(rng, args.block_events, args.replicas)
    n_blocks = sum(
        len(e.block_hashes)
        for _, b in stream
        for e in b.events
        if not isinstance(e, AllBlocksCleared)
    )
    payloads = [(r, msgspec.msgpack.encode(b)) for r, b in stream]

    def apply_only() -> EventIndex:
        index = EventIndex()
        for r, b in stream:
            index.apply(b, r)
        return index

    def decode_and_apply() -> None:
        index, dec = EventIndex(), EventDecoder()
        for r, p in payloads:
            index.apply(dec.decode(p), r)

    t_apply = best(args.repeat, apply_only)
    t_both = best(args.repeat, decode_and_apply)
    index = apply_only()
    queries = [rng.choice(chains) + [rng.getrandbits(64)] for _ in range(args.queries)]
    t_match = best(args.repeat, lambda: [index.match(q) for q in queries])
    out = {
        "block_events": n_blocks,
        "batches": len(stream),
        "replicas": args.replicas,
        "apply_block_events_per_s": round(n_blocks / t_apply),
        "decode_and_apply_block_events_per_s": round(n_blocks / t_both),
        "match_us_per_query": round(t_match / len(queries) * 1e6, 2),
        "mean_query_blocks": round(sum(map(len, queries)) / len(queries), 1),
        "distinct_hashes_held": len(index),
        "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
