"""Arrival-time replay of a Mooncake trace through one simulated replica, per backend.

Mooncake's traces (FAST'25, github.com/kvcache-ai/Mooncake, ``traces/``) give each
request a timestamp (ms), ``input_length``, ``output_length`` and the ids of its
512-token blocks; equal ids are equal content. Each id becomes a fixed block of
distinct token ids here, so prefixes are shared exactly as the trace says. Requests
arrive at the trace's timestamps stretched by ``--time-scale``, or at a Poisson
``--request-rate``; each step costs what the cost profile says (default: Llama-2-70B
on two A100s, from Vidur's profiling data). Prints TTFT and cache figures per
backend (and capacity, when several are given); ``--out DIR`` also writes the tidy
tables, the TTFT CDF at the largest capacity and the capacity sweep.

    python benchmarks/sim_mooncake.py TRACE.jsonl --max-requests 1000 --time-scale 10
    python benchmarks/sim_mooncake.py TRACE.jsonl --max-requests 1000 --request-rate 0.3 \\
        --backends hash_chain:16,radix:1 --capacity-tokens 65536,262144,1048576 --out sim-out
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

from prefixkv.adapters.lab.sim import (
    DEFAULT_PROFILE,
    SimConfig,
    SimResult,
    TimedRequest,
    load_profile,
    plot_capacity_sweep,
    plot_ttft_cdf,
    run_rows,
    simulate,
    with_arrivals,
    write_tables,
)
from prefixkv.indexes import make_index

MOONCAKE_BLOCK = 512


def read_mooncake(
    path: Path, *, max_requests: int | None, block: int, max_prompt: int | None
) -> tuple[list[TimedRequest], int]:
    """The trace's requests (arrival = timestamp in seconds) and how many were skipped.

    Block id ``h`` is the tokens ``h * block + 1 ..``: distinct ids never share a token.
    With ``block < 512`` every 512-token block shrinks to ``block`` tokens (the last,
    partial one in proportion) and outputs shrink alike, keeping the sharing pattern.
    """
    out: list[TimedRequest] = []
    skipped = 0
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            rec = json.loads(line)
            ids: list[int] = rec["hash_ids"]
            partial = rec["input_length"] - MOONCAKE_BLOCK * (len(ids) - 1)
            last = -(-partial * block // MOONCAKE_BLOCK)
            prompt = array("I")
            for k, h in enumerate(ids):
                n = block if k < len(ids) - 1 else last
                prompt.extend(range(h * block + 1, h * block + 1 + n))
            if max_prompt is not None and len(prompt) > max_prompt:
                skipped += 1
                continue
            output = max(1, -(-rec["output_length"] * block // MOONCAKE_BLOCK))
            out.append(TimedRequest(f"mc-{lineno}", prompt, output, rec["timestamp"] / 1000))
            if len(out) == max_requests:
                break
    return out, skipped


def backends(text: str) -> list[tuple[str, int]]:
    """``"hash_chain:16,radix:1"`` -> ``[("hash_chain", 16), ("radix", 1)]``."""
    out = []
    for part in text.split(","):
        name, _, size = part.strip().partition(":")
        out.append((name, int(size) if size else (1 if name == "radix" else 16)))
    return out


def arrivals(args: argparse.Namespace, reqs: list[TimedRequest]) -> Iterator[TimedRequest]:
    """The requests stamped by the chosen arrival process."""
    if args.request_rate is not None:
        return with_arrivals(reqs, request_rate=args.request_rate, seed=args.seed)
    return with_arrivals(reqs, time_scale=args.time_scale)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every backend and print one line each."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("trace", type=Path, help="a Mooncake JSONL trace")
    ap.add_argument("--max-requests", type=int, default=1000)
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--request-rate", type=float, help="Poisson arrivals, requests/s")
    how.add_argument("--time-scale", type=float, default=1.0, help="x trace time (>1 slower)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backends", default="hash_chain:16,radix:1")
    ap.add_argument(
        "--capacity-tokens",
        default=str(1 << 18),
        help="KV pool in tokens; a comma-separated list sweeps it (and plots the sweep)",
    )
    ap.add_argument("--scale-block", type=int, default=MOONCAKE_BLOCK, help="tokens per block")
    ap.add_argument("--max-prompt-tokens", type=int, help="skip longer prompts")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--policy", choices=("fcfs", "lpm"), default="fcfs")
    ap.add_argument("--batching", choices=("mixed", "prefill_first"), default="mixed")
    ap.add_argument("--profile", default=DEFAULT_PROFILE, help="a shipped name or a file")
    ap.add_argument("--out", type=Path, help="write the tables and plots here")
    args = ap.parse_args(argv)

    reqs, skipped = read_mooncake(
        args.trace,
        max_requests=args.max_requests,
        block=args.scale_block,
        max_prompt=args.max_prompt_tokens,
    )
    profile = load_profile(args.profile)
    config = SimConfig(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        policy=args.policy,
        batching=args.batching,
    )
    timing = (
        f"Poisson {args.request_rate}/s (seed {args.seed})"
        if args.request_rate is not None
        else f"trace timestamps x {args.time_scale}"
    )
    prompt_tokens = sum(len(r.prompt) for r in reqs)
    capacities = [int(c) for c in args.capacity_tokens.split(",")]
    print(
        f"{args.trace.name}: {len(reqs)} requests ({skipped} skipped), {prompt_tokens} prompt "
        f"tokens; arrivals: {timing}; {config.batching} batching, {config.policy}, "
        f"max_num_seqs {config.max_num_seqs}, max_num_batched_tokens "
        f"{config.max_num_batched_tokens}; profile {profile.name} ({profile.device})"
    )
    header = (
        f"{'capacity':>9} {'backend':<14}{'hit ratio':>10}{'TTFT p50':>10}{'p90':>9}{'p99':>9}"
        f"{'queue mean':>11}{'E2E p50':>9}{'req/s':>7}{'prefill GPU-s':>15}"
        f"{'saved':>8}{'evicted':>9}{'preempt':>8}{'sim s':>7}"
    )
    print(header)
    results: list[SimResult] = []
    for capacity, (name, size) in itertools.product(capacities, backends(args.backends)):
        label = f"{name}:{size}"
        t0 = time.perf_counter()
        res = simulate(
            arrivals(args, reqs),
            lambda name=name, size=size: make_index(name, size),
            capacity,
            config,
            profile,
            labels={"backend": label, "trace": args.trace.name, "arrivals": timing},
        )
        wall = time.perf_counter() - t0
        results.append(res)
        r = res.run
        print(
            f"{capacity:>9} {label:<14}{r.hit_ratio:>10.3f}{r.ttft_p50_s:>10.3f}"
            f"{r.ttft_p90_s:>9.3f}{r.ttft_p99_s:>9.3f}{r.queueing_mean_s:>11.3f}{r.e2e_p50_s:>9.2f}"
            f"{r.request_throughput:>7.3f}{r.prefill_gpu_s:>15.1f}{r.saved_gpu_s:>8.1f}"
            f"{r.evicted_blocks:>9}{r.num_preemptions:>8}{wall:>7.1f}"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        files = write_tables(results, args.out)
        largest = [r for r in results if r.labels["capacity_tokens"] == max(capacities)]
        files.append(plot_ttft_cdf(largest, args.out / "ttft_cdf.png"))
        if len(capacities) > 1:
            files.append(plot_capacity_sweep(run_rows(results), args.out / "capacity.png"))
        print("wrote", ", ".join(str(f) for f in files))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
