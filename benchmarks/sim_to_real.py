"""Sim-to-real: the arrival-time simulator against a running vLLM, over a rate sweep.

1. Start ``vllm serve`` (or use ``--url``): a native server, prefix caching on,
   ``--enable-prompt-tokens-details`` so each response says its cached tokens.
2. Calibrate a profile from it with ``prefixkv calibrate --server``'s sweep (prompt
   lengths x cached fractions one at a time, concurrent decode batches, and the
   serving path timed apart from both ends: client and the server's ``/metrics``).
3. For each offered rate, light to past saturation, replay a different trace (a
   built-in workload, token ids as prompts) ``--repeats`` times at Poisson arrival
   times against the server, timing each request from the client (after a warm-up
   burst, as ``vllm bench serve`` sends a test request first).
4. Simulate the same requests, sent at the same times, through a vLLM-style replica
   with the server's block size, pool, step budget and running-request limit, priced
   by the calibrated profile: each request spends a time outside the engine drawn from
   the calibration's spread for a server idle or busy when it was sent (the busy one
   from streams sent while another streams), each step runs at the engine's pace of
   its moment (drawn from the calibration's lone decodes), and the step that starts a
   request pays for taking it in (``admit_s``; adapters/lab's README, "How the
   simulator prices the serving path").
5. One table line a rate: offered and served rate, the simulated utilization, the
   machine's 1-minute load over its runs, cached tokens (server against simulator),
   TTFT and TPOT p50/p90 (requests pooled over the runs) and output throughput,
   measured and simulated side by side, and a verdict: saturated (where queues grow
   and no steady-state figure exists), else for TTFT and TPOT "within 10%" or off,
   which, and why as far as the recording shows (``sim_to_real_verdict.py``; on a CPU
   vLLM whose worker is bound to cores, its busy tail is named as the shm queue
   busy-wait ``tests/serve/harness/serving_hops.py`` measured). Requests
   the client itself stalled on (sent late, or their tokens read in one burst: the
   load generator shares the machine with the server) are counted and left out.

The server generates its own tokens (dummy weights), so the simulated requests decode
filler tokens of the trace's output lengths, not the trace's outputs: a later turn
that quotes an earlier answer misses those blocks on both sides.

    python benchmarks/sim_to_real.py \\
        --vllm VLLM_VENV/bin/vllm --model tests/serve/harness/tiny-llama \\
        --workload multi_turn --request-rates 0.5,1,2,4,8,16 --repeats 3 --out sim-to-real

(The weights are dummy. Measure on a quiet machine: the table records the load. The
table, the command and the load are in benchmarks/README.md.) On a 2-core CPU the
calibration is not repeatable: rounds minutes apart fit ``step_s`` up to twice apart.
``--calibrate-each`` calibrates again before each rate (about 80 s each with the
default sweep) and ``--pool`` predicts every rate again from all of them pooled
(``OUT/pooled``; each shape's median over the rounds, an outlier round dropped:
``calibration_rounds.py``); a verdict whose TPOT is off the same way as its TTFT says
the server drifted. Within 18 minutes on 2 cores::

    python benchmarks/sim_to_real.py \\
        --vllm VLLM_VENV/bin/vllm --model tests/serve/harness/tiny-llama \\
        --workload multi_turn --request-rates 0.5,1,2,4,8 --repeats 2 --max-requests 80 \\
        --calibrate-each --pool --out sim-to-real

A recorded sweep (an ``--out`` folder) is predicted again with no server, after the
model or its profile changed: the same requests, rebuilt from their seeds, sent at the
recorded times, against the recorded measurements (``--refit``: the profile fitted
again from the calibration samples it keeps; ``--profile``: another one)::

    python benchmarks/sim_to_real.py --resimulate sim-to-real --out sim-to-real-again

Everything runs on 127.0.0.1; the server is stopped at the end (and on Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sim_to_real_verdict import BURST_STALL, busy_at_send, busy_waits, verdict

from prefixkv.adapters.lab.sim import (
    CostProfile,
    ProfileError,
    SimRequest,
    SimSettings,
    load_profile,
    percentile,
    save_profile,
    simulate,
)
from prefixkv.adapters.lab.sim.arrivals import poisson_arrivals
from prefixkv.adapters.lab.sim.calibration_rounds import pool_rounds
from prefixkv.adapters.lab.sim.served import Completion, ServedEngine
from prefixkv.adapters.lab.sim.server_calibration import (
    QUICK_SWEEP,
    ServerSweep,
    calibrate_server,
    client_machine,
    refit_server_profile,
)
from prefixkv.adapters.lab.sim.serving_spread import BURST_TPOT_S
from prefixkv.adapters.lab.workloads import load_workloads
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
) -> tuple[list[tuple[int, float, float]], float, float]:
    """The simulator's ``(hit tokens, TTFT, TPOT)`` per request, sent at the same times,
    and its run's utilization (step seconds over the run) and output tokens a second."""
    order = sorted(range(len(requests)), key=lambda k: sent[k])
    sims = [
        SimRequest(requests[k][0], as_token_array(requests[k][1]), requests[k][2], sent[k])
        for k in order
    ]
    cfg = SimSettings(
        max_num_seqs=CPU_MAX_NUM_SEQS, max_num_batched_tokens=CPU_MAX_NUM_BATCHED_TOKENS
    )
    res = simulate(sims, lambda: make_index("hash_chain", block_size), pool_tokens, cfg, profile)
    by_id = {m.request_id: (m.hit_tokens, m.ttft_s, m.tpot_s) for m in res.requests}
    run = res.run
    utilization = run.busy_s / run.duration_s if run.duration_s > 0 else math.nan
    return [by_id[r[0]] for r in requests], utilization, run.output_throughput


