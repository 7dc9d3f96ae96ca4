"""Sim-to-real: the arrival-time simulator against a running vLLM, request by request.

1. Start ``vllm serve`` (or use ``--url``): a native server, prefix caching on,
   ``--enable-prompt-tokens-details`` so each response says its cached tokens.
2. Calibrate a profile from it with ``prefixkv calibrate --server``'s sweep (prompt
   lengths x cached fractions one at a time, concurrent decode batches): one trace.
3. Replay a different trace (a built-in workload, token ids as prompts) at Poisson
   arrival times against the server, timing each request's TTFT from the client
   (after a warm-up burst, as ``vllm bench serve`` sends a test request first).
4. Simulate the same requests, sent at the same times, through a vLLM-style replica
   with the server's block size, pool, step budget and running-request limit, priced
   by the calibrated profile.
5. Per request: cached tokens (server's ``usage.prompt_tokens_details.cached_tokens``
   against the simulator's hit) and TTFT; the table gives p50 and p90 of both and
   the relative error, with the machine's load average before and after each run.

The server generates its own tokens (dummy weights), so the simulated requests decode
filler tokens of the trace's output lengths, not the trace's outputs: a later turn
that quotes an earlier answer misses those blocks on both sides.

    python benchmarks/sim_to_real.py \\
        --vllm VLLM_VENV/bin/vllm --model TINY_LLAMA_DIR \\
        --workload multi_turn --request-rate 4 --repeats 3 --calibrate-each --out sim-to-real

(``TINY_LLAMA_DIR``: a folder with a Llama ``config.json``; the weights are dummy.
The table, the command and the load are in benchmarks/README.md.)

Everything runs on 127.0.0.1; the server is stopped at the end (and on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefixkv.adapters.lab.sim import (
    CostProfile,
    SimConfig,
    SimRequest,
    load_profile,
    percentile,
    save_profile,
    simulate,
)
from prefixkv.adapters.lab.sim.arrivals import poisson_arrivals
from prefixkv.adapters.lab.sim.served import Completion, ServedEngine
from prefixkv.adapters.lab.sim.server_calibration import (
    ServerSweep,
    calibrate_server,
    client_machine,
)
from prefixkv.adapters.lab.workload_sources import load_workloads
from prefixkv.indexes import make_index
from prefixkv.indexes.tokens import as_token_array

# vLLM's CPU defaults for `vllm serve` (engine/arg_utils.py, get_batch_defaults).
CPU_MAX_NUM_BATCHED_TOKENS = 2048
CPU_MAX_NUM_SEQS = 128


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def vllm_server(vllm: str, model: str, log: Path, timeout_s: float) -> Iterator[str]:
    """A native ``vllm serve`` on 127.0.0.1, stopped (its process group) on exit."""
    import httpx

    port = free_port()
    cmd = [
        vllm, "serve", model, "--load-format", "dummy", "--skip-tokenizer-init",
        "--enforce-eager", "--block-size", "32", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "4096", "--enable-prompt-tokens-details",
    ]  # fmt: skip
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}; see {log}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve not up after {timeout_s:.0f} s; see {log}")
            time.sleep(2)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def load_average() -> float:
    return os.getloadavg()[0]


def trace(
    workload: str, max_requests: int, seed: int, salt: int, vocab: int
) -> list[tuple[str, list[int], int]]:
    """``(id, prompt, output length)`` of a built-in workload, token ids below ``vocab``,
    shifted by ``salt`` (the sharing is kept; nothing an earlier run cached hits)."""
    (w,) = load_workloads([workload], None, max_requests=max_requests, seed=seed, quiet=True)
    out = []
    for r in w.requests:
        prompt = [3 + ((t + salt) % (vocab - 3)) for t in r.tokens]  # 0-2: pad, BOS, EOS
        out.append((r.id, prompt, max(1, len(r.output))))
    return out


async def replay(
    url: str, model: str, requests: Sequence[tuple[str, list[int], int]], times: Sequence[float]
) -> tuple[list[float], list[Completion]]:
    """Send each request at its time (open loop); returns the send offsets and results."""
    engine = ServedEngine(url, model)
    async with engine.client() as client:
        await engine.info(client)
        # Warm up as vllm bench serve does with its test request, and open the
        # connections the replay will use, so neither is timed.
        warm = [[3 + (k * 7919 + i) % 31000 for i in range(16)] for k in range(32)]
        await asyncio.gather(*(engine.complete(client, p, 2) for p in warm))
        loop = asyncio.get_running_loop()
        start = loop.time()
        sent: list[float] = [0.0] * len(requests)

        async def one(k: int) -> Completion:
            delay = start + times[k] - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            sent[k] = loop.time() - start
            _, prompt, out = requests[k]
            return await engine.complete(client, prompt, out)

        done = await asyncio.gather(*(one(k) for k in range(len(requests))))
    return sent, list(done)


def predict(
    requests: Sequence[tuple[str, list[int], int]],
    sent: Sequence[float],
    profile: CostProfile,
    pool_tokens: int,
    block_size: int,
) -> list[tuple[int, float]]:
    """The simulator's ``(hit tokens, TTFT)`` per request, sent at the same times."""
    order = sorted(range(len(requests)), key=lambda k: sent[k])
    sims = [
        SimRequest(requests[k][0], as_token_array(requests[k][1]), requests[k][2], sent[k])
        for k in order
    ]
    cfg = SimConfig(
        max_num_seqs=CPU_MAX_NUM_SEQS, max_num_batched_tokens=CPU_MAX_NUM_BATCHED_TOKENS
    )
    res = simulate(sims, lambda: make_index("hash_chain", block_size), pool_tokens, cfg, profile)
    by_id = {m.request_id: (m.hit_tokens, m.ttft_s) for m in res.requests}
    return [by_id[r[0]] for r in requests]


