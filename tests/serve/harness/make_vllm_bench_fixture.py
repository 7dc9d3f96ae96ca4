"""Write a ``vllm bench serve --save-result --save-detailed --append-result`` results
file from a running server, for ``tests/data/vllm_bench/``.

``vllm bench serve`` needs a tokenizer for every dataset that sends token ids, and the
tiny dummy-weight model has none, so this sends the requests itself (the same
streamed ``/v1/completions``, timed the same way: ``start_times`` from
``time.perf_counter``, TTFT to the first streamed token, the gaps after it) and writes
the document with exactly the keys vLLM's ``benchmarks/serve.py`` (0.32) writes:
setup (``date`` ``%Y%m%d-%H%M%S``, ``backend``, ``model_id``, ``num_prompts``,
``request_rate`` ``"inf"``, ``burstiness``, ``max_concurrency``), the run's totals and
``mean/median/std/p99_{ttft,tpot,itl}_ms``, and the per-request lists (``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``,
``generated_texts``, ``errors``). Two runs are appended, one a line: one request at a
time (``--max-concurrency 1``) over varied prompt lengths, then four at a time.

    python tests/serve/harness/make_vllm_bench_fixture.py --url http://127.0.0.1:8000 \\
        --out tests/data/vllm_bench/tiny-llama-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from prefixkv.adapters.lab.sim.served import Completion, ServedEngine


async def run(
    engine: ServedEngine, prompts: Sequence[list[int]], output_len: int, concurrency: int
) -> tuple[list[Completion], float]:
    async with engine.client() as client:
        await engine.info(client)
        gate = asyncio.Semaphore(concurrency)

        async def one(p: list[int]) -> Completion:
            async with gate:
                return await engine.complete(client, p, output_len)

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        done = await asyncio.gather(*(one(p) for p in prompts))
        return list(done), loop.time() - t0


def document(
    model: str, done: Sequence[Completion], duration: float, concurrency: int
) -> dict[str, Any]:
    ttfts = [c.ttft_s for c in done]
    itls = [g for c in done for g in c.itl_s]
    tpots = [math_mean(c.itl_s) for c in done if c.itl_s]
    out_lens = [c.completion_tokens for c in done]
    total_in = sum(c.prompt_tokens for c in done)
    doc: dict[str, Any] = {
        "date": datetime.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": model,
        "tokenizer_id": None,
        "num_prompts": len(done),
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": concurrency,
        "duration": duration,
        "completed": len(done),
        "failed": 0,
        "total_input_tokens": total_in,
        "total_output_tokens": sum(out_lens),
        "request_throughput": len(done) / duration,
        "request_goodput": None,
        "output_throughput": sum(out_lens) / duration,
        "total_token_throughput": (total_in + sum(out_lens)) / duration,
        "input_lens": [c.prompt_tokens for c in done],
        "output_lens": out_lens,
        "ttfts": ttfts,
        "itls": [c.itl_s for c in done],
        "latencies": [c.latency_s for c in done],
        "start_times": [c.sent_s for c in done],
        "generated_texts": ["" for _ in done],
        "errors": ["" for _ in done],
        "max_output_tokens_per_s": 0.0,
        "max_concurrent_requests": concurrency,
        "rtfx": 0.0,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls)):
        doc[f"mean_{name}_ms"] = float(np.mean(values or 0)) * 1000
        doc[f"median_{name}_ms"] = float(np.median(values or 0)) * 1000
        doc[f"std_{name}_ms"] = float(np.std(values or 0)) * 1000
        doc[f"p99_{name}_ms"] = float(np.percentile(values or 0, 99)) * 1000
    return doc


def math_mean(values: Sequence[float]) -> float:
    return statistics.fmean(values)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=None, help="token ids' seed (default: fresh)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(3, 32000) for _ in range(n)]

    engine = ServedEngine(args.url)
    alone = [fresh(n) for n in (32, 96, 200, 384, 512, 768, 1024, 1536, 64, 256, 640, 1280)]
    burst = [fresh(n) for n in (128, 256, 384, 512) * 4]
    docs = []
    for prompts, output_len, concurrency in ((alone, 8, 1), (burst, 16, 4)):
        done, duration = asyncio.run(run(engine, prompts, output_len, concurrency))
        docs.append(document(str(engine.model), done, duration, concurrency))
    with open(args.out, "w", encoding="utf-8") as f:
        for k, doc in enumerate(docs):
            if k:
                f.write("\n")  # as --append-result separates runs
            json.dump(doc, f)
    print(f"wrote {len(docs)} runs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