class Measured(NamedTuple):
    """One request as the client measured it (what a recording keeps of it)."""

    ttft_s: float
    tpot_s: float
    latency_s: float
    tokens: int
    cached: int | None
    chunks: int = 0
    """Streamed chunks that held tokens (0: not recorded; a server that falls behind
    may merge several tokens into one chunk)."""

    @classmethod
    def of(cls, c: Completion) -> Measured:
        """A completion's figures; TPOT is the mean seconds per output token after the
        first (NaN for one token)."""
        n = c.completion_tokens
        tpot = (c.latency_s - c.ttft_s) / (n - 1) if n > 1 else math.nan
        return cls(c.ttft_s, tpot, c.latency_s, n, c.cached_tokens, len(c.itl_s) + 1)


CLIENT_LATE_S = 0.02
"""A request sent this much after its arrival time was sent by a stalled client."""


def client_stalled(scheduled: float, sent: float, measured: Measured) -> bool:
    """Whether the client, not the server, timed this request late: it was sent over
    :data:`CLIENT_LATE_S` after its arrival time, or its tokens were read in one burst
    (:data:`BURST_TPOT_S`). The load generator shares the machine with the server; its
    stalls are no server's time, and no server model predicts them. A server that
    merged a stream's tokens into one chunk sent no burst: that is its own time."""
    return sent - scheduled > CLIENT_LATE_S or read_in_burst(measured)


def read_in_burst(measured: Measured) -> bool:
    """Whether the request's tokens reached the client in one burst
    (:data:`BURST_TPOT_S`). On a CPU vLLM whose engine core and worker busy-wait
    (``sim_to_real_verdict.BUSY_WAIT``) such bursts all but went when the busy-wait
    napped instead, the client unchanged: there they are mostly the server's stall."""
    gaps = (measured.chunks or measured.tokens) - 1
    return gaps > 0 and (measured.latency_s - measured.ttft_s) / gaps < BURST_TPOT_S