def compare_run(
    requests: Sequence[tuple[str, list[int], int]],
    sent: Sequence[float],
    done: Sequence[Completion],
    predicted: Sequence[tuple[int, float]],
) -> dict[str, Any]:
    measured = [c.ttft_s for c in done]
    sim = [t for _, t in predicted]
    exact = sum(c.cached_tokens == h for c, (h, _) in zip(done, predicted, strict=True))
    row: dict[str, Any] = {
        "requests": len(requests),
        "cached_exact": exact,
        "cached_server": sum(c.cached_tokens or 0 for c in done),
        "cached_sim": sum(h for h, _ in predicted),
        "prompt_tokens": sum(len(r[1]) for r in requests),
    }
    for q in (50, 90):
        m, p = percentile(measured, q), percentile(sim, q)
        row[f"ttft_p{q}_measured_s"] = m
        row[f"ttft_p{q}_sim_s"] = p
        row[f"ttft_p{q}_error"] = (p - m) / m
    errors = sorted(abs(p - m) / m for m, p in zip(measured, sim, strict=True))
    row["per_request_abs_error_p50"] = percentile(errors, 50)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--vllm", help="the vllm executable to start a server with")
    src.add_argument("--url", help="use this running server instead")
    ap.add_argument("--model", default="tiny-llama", help="the model folder (with --vllm)")
    ap.add_argument("--workload", default="multi_turn", help="the built-in workload to predict")
    ap.add_argument("--max-requests", type=int, default=165)
    ap.add_argument("--request-rate", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3, help="replays (fresh token ids each)")
    ap.add_argument("--profile", help="use this profile instead of calibrating")
    ap.add_argument("--sweep-repeats", type=int, default=3)
    ap.add_argument(
        "--calibrate-each",
        action="store_true",
        help="calibrate again right before each replay (the machine's load drifts between "
        "runs on a shared machine; each run is then predicted from a profile measured under "
        "the load of its own minute)",
    )
    ap.add_argument("--out", default="sim-to-real", help="output folder")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    if args.url:
        return run(args, args.url, out)
    with vllm_server(args.vllm, args.model, log, args.start_timeout) as url:
        return run(args, url, out)


