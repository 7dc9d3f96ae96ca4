#!/usr/bin/env python3
"""prefixkv inside a serving vLLM, against vLLM's own prefix cache, on one machine's CPU.

Starts ``vllm serve`` (a tiny Llama, random weights from ``tiny_llama.py`` unless
``--model`` names another) once per configuration -- native
prefix caching, prefixkv's hash chain, prefixkv's radix tree -- each with a small pool
(eviction), chunked prefill and KV events on ZeroMQ, and sends the same requests:

1. sequential, shared prefixes (an 800-token prompt twice, a 300-token overlap, a
   longer follow-up, a multi-turn continuation): cached tokens per request, greedy
   output ids, ``/metrics`` prefix-cache counters and the KV events' payloads;
2. a concurrent burst larger than the pool (preemption): every request completes.

    python tests/serve/harness/smoke.py --vllm VENV/bin/vllm [--model MODEL_DIR] --out smoke.json

A ``--model`` folder with only a ``config.json`` is served with ``--load-format dummy``
(vLLM's weights, uniform in +-1e-3): it serves, but its greedy outputs hardly depend on
the context, so "outputs == native" then says little about the KV a hit hands out.

Exit 0 when the hash chain equals native request for request (cached tokens, outputs,
counters, events) and the radix tree caches at least as much; the JSON has it all.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
from tiny_llama import write_model_with
from vllm_server import KVEventTap, ServeConfig, VLLMServer, free_port

COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)


def token_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 31999) for _ in range(n)]


def sequential(server: VLLMServer) -> list[dict[str, Any]]:
    """The shared-prefix requests, one at a time (each finishes before the next)."""
    a = token_ids(800, 1)
    out: list[dict[str, Any]] = []

    def send(name: str, prompt: list[int], max_tokens: int = 8) -> list[int]:
        c = server.complete(prompt, max_tokens)
        out.append({"request": name, "prompt_tokens": c.prompt_tokens,
                    "cached_tokens": c.cached_tokens, "output": c.token_ids})  # fmt: skip
        return c.token_ids

    first = send("A (800 tokens)", a)
    send("A again", a)
    send("B = A[:300] + 300 new", a[:300] + token_ids(300, 2))
    send("C = A + 100 new", a + token_ids(100, 3))
    send("A + its output + 50 new (next turn)", a + first + token_ids(50, 4))
    send("D (900 new: evicts)", token_ids(900, 5))
    send("A after D", a)
    return out


def burst(server: VLLMServer, n: int = 6) -> list[dict[str, Any]]:
    """``n`` requests at once sharing a prefix, together larger than the pool: decode
    outgrows it and requests are preempted (and resumed from the cache)."""
    shared = token_ids(256, 100)
    prompts = [shared + token_ids(240, 200 + i) for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        done = list(pool.map(lambda p: server.complete(p, 320), prompts))
    return [{"request": f"burst {i}", "output": c.token_ids} for i, c in enumerate(done)]


def events_only(frames: list[tuple[int, bytes]]) -> list[bytes]:
    """Each batch's events, re-encoded without the batch's timestamp."""
    return [msgspec.msgpack.encode(msgspec.msgpack.decode(p)[1]) for _, p in frames]


def run(config: ServeConfig, logs: Path) -> dict[str, Any]:
    port = free_port()
    config.kv_events_port = port
    tap = KVEventTap(port)
    try:
        with VLLMServer(config, logs) as server:
            t0 = time.monotonic()
            seq = sequential(server)
            metrics = server.metrics()
            time.sleep(1.0)  # the publisher's thread sends the last step's batch
            frames = list(tap.frames)
            pressure = burst(server)
            after = server.metrics()
            prefixkv = server.log_lines("prefixkv:")
            return {
                "config": config.label,
                "start_seconds": round(server.start_seconds, 1),
                "requests_seconds": round(time.monotonic() - t0, 1),
                "sequential": seq,
                "metrics": {k: metrics.get(k) for k in COUNTERS},
                "kv_event_batches": len(frames),
                "kv_events": sum(len(msgspec.msgpack.decode(p)[1]) for _, p in frames),
                "_events": events_only(frames),
                "burst": pressure,
                "metrics_after_burst": {k: after.get(k) for k in COUNTERS},
                "prefixkv_log": prefixkv[-1:] if prefixkv else [],
            }
    finally:
        tap.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="the vllm executable to serve with")
    ap.add_argument("--model", help="model directory (default: the random-weight tiny Llama)")
    ap.add_argument("--out", default="serve-smoke.json")
    ap.add_argument("--logs", default="serve-logs")
    ap.add_argument("--configs", default="native,hash_chain,radix")
    ap.add_argument("--num-gpu-blocks", type=int, default=65, help="the pool, null block incl.")
    ap.add_argument("--serve-arg", action="append", default=[], help="more vllm serve args")
    args = ap.parse_args(argv)
    if args.model is None:  # written by the serving environment (torch, safetensors)
        args.model = str(write_model_with(args.vllm, Path(args.logs).resolve() / "tiny-llama"))
    weights = any(Path(args.model).glob("*.safetensors"))
    results = []
    for label in args.configs.split(","):
        config = ServeConfig(
            vllm=args.vllm,
            model=args.model,
            load_format="auto" if weights else "dummy",
            index=None if label == "native" else label,
            num_gpu_blocks=args.num_gpu_blocks,
            hash_algo="sha256_cbor",
            extra_args=("--max-num-batched-tokens", "256", "--max-num-seqs", "4", *args.serve_arg),
        )
        print(f"serving {label} ...", flush=True)
        results.append(run(config, Path(args.logs)))
        r = results[-1]
        print(f"  up in {r['start_seconds']} s; cached",
              [x["cached_tokens"] for x in r["sequential"]], r["metrics"], flush=True)  # fmt: skip
    by = {r["config"]: r for r in results}
    checks: dict[str, bool] = {}
    native = by.get("native")
    for label, r in by.items():
        if native is None or r is native:
            continue
        cached = [x["cached_tokens"] for x in r["sequential"]]
        want = [x["cached_tokens"] for x in native["sequential"]]
        same_out = [x["output"] for x in r["sequential"]] == [
            x["output"] for x in native["sequential"]
        ]
        if label == "hash_chain":
            checks["hash_chain cached == native"] = cached == want
            checks["hash_chain metrics == native"] = r["metrics"] == native["metrics"]
            checks["hash_chain events == native (bytes)"] = r["_events"] == native["_events"]
        else:
            more = all(c >= w for c, w in zip(cached, want, strict=True))
            checks[f"{label} cached >= native"] = more
        checks[f"{label} outputs == native"] = same_out
        checks[f"{label} burst completed"] = len(r["burst"]) == len(native["burst"])
    for r in results:
        r.pop("_events")
    Path(args.out).write_text(json.dumps({"results": results, "checks": checks}, indent=1))
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