def compare_run(
    requests: Sequence[tuple[str, list[int], int]],
    scheduled: Sequence[float],
    sent: Sequence[float],
    done: Sequence[Measured],
    predicted: Sequence[tuple[int, float, float]],
) -> dict[str, Any]:
    """One replay against its prediction: the cached tokens, and per request the
    measured and simulated TTFT and TPOT, whether the client stalled on it and whether
    another request was running when it was sent (the rate's table pools them over
    runs)."""
    first = min(sent)
    last = max(s + c.latency_s for s, c in zip(sent, done, strict=True))
    duration = last - first
    return {
        "requests": len(requests),
        "cached_exact": sum(c.cached == h for c, (h, _, _) in zip(done, predicted, strict=True)),
        "cached_server": sum(c.cached or 0 for c in done),
        "cached_sim": sum(h for h, _, _ in predicted),
        "prompt_tokens": sum(len(r[1]) for r in requests),
        "achieved_rps": len(done) / duration if duration > 0 else math.nan,
        "throughput_measured": sum(c.tokens for c in done) / duration
        if duration > 0 else math.nan,
        "ttft_measured": [c.ttft_s for c in done],
        "ttft_sim": [t for _, t, _ in predicted],
        "tpot_measured": [c.tpot_s for c in done],
        "tpot_sim": [t for _, _, t in predicted],
        "client_stalled": [
            client_stalled(a, s, c) for a, s, c in zip(scheduled, sent, done, strict=True)
        ],
        "read_in_burst": [read_in_burst(c) for c in done],
        "busy": busy_at_send(sent, [c.latency_s for c in done]),
    }  # fmt: skip


SATURATED_UTILIZATION = 0.9
"""A run whose simulated engine is busy this share of the time (or whose server
served under 90% of the offered rate) is at or past saturation: queues grow."""


def _pct(values: Sequence[float], q: int) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return percentile(finite, q) if finite else math.nan


def _error(measured: float, sim: float) -> float:
    return (sim - measured) / measured if measured > 0 else math.nan