def run(args: argparse.Namespace, url: str, out: Path) -> int:
    import httpx

    info = asyncio.run(_info(url))
    print(f"server {url}: {info.model}, vLLM {info.engine_version}, block size "
          f"{info.block_size}, {info.num_gpu_blocks:,} blocks", flush=True)  # fmt: skip
    load0 = load_average()
    if args.profile:
        profile = load_profile(args.profile)
    else:
        sweep = ServerSweep(
            repeats=args.sweep_repeats, max_num_batched_tokens=CPU_MAX_NUM_BATCHED_TOKENS
        )
        profile = calibrate_server(url, sweep=sweep, name="vllm-cpu-tiny-llama")
        save_profile(profile, out / "profile.json")
    cal = {"load_before": load0, "load_after": load_average(), "fit": dict(profile.fit)}
    print(f"profile {profile.name}: request_s {profile.request_s * 1e3:.2f} ms, step_s "
          f"{profile.step_s * 1e3:.2f} ms; load {load0:.2f} -> {cal['load_after']:.2f}",
          flush=True)  # fmt: skip
    rows = []
    salt = int.from_bytes(os.urandom(4), "little")
    for k in range(args.repeats):
        if args.calibrate_each and k and not args.profile:
            profile = calibrate_server(url, sweep=sweep, name="vllm-cpu-tiny-llama")
            save_profile(profile, out / f"profile-{k + 1}.json")
        requests = trace(args.workload, args.max_requests, k, salt + k, 32000)
        gen = poisson_arrivals(args.request_rate, seed=k)
        times = [next(gen) for _ in requests]
        before = load_average()
        sent, done = asyncio.run(replay(url, info.model, requests, times))
        after = load_average()
        predicted = predict(requests, sent, profile, info.kv_cache_tokens, info.block_size)
        row = {"run": k + 1, "salt": salt + k, "load_before": before, "load_after": after,
               **compare_run(requests, sent, done, predicted)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
        with (out / f"requests-{k + 1}.jsonl").open("w") as f:
            for r, s, c, (h, t) in zip(requests, sent, done, predicted, strict=True):
                f.write(json.dumps({"id": r[0], "prompt": len(r[1]), "output": r[2], "sent_s": s,
                                    "ttft_s": c.ttft_s, "cached": c.cached_tokens,
                                    "sim_hit": h, "sim_ttft_s": t}) + "\n")  # fmt: skip
    table = markdown(rows)
    print(table)
    doc = {"server": url, "model": info.model, "engine_version": info.engine_version,
           "machine": client_machine(), "command": " ".join(sys.argv), "calibration": cal,
           "profile": profile.to_dict(), "runs": rows, "httpx": httpx.__version__}  # fmt: skip
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "table.md").write_text(table + "\n")
    return 0


async def _info(url: str) -> Any:
    engine = ServedEngine(url)
    async with engine.client() as client:
        return await engine.info(client)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    head = ("| run | load (1 min) | requests | cached tokens exact | TTFT p50 measured / sim "
            "| error | TTFT p90 measured / sim | error |")  # fmt: skip
    lines = [head, "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['load_before']:.2f} -> {r['load_after']:.2f} | {r['requests']} "
            f"| {r['cached_exact']}/{r['requests']} "
            f"| {r['ttft_p50_measured_s'] * 1e3:.1f} / {r['ttft_p50_sim_s'] * 1e3:.1f} ms "
            f"| {r['ttft_p50_error']:+.1%} "
            f"| {r['ttft_p90_measured_s'] * 1e3:.1f} / {r['ttft_p90_sim_s'] * 1e3:.1f} ms "
            f"| {r['ttft_p90_error']:+.1%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
