"""Time a lone request's first token down the calibration's path and the sweep's, interleaved.

One vLLM server; every round sends one request of each variant in a shuffled order (so
the machine's load falls on all alike), each once the server idled ``gap`` seconds
since the last request ended. Every request is an 8-token fresh prompt decoding
``--tokens`` tokens, streamed; what differs is the client's path to it:

- ``probe``: the calibration's lone decoding request (``calibrate --server``): its
  own client (one connection), ``/metrics`` read, the server idles ``gap``, the request.
- ``sweep``: the sweep's client (``sim_to_real.py``'s ``replay()``): one client whose
  32 connections a concurrent warm-up opened, the request sent by a task that slept
  until its time among others asleep, nothing read before it.
- ``sweep-read``: the sweep's client with the probe's ``/metrics`` read before the gap.
- ``one-token``: the probe decoding one token (the calibration's idle requests).
- ``cached``: as ``sweep``, a sweep-length prompt: 192 cached tokens and 8 fresh.
- ``newconn``: as ``sweep``, on a client of its own opened for it (a new TCP
  connection, as where uvicorn's 5 s keep-alive closed the last one).

Each request records the client's run-queue wait (``/proc/self/schedstat``) up to its
first token. Gaps ``--gaps`` alternate by round.

    python tests/serve/harness/client_paths.py --vllm VLLM_VENV/bin/vllm \\
        --model tests/serve/harness/tiny-llama --rounds 60 --out build/client-paths

Writes ``paths.jsonl`` (one line per request) and ``paths.md`` (per variant and gap:
n, client TTFT p50 / p90 and the client's wait to its first token over the requests
whose stream was not read in one burst, the bursts, the 1-minute load) under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from serving_hops import run_queue_wait_s  # noqa: E402
from sim_to_real import vllm_server  # noqa: E402

from prefixkv.adapters.lab.sim.served import ServedEngine  # noqa: E402
from prefixkv.adapters.lab.sim.serving_path import _metrics  # noqa: E402

PROMPT_TOKENS = 8
WARM_CONNECTIONS = 32
VARIANTS = ("probe", "sweep", "sweep-read", "one-token", "cached", "newconn")
PROBE_CLIENT = {"probe", "one-token"}
"""Variants sent on the calibration's client (the others on the sweep's)."""
UNREAD = {"sweep", "cached", "newconn"}
"""Variants with no ``/metrics`` read before their gap (as a sweep's requests)."""
CACHED_TOKENS = 192
SLEEPERS = 64
"""Other tasks asleep on the sweep client's loop, as a replay's pending requests are."""


async def run(
    url: str, model: str, rounds: int, gaps: list[float], tokens: int, variants: list[str]
) -> list[Any]:
    engine = ServedEngine(url, model)
    rng = random.Random(0)

    def fresh() -> list[int]:
        return [rng.randrange(3, 32000) for _ in range(PROMPT_TOKENS)]

    out: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()

    async def timed(client: Any, at: float, prompt: list[int], tokens: int) -> dict[str, Any]:
        """Sleep until ``at``, then the request; the client's run-queue wait to its first
        token and over the whole stream (``/proc/self/schedstat``)."""
        await asyncio.sleep(at - loop.time())
        marks: list[float] = []

        def seen(count: int) -> None:
            if count == 1:
                marks.append(run_queue_wait_s())

        w0 = run_queue_wait_s()
        c = await engine.complete(client, prompt, tokens, on_token=seen)
        return {
            "client_ttft_s": c.ttft_s,
            "client_decode_s": c.latency_s - c.ttft_s,
            "wait_to_first_s": marks[0] - w0,
            "wait_s": run_queue_wait_s() - w0,
        }

    async with engine.client() as probe, engine.client() as sweep:
        await engine.info(probe)
        await engine.info(sweep)
        warm = [[3 + (k * 7919 + i) % 31000 for i in range(16)] for k in range(WARM_CONNECTIONS)]
        await asyncio.gather(*(engine.complete(sweep, p, 2) for p in warm))
        await engine.complete(probe, fresh(), 2)
        prefix = [rng.randrange(3, 32000) for _ in range(CACHED_TOKENS)]
        await engine.complete(sweep, prefix + fresh(), 2)  # cached from now on
        sleepers = [asyncio.ensure_future(asyncio.sleep(3600)) for _ in range(SLEEPERS)]
        try:
            for r in range(rounds):
                gap = gaps[r % len(gaps)]
                order = list(variants)
                rng.shuffle(order)
                for variant in order:
                    n = 1 if variant == "one-token" else tokens
                    prompt = prefix + fresh() if variant == "cached" else fresh()
                    if variant == "newconn":
                        async with engine.client() as own:
                            row = await timed(own, loop.time() + gap, prompt, n)
                    else:
                        client = probe if variant in PROBE_CLIENT else sweep
                        if variant not in UNREAD:
                            await _metrics(client)
                        at = loop.time() + gap
                        row = await asyncio.ensure_future(timed(client, at, prompt, n))
                    row.update(
                        tokens=n, variant=variant, round=r, gap_s=gap, load=os.getloadavg()[0]
                    )
                    out.append(row)
        finally:
            for sleeper in sleepers:
                sleeper.cancel()
            await asyncio.gather(*sleepers, return_exceptions=True)
    return out


def _ms(rows: list[dict[str, Any]], key: str, q: int) -> str:
    """The ``q``-th percentile of ``key`` in ms over ``rows`` that have it ("-": none)."""
    xs = sorted(r[key] * 1e3 for r in rows if r.get(key) is not None)
    if not xs:
        return "-"
    return f"{xs[min(len(xs) - 1, len(xs) * q // 100)]:.2f}"


def burst(row: dict[str, Any]) -> bool:
    """The stream was read in one burst (under 1.5 ms a token after the first)."""
    return bool(row["client_decode_s"] < 1.5e-3 * (row["tokens"] - 1))


def table(rows: list[dict[str, Any]]) -> str:
    """Per variant and gap, over the requests not read in one burst (:func:`burst`: the
    client held, as a sweep leaves them out): client TTFT p50 / p90, the client's wait
    to its first token p50; the bursts; the 1-minute load's median."""
    lines = [
        "| variant | gap s | n | bursts | client TTFT p50 ms | p90 ms "
        "| client wait to first token p50 ms | load p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["variant"], r["gap_s"]) for r in rows}, key=lambda k: (k[1], k[0]))
    for variant, gap in keys:
        cell = [r for r in rows if (r["variant"], r["gap_s"]) == (variant, gap)]
        kept = [r for r in cell if not burst(r)]
        load = statistics.median(r["load"] for r in cell)
        lines.append(
            f"| {variant} | {gap:g} | {len(cell)} | {len(cell) - len(kept)} "
            f"| {_ms(kept, 'client_ttft_s', 50)} | {_ms(kept, 'client_ttft_s', 90)} "
            f"| {_ms(kept, 'wait_to_first_s', 50)} | {load:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--vllm", required=True, help="the vllm executable")
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--gaps", default="0.3,2", help="seconds idle before each request")
    ap.add_argument("--tokens", type=int, default=32, help="tokens each request decodes")
    ap.add_argument(
        "--variants", default="probe,sweep,sweep-read", help="of " + ", ".join(VARIANTS)
    )
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    gaps = [float(g) for g in args.gaps.split(",")]
    variants = args.variants.split(",")
    if not set(variants) <= set(VARIANTS):
        ap.error(f"--variants: of {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    before = os.getloadavg()[0]
    with vllm_server(args.vllm, args.model, args.out / "server.log", 600) as url:
        rows = run_rounds(url, args.model, args.rounds, gaps, args.tokens, variants)
    with (args.out / "paths.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    text = f"1-minute load before the server started: {before:.2f}\n\n" + table(rows)
    (args.out / "paths.md").write_text(text)
    print(text)
    return 0


def run_rounds(
    url: str, model: str, rounds: int, gaps: list[float], tokens: int, variants: list[str]
) -> list[Any]:
    return asyncio.run(run(url, model, rounds, gaps, tokens, variants))


if __name__ == "__main__":
    sys.exit(main())