def summarize_rate(rate: float, runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One offered rate over its runs: per-request values pooled for the percentiles,
    the runs' medians for rates and utilization, their loads' range, and a verdict.

    The verdict is ``saturated`` when the simulated utilization reaches
    :data:`SATURATED_UTILIZATION` or the server served under 90% of the offered rate,
    else, for TTFT and for TPOT, ``within 10%`` when its p50 and p90 errors are, or
    ``off``, which, and why as far as the recording shows
    (:func:`sim_to_real_verdict.verdict`).
    """

    def kept(r: dict[str, Any], key: str) -> list[float]:
        stalled = r.get("client_stalled") or [False] * len(r[key])
        return [v for v, bad in zip(r[key], stalled, strict=True) if not bad]

    for r in runs:  # recorded before it was kept: from the send times and latencies
        r.setdefault("busy", [False] * len(r["ttft_measured"]))
    pooled = {
        key: [v for r in runs for v in kept(r, key)]
        for key in ("ttft_measured", "ttft_sim", "tpot_measured", "tpot_sim", "busy")
    }
    stalls = sum(sum(r.get("client_stalled", ())) for r in runs)
    bursts = sum(sum(r.get("read_in_burst", ())) for r in runs)
    row: dict[str, Any] = {
        "rate": rate,
        "runs": len(runs),
        "requests": sum(r["requests"] for r in runs),
        "cached_exact": sum(r["cached_exact"] for r in runs),
        "client_stalls": stalls,
        "client_bursts": bursts,
        "load_min": min(min(r["load_before"], r["load_after"]) for r in runs),
        "load_max": max(max(r["load_before"], r["load_after"]) for r in runs),
        "achieved_rps": statistics.median(r["achieved_rps"] for r in runs),
        "utilization_sim": statistics.median(r["utilization_sim"] for r in runs),
        "throughput_measured": statistics.median(r["throughput_measured"] for r in runs),
        "throughput_sim": statistics.median(r["throughput_sim"] for r in runs),
        **_busy_probe_of(runs),
    }
    for metric in ("ttft", "tpot"):
        for q in (50, 90):
            m = _pct(pooled[f"{metric}_measured"], q)
            p = _pct(pooled[f"{metric}_sim"], q)
            row[f"{metric}_p{q}_measured_s"], row[f"{metric}_p{q}_sim_s"] = m, p
            row[f"{metric}_p{q}_error"] = _error(m, p)
    served = row["achieved_rps"] / rate if rate > 0 else math.nan
    if row["utilization_sim"] >= SATURATED_UTILIZATION or served < 0.9:
        row["verdict"] = (
            f"saturated (sim busy {row['utilization_sim']:.0%}, served {served:.0%} of offered)"
        )
    else:
        row["verdict"] = verdict(row, pooled)
    if stalls:
        row["verdict"] += f"; client stalled on {stalls} (left out)"
        if bursts and row["busy_wait"] and BURST_STALL not in row["verdict"]:
            row["verdict"] += f"; {bursts} of them read in one burst, {BURST_STALL}"
    return row


def busy_probe(profile: CostProfile) -> dict[str, Any]:
    """What a run's profile says of the calibration's busy requests: the tokens each
    decoded (``busy_probe_tokens``; 1 for profiles made before they streamed, 0 for
    none), their p90 outside the engine core (``busy_probe_p90_s``, NaN: none) and how
    many the client read in one burst, left out of it (``busy_probe_bursts``); and of
    its lone decoding requests (sent to an idle server): how many were kept
    (``decoding_probe_kept``; 0 for profiles made before they were sent) and their
    first token's p50 beyond its charged step (``decoding_probe_p50_s``)."""
    path = profile.fit.get("serving_path")
    path = path if isinstance(path, dict) else {}
    kept = path.get("busy_samples_kept") or 0
    tokens = path.get("busy_tokens", 1 if kept else 0)
    bursts = path.get("busy_bursts", 0)
    table = profile.busy_request_spread_s
    decoding = profile.decoding_request_spread_s
    lone = path.get("decoding_samples_kept", 0)
    return {
        "busy_probe_tokens": int(tokens) if isinstance(tokens, int) else 0,
        "busy_probe_p90_s": float(table[18]) if table else math.nan,
        "busy_probe_bursts": int(bursts) if isinstance(bursts, int) else 0,
        "decoding_probe_kept": int(lone) if isinstance(lone, int) and decoding else 0,
        "decoding_probe_p50_s": float(decoding[10]) if decoding else math.nan,
    }


def _busy_probe_of(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A rate's runs' busy-probe figures (the first run's: one profile per rate) and
    whether the server busy-waits (any run says so)."""
    first = runs[0]
    return {
        "busy_probe_tokens": first.get("busy_probe_tokens", 0),
        "busy_probe_p90_s": first.get("busy_probe_p90_s", math.nan),
        "busy_probe_bursts": first.get("busy_probe_bursts", 0),
        "decoding_probe_kept": first.get("decoding_probe_kept", 0),
        "decoding_probe_p50_s": first.get("decoding_probe_p50_s", math.nan),
        "busy_wait": any(r.get("busy_wait", False) for r in runs),
    }


def server_busy_waits(log: Path) -> bool:
    """Whether the server whose log is ``log`` busy-waits as vLLM's CPU build does with
    its worker bound (:func:`sim_to_real_verdict.busy_waits`); no log: ``False``."""
    try:
        return busy_waits(log.read_text(errors="replace"))
    except OSError:
        return False


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 1e3:.1f}"


def _err(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:+.0%}"


def sweep_table(rows: Sequence[dict[str, Any]]) -> str:
    """The sweep as a Markdown table, one line per offered rate (see :func:`summarize_rate`):
    measured / simulated side by side, in ms and tokens a second."""
    head = (
        "| offered req/s | served req/s | sim busy | load (1 min) | runs x requests "
        "| cached exact | client stalls | TTFT p50 meas / sim ms | err "
        "| TTFT p90 meas / sim ms | err "
        "| TPOT p50 meas / sim ms | err | TPOT p90 meas / sim ms | err "
        "| output tok/s meas / sim | verdict |"
    )
    lines = [head, "|" + "---:|" * 16 + "---|"]
    for r in rows:
        cells = [
            f"{r['rate']:g}",
            f"{r['achieved_rps']:.2f}",
            f"{r['utilization_sim']:.0%}",
            f"{r['load_min']:.2f}-{r['load_max']:.2f}",
            f"{r['runs']} x {r['requests'] // max(1, r['runs'])}",
            f"{r['cached_exact']}/{r['requests']}",
            str(r.get("client_stalls", 0)),
        ]
        for metric in ("ttft", "tpot"):
            for q in (50, 90):
                m, p = r[f"{metric}_p{q}_measured_s"], r[f"{metric}_p{q}_sim_s"]
                cells += [f"{_ms(m)} / {_ms(p)}", _err(r[f"{metric}_p{q}_error"])]
        cells += [f"{r['throughput_measured']:.0f} / {r['throughput_sim']:.0f}", r["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_rates(text: str) -> list[float]:
    """``"0.5,1,2"`` -> ``[0.5, 1.0, 2.0]``: positive, finite, increasing."""
    try:
        rates = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"rates are numbers separated by commas, got {text!r}"
        ) from None
    if not rates or any(not (0 < r < math.inf) for r in rates) or rates != sorted(set(rates)):
        raise argparse.ArgumentTypeError(f"rates must be positive and increasing, got {text!r}")
    return rates


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--vllm", help="the vllm executable to start a server with")
    src.add_argument("--url", help="use this running server instead")
    src.add_argument(
        "--resimulate",
        metavar="DIR",
        help="predict a recorded sweep (an --out folder) again, with no server: the same "
        "requests (rebuilt from their seeds) at the recorded send times, against the "
        "recorded measurements, priced by the recorded profile (or --profile, or --refit)",
    )
    _recorded_options(ap)
    ap.add_argument("--model", default="tiny-llama", help="the model folder (with --vllm)")
    ap.add_argument("--repeats", type=int, default=3, help="runs a rate (fresh token ids each)")
    ap.add_argument("--profile", help="use this profile instead of calibrating")
    ap.add_argument(
        "--refit",
        action="store_true",
        help="with --resimulate: fit each recorded profile again from the calibration "
        "samples it keeps (the model may have changed since it was recorded)",
    )
    ap.add_argument(
        "--pool",
        action="store_true",
        help="predict every rate again with one profile pooled from all of the session's "
        "calibrations (with --calibrate-each, one before each rate; outlier rounds dropped, "
        "each shape's median kept), written to OUT/pooled; with --resimulate: every "
        "profile*.json of the recording",
    )
    ap.add_argument("--sweep-repeats", type=int, default=3)
    ap.add_argument(
        "--serving-repeats",
        type=int,
        default=10,
        help="requests of each kind timing the serving path (0: not timed)",
    )
    ap.add_argument("--quick", action="store_true", help="calibrate with the quick sweep")
    ap.add_argument(
        "--calibrate-each",
        action="store_true",
        help="calibrate again before each rate (the machine's load drifts on a shared "
        "machine; each rate is then predicted from a profile measured under its own load)",
    )
    ap.add_argument(
        "--out",
        help="output folder (default sim-to-real; with --resimulate, DIR-resimulated)",
    )
    ap.add_argument("--start-timeout", type=float, default=300.0)
    return ap


def _recorded_options(ap: argparse.ArgumentParser) -> None:
    """The options that fix a sweep's requests (a recording's command is read with them)."""
    ap.add_argument("--workload", default="multi_turn", help="the built-in workload to predict")
    ap.add_argument("--max-requests", type=int, default=165, help="requests a run")
    ap.add_argument(
        "--request-rates",
        "--request-rate",
        type=parse_rates,
        default=parse_rates("0.5,1,2,4,8,16"),
        help="offered rates, requests a second, light to past saturation (default 0.5,1,2,4,8,16)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.refit and not args.resimulate:
        ap.error("--refit goes with --resimulate")
    if args.resimulate:
        try:
            return resimulate(args)
        except (RecordingError, ProfileError, OSError) as exc:
            print(f"sim_to_real: {exc}", file=sys.stderr)
            return 2
    out = Path(args.out or "sim-to-real")
    out.mkdir(parents=True, exist_ok=True)
    log = out / "server.log"
    if args.url:
        return run(args, args.url, out)
    with vllm_server(args.vllm, args.model, log, args.start_timeout) as url:
        return run(args, url, out)


def _calibrate(args: argparse.Namespace, url: str, out: Path, tag: str) -> CostProfile:
    base = QUICK_SWEEP if args.quick else ServerSweep(repeats=args.sweep_repeats)
    sweep = dataclasses.replace(
        base, max_num_batched_tokens=CPU_MAX_NUM_BATCHED_TOKENS,
        serving_repeats=args.serving_repeats,
    )  # fmt: skip
    profile = calibrate_server(url, sweep=sweep, name="vllm-cpu-tiny-llama")
    save_profile(profile, out / f"profile{tag}.json")
    path = profile.fit.get("serving_path", {})
    hops = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in path.get("hops", {}).items())
    tables = (
        ("idle", profile.request_spread_s),
        ("busy", profile.busy_request_spread_s),
        ("decoding, sent idle (beyond its step)", profile.decoding_request_spread_s),
    )
    spread = ", ".join(
        f"{what} p50 {t[10] * 1e3:.1f} / p90 {t[18] * 1e3:.1f} ms" for what, t in tables if t
    )
    print(f"profile{tag}: request_s {profile.request_s * 1e3:.2f} ms, admit_s "
          f"{profile.admit_s * 1e3:.2f} ms, stream_token_s "
          f"{profile.stream_token_s * 1e3:.3f} ms, step_s {profile.step_s * 1e3:.2f} ms, "
          f"front-end share {profile.frontend_cpu_share:.2f}; serving path: {hops or '-'}; "
          f"outside the engine: {spread or '-'}", flush=True)  # fmt: skip
    return profile


def run(args: argparse.Namespace, url: str, out: Path) -> int:
    import httpx

    info = asyncio.run(_info(url))
    print(f"server {url}: {info.model}, vLLM {info.engine_version}, block size "
          f"{info.block_size}, {info.num_gpu_blocks:,} blocks", flush=True)  # fmt: skip
    load0 = load_average()
    profile = load_profile(args.profile) if args.profile else _calibrate(args, url, out, "")
    cal = {"load_before": load0, "load_after": load_average(), "fit": dict(profile.fit)}
    runs: list[dict[str, Any]] = []
    summaries = []
    salt = int.from_bytes(os.urandom(4), "little")
    for i, rate in enumerate(args.request_rates):
        if args.calibrate_each and i and not args.profile:
            profile = _calibrate(args, url, out, f"-{rate:g}")
        at_rate = []
        for k in range(args.repeats):
            seed = run_seed(i, k)
            requests = trace(args.workload, args.max_requests, seed, salt + seed, VOCAB)
            gen = poisson_arrivals(rate, seed=seed)
            times = [next(gen) for _ in requests]
            before = load_average()
            sent, completions = asyncio.run(replay(url, info.model, requests, times))
            after = load_average()
            done = [Measured.of(c) for c in completions]
            predicted, utilization, throughput = predict(
                requests, sent, profile, info.kv_cache_tokens, info.block_size
            )
            row = {"rate": rate, "run": k + 1, "seed": seed, "salt": salt + seed,
                   "load_before": before,
                   "load_after": after, "utilization_sim": utilization,
                   "throughput_sim": throughput, "profile": profile.name,
                   **busy_probe(profile), "busy_wait": server_busy_waits(out / "server.log"),
                   **compare_run(requests, times, sent, done, predicted)}  # fmt: skip
            at_rate.append(row)
            write_requests(out / f"requests-{rate:g}-{k + 1}.jsonl", requests, sent, done,
                           predicted)  # fmt: skip
        summary = summarize_rate(rate, at_rate)
        summaries.append(summary)
        runs += at_rate
        print(sweep_table([summary]).splitlines()[-1], flush=True)
    table = sweep_table(summaries)
    print(table)
    doc = {"server": url, "model": info.model, "engine_version": info.engine_version,
           "machine": client_machine(), "cpus": os.cpu_count(), "command": " ".join(sys.argv),
           "workload": args.workload, "max_requests": args.max_requests,
           "request_rates": args.request_rates, "block_size": info.block_size,
           "kv_cache_tokens": info.kv_cache_tokens,
           "calibration": cal, "profile": profile.to_dict(), "rates": summaries,
           "runs": runs, "httpx": httpx.__version__}  # fmt: skip
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "table.md").write_text(table + "\n")
    if args.pool and not args.profile:
        # Every rate predicted again from all of the session's calibrations pooled.
        print(f"\npredicted from the session's calibrations pooled -> {out / 'pooled'}")
        pooled = argparse.Namespace(
            **{**vars(args), "resimulate": str(out), "out": str(out / "pooled"), "refit": False}
        )
        return resimulate(pooled)
    return 0


VOCAB = 32000
"""Token ids of the replayed prompts lie below this (the tiny Llama's vocabulary)."""


def run_seed(rate_index: int, repeat: int) -> int:
    """The seed of a rate's run: its trace and its arrival times."""
    return rate_index * 1000 + repeat


def write_requests(
    path: Path,
    requests: Sequence[tuple[str, list[int], int]],
    sent: Sequence[float],
    done: Sequence[Measured],
    predicted: Sequence[tuple[int, float, float]],
) -> None:
    """One line a request: what was sent, measured and simulated."""
    with path.open("w") as f:
        for r, s, c, (h, t, tp) in zip(requests, sent, done, predicted, strict=True):
            f.write(json.dumps({"id": r[0], "prompt": len(r[1]), "output": r[2], "sent_s": s,
                                "ttft_s": c.ttft_s, "tpot_s": c.tpot_s, "latency_s": c.latency_s,
                                "tokens": c.tokens, "chunks": c.chunks, "cached": c.cached,
                                "sim_hit": h,
                                "sim_ttft_s": t, "sim_tpot_s": tp}) + "\n")  # fmt: skip


class RecordingError(Exception):
    """A recorded sweep that cannot be predicted again: a file missing or malformed, or
    requests that are not the ones its seeds rebuild."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file; is it a sim_to_real --out folder?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordingError(f"{path}: not JSON ({exc})") from None


def _recorded_sweep(doc: dict[str, Any]) -> argparse.Namespace:
    """The workload, requests a run and rates a recording ran (from its command when it
    predates their own fields)."""
    ap = argparse.ArgumentParser(add_help=False)
    _recorded_options(ap)
    try:
        args, _ = ap.parse_known_args(shlex.split(doc.get("command", ""))[1:])
    except SystemExit:
        raise RecordingError(
            f"results.json: its command does not parse: {doc.get('command')!r}"
        ) from None
    for key in ("workload", "max_requests", "request_rates"):
        if key in doc:
            setattr(args, key, doc[key])
    return args


def _measured(line: dict[str, Any]) -> Measured:
    ttft, tpot = float(line["ttft_s"]), float(line["tpot_s"])
    tokens = int(line.get("tokens", line["output"]))
    latency = line.get("latency_s")
    if latency is None:  # recorded before the latency was kept: TTFT + the gaps
        latency = ttft + (tpot * (tokens - 1) if tokens > 1 else 0.0)
    cached = line["cached"]
    return Measured(
        ttft, tpot, float(latency), tokens, None if cached is None else int(cached),
        int(line.get("chunks", 0)),
    )  # fmt: skip


def _recorded_run(
    folder: Path, run: dict[str, Any], requests: Sequence[tuple[str, list[int], int]]
) -> tuple[list[float], list[Measured]]:
    """A run's send times and measurements, checked against the rebuilt requests."""
    path = folder / f"requests-{run['rate']:g}-{run['run']}.jsonl"
    try:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordingError(f"{path}: not JSON lines ({exc})") from None
    if len(lines) != len(requests):
        raise RecordingError(f"{path}: {len(lines)} requests, its seed rebuilds {len(requests)}")
    for n, (line, (rid, prompt, out)) in enumerate(zip(lines, requests, strict=True), 1):
        if (line.get("id"), line.get("prompt"), line.get("output")) != (rid, len(prompt), out):
            raise RecordingError(
                f"{path}, line {n}: request {line.get('id')!r} is not the one its seed "
                f"rebuilds ({rid!r}, {len(prompt)} prompt tokens, {out} out): another workload "
                "or another version of it"
            )
    try:
        return [float(x["sent_s"]) for x in lines], [_measured(x) for x in lines]
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"{path}: a request without its measurements ({exc})") from None


def _recorded_profiles(
    args: argparse.Namespace, folder: Path, doc: dict[str, Any], rates: Sequence[float]
) -> list[CostProfile]:
    """The profile each rate is predicted with: ``--profile``, else the one the
    recording predicted it with (``profile-RATE.json`` after ``--calibrate-each``,
    else ``profile.json``), fitted again from its samples with ``--refit``."""
    if args.profile:
        profiles = [load_profile(args.profile)] * len(rates)
    else:
        first = folder / "profile.json"
        base = load_profile(first) if first.is_file() else CostProfile.from_dict(doc["profile"])
        profiles = []
        for rate in rates:
            own = folder / f"profile-{rate:g}.json"
            profiles.append(load_profile(own) if own.is_file() else base)
    if args.pool and not args.profile:
        rounds = [load_profile(p) for p in sorted(folder.glob("profile*.json"))]
        return [pool_rounds(rounds or profiles[:1])] * len(rates)
    if args.refit:
        refitted = {id(p): refit_server_profile(p) for p in profiles}
        profiles = [refitted[id(p)] for p in profiles]
    return profiles


def resimulate(args: argparse.Namespace) -> int:
    """Predict a recorded sweep again (``--resimulate DIR``) and write its table.

    Each run's requests are rebuilt from the workload, its seed and salt (the trace is
    deterministic), checked against the recorded ones, sent at the recorded times
    through the simulator and set against the recorded measurements; the recording is
    only read.
    """
    folder = Path(args.resimulate)
    out = Path(args.out or f"{folder.as_posix().rstrip('/')}-resimulated")
    if out.resolve() == folder.resolve():
        raise RecordingError(f"--out {out} is the recording itself; choose another folder")
    doc = _read_json(folder / "results.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise RecordingError(f"{folder / 'results.json'}: no runs recorded")
    sweep = _recorded_sweep(doc)
    rates = [float(r) for r in sweep.request_rates]
    profiles = _recorded_profiles(args, folder, doc, rates)
    first = profiles[0]
    pool = int(doc.get("kv_cache_tokens") or first.kv_cache_tokens or 0)
    block_size = int(doc.get("block_size") or first.measured_on.get("block_size") or 0)
    if pool < 1 or block_size < 1:
        raise RecordingError(f"{folder}: neither the recording nor its profile says the KV pool")
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for recorded in doc["runs"]:
        try:
            rate, k = float(recorded["rate"]), int(recorded["run"]) - 1
            i = rates.index(rate)
            seed = int(recorded.get("seed", run_seed(i, k)))
            salt = int(recorded["salt"])
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordingError(
                f"{folder / 'results.json'}: a run without its seed ({exc})"
            ) from None
        requests = trace(sweep.workload, sweep.max_requests, seed, salt, VOCAB)
        sent, done = _recorded_run(folder, recorded, requests)
        gen = poisson_arrivals(rate, seed=seed)
        scheduled = [next(gen) for _ in requests]
        profile = profiles[i]
        predicted, utilization, throughput = predict(requests, sent, profile, pool, block_size)
        row = {"rate": rate, "run": k + 1, "seed": seed, "salt": salt,
               "load_before": recorded["load_before"], "load_after": recorded["load_after"],
               "utilization_sim": utilization, "throughput_sim": throughput,
               "profile": profile.name, **busy_probe(profile),
               "busy_wait": server_busy_waits(folder / "server.log"),
               **compare_run(requests, scheduled, sent, done, predicted)}  # fmt: skip
        by_rate.setdefault(rate, []).append(row)
        out.mkdir(parents=True, exist_ok=True)
        write_requests(out / f"requests-{rate:g}-{k + 1}.jsonl", requests, sent, done, predicted)
    summaries = [summarize_rate(rate, by_rate[rate]) for rate in rates if rate in by_rate]
    table = sweep_table(summaries)
    print(f"re-predicted from the recording in {folder} ({sum(map(len, by_rate.values()))} runs)")
    print(table)
    result = {**doc, "resimulated_from": str(folder), "command": " ".join(sys.argv),
              "profile": profiles[-1].to_dict(), "rates": summaries,
              "runs": [r for rate in rates for r in by_rate.get(rate, [])]}  # fmt: skip
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "table.md").write_text(table + "\n")
    return 0


async def _info(url: str) -> Any:
    engine = ServedEngine(url)
    async with engine.client() as client:
        return await engine.info(client)


if __name__ == "__main__":
    raise SystemExit(main())
