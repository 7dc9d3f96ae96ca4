"""Throughput of the cluster indexes: KV block events applied per second, one core.

A synthetic fleet publishing like vLLM: each replica prefills documents (random
tokens, ``--block-size`` tokens a block, chained hashes from prefixkv's hash chain
with a fleet seed) in chunks of 1 to 64 blocks (one ``BlockStored`` per chunk, parent =
the previous chunk's last block, token ids included), evicts single blocks (one
``BlockRemoved`` per hash, as vLLM) and now and then re-stores a block (a duplicate).
Batches of 1 to 4 events. The stream is generated first; then each index applies it
from decoded structs (and, separately, from msgpack payloads through the decoder),
best of ``--repeat`` runs on a fresh index. Block events = hashes in ``BlockStored``
plus hashes in ``BlockRemoved``. Then each index answers ``--queries`` prefix queries
of ``--query-blocks`` blocks.

    python benchmarks/cluster_index.py --block-events 500000 --replicas 8
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from array import array
from collections.abc import Callable

import msgspec

from prefixkv.adapters.events.codec import EventDecoder
from prefixkv.adapters.events.wire import BlockRemoved, BlockStored, KVEventBatch
from prefixkv.adapters.router.approx import ApproxIndex
from prefixkv.adapters.router.block_tree import RadixBlockIndex
from prefixkv.adapters.router.cluster_index import ChainedHashIndex, ClusterIndex
from prefixkv.adapters.router.keys import HashScheme, RouteKeys, Worker

Event = BlockStored | BlockRemoved


def make_stream(
    rng: random.Random, scheme: HashScheme, block_events: int, replicas: int, doc_blocks: int
) -> tuple[list[tuple[int, KVEventBatch]], list[array[int]]]:
    """``[(replica, batch)]`` of about ``block_events`` block events, and the documents."""
    bs = scheme.block_size
    docs: list[array[int]] = []
    doc_hashes: list[list[int]] = []
    stored: list[dict[int, int]] = [{} for _ in range(replicas)]  # doc -> blocks stored
    held: list[list[int]] = [[] for _ in range(replicas)]
    stream: list[tuple[int, KVEventBatch]] = []
    count = 0
    while count < block_events:
        r = rng.randrange(replicas)
        events: list[BlockStored | BlockRemoved] = []
        for _ in range(rng.randint(1, 4)):
            if held[r] and rng.random() < 0.35:
                h = held[r].pop(rng.randrange(len(held[r])))
                events.append(BlockRemoved([h], "GPU", group_idx=0))
                count += 1
                continue
            if not docs or rng.random() < 0.1:
                docs.append(array("I", (rng.randrange(1, 32000) for _ in range(doc_blocks * bs))))
                doc_hashes.append(scheme.block_hashes(docs[-1]))
            d = rng.randrange(len(docs))
            start = stored[r].get(d, 0)
            if start >= doc_blocks:
                start = rng.randrange(doc_blocks)  # a duplicate of a stored block
            end = min(doc_blocks, start + rng.randint(1, 64))
            hashes = doc_hashes[d][start:end]
            events.append(
                BlockStored(
                    hashes,
                    doc_hashes[d][start - 1] if start else None,
                    docs[d][start * bs : end * bs].tolist(),
                    bs,
                    None,
                    "GPU",
                    None,
                    group_idx=0,
                )
            )
            stored[r][d] = max(end, stored[r].get(d, 0))
            held[r].extend(hashes)
            count += len(hashes)
        stream.append((r, KVEventBatch(ts=0.0, events=list(events), data_parallel_rank=0)))
    return stream, docs


def best_of(repeat: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--block-events", type=int, default=500_000)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--doc-blocks", type=int, default=128)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--query-blocks", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    scheme = HashScheme.prefixkv(args.block_size, seed=0)
    stream, docs = make_stream(rng, scheme, args.block_events, args.replicas, args.doc_blocks)
    payloads = [(r, msgspec.msgpack.encode(b)) for r, b in stream]
    n_events = sum(
        len(e.block_hashes)
        for _, b in stream
        for e in b.events
        if isinstance(e, (BlockStored, BlockRemoved))
    )
    queries = []
    for _ in range(args.queries):
        doc = docs[rng.randrange(len(docs))]
        depth = rng.randrange(1, args.query_blocks + 1)
        tail = array(
            "I",
            (rng.randrange(1, 32000) for _ in range((args.query_blocks - depth) * args.block_size)),
        )
        tokens = doc[: depth * args.block_size] + tail
        queries.append(tokens)

    factories: dict[str, Callable[[], ClusterIndex]] = {
        "chained": lambda: ChainedHashIndex(scheme),
        "radix": lambda: RadixBlockIndex(scheme),
    }
    results = []
    for name, make in factories.items():

        def apply_structs(make: Callable[[], ClusterIndex] = make) -> float:
            idx = make()
            t0 = time.perf_counter()
            for r, b in stream:
                idx.apply(r, b, 0.0)
            return time.perf_counter() - t0

        def apply_payloads(make: Callable[[], ClusterIndex] = make) -> float:
            idx = make()
            decode = EventDecoder().decode
            t0 = time.perf_counter()
            for r, p in payloads:
                idx.apply(r, decode(p), 0.0)
            return time.perf_counter() - t0

        t_apply = best_of(args.repeat, apply_structs)
        t_decode = best_of(args.repeat, apply_payloads)
        idx = make()
        for r, b in stream:
            idx.apply(r, b, 0.0)
        keys = [RouteKeys(q, scheme) for q in queries]
        for k in keys:  # hashing is the router's, measured apart
            _ = k.local_hashes if name == "radix" else k.block_hashes
        lat = []
        for k in keys:
            t0 = time.perf_counter()
            idx.match(k, 0.0)
            lat.append(time.perf_counter() - t0)
        results.append(
            {
                "index": name,
                "block_events": n_events,
                "batches": len(stream),
                "replicas": args.replicas,
                "block_size": args.block_size,
                "apply_block_events_per_s": round(n_events / t_apply),
                "decode_and_apply_block_events_per_s": round(n_events / t_decode),
                "match_p50_us": round(statistics.median(lat) * 1e6, 1),
                "match_p99_us": round(sorted(lat)[int(0.99 * (len(lat) - 1))] * 1e6, 1),
                "query_blocks": args.query_blocks,
                "entries": idx.stats()["entries"],
            }
        )
    # The approximate index is written by decisions: one insert of a request's blocks.
    approx = ApproxIndex(ttl=120.0)
    keys = [RouteKeys(q, scheme) for q in queries]
    for k in keys:
        _ = k.block_hashes
    t0 = time.perf_counter()
    for i, k in enumerate(keys):
        approx.on_routed(Worker(i % args.replicas), k, float(i))
    t_ins = time.perf_counter() - t0
    results.append(
        {
            "index": "approx",
            "inserted_blocks_per_s": round(len(keys) * args.query_blocks / t_ins),
            "replicas": args.replicas,
            "block_size": args.block_size,
        }
    )
    for row in results:
        row.update(python=platform.python_version(), machine=platform.machine())
        print(json.dumps(row))


if __name__ == "__main__":
    main()
