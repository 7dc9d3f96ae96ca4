"""Time each hop of streamed requests sent to a served vLLM alone and while another streams.

Each timed request (an 8-token fresh prompt decoding ``--tokens`` tokens) is read at
both ends: the client's send, first chunk and every later chunk; vLLM's ``/metrics``
read before and after it (its per-request histograms, which the API server fills
from the engine core's own timestamps: queued -> scheduled is the queue time,
scheduled -> first token the prefill time, first -> last token the decode time, and
the API server's arrival -> first token ``vllm:time_to_first_token_seconds``); and
the CPU seconds each of the server's processes (API server, engine core, worker)
spent over it (``/proc/PID/stat``). So a request's time splits into:

- ``engine``: the engine core's queue + prefill time;
- ``api``: the API server's TTFT less that (input processing, the hop to the engine
  core and back);
- ``to_client``: the client's TTFT less the API server's (HTTP in, the SSE chunk out);
- ``burst``: the stream reached the client in one burst (its chunks over less than a
  quarter of the engine core's decode time);
- ``client_wait``: the seconds the client process was ready to run but waited for a
  core over the request (``/proc/self/schedstat``, Linux): a stream read in one burst
  whose client waited about as long as the stream lasted was held by the client not
  getting a core, not by the server.

Kinds: ``lone`` (one at a time, the server idle 0.3 s in between: its shm queue
readers still spin), ``lone-after-1.5s`` (idle 1.5 s in between: past their 1 s of
spinning), ``busy`` (one at a time while a long request streams to the same client,
as a sweep's requests sent while another runs).

Arms: ``spin`` (vLLM as it is) and ``nospin`` (the same server with
``tests/serve/harness/nospin`` on its ``PYTHONPATH``: where vLLM's shared-memory
queue readers spin with ``sched_yield()`` for a second after each read, each turn
sleeps 0.2 ms instead, leaving the core to the other processes). ``--rounds``
alternates the arms so that the machine's load falls on both alike; every round
records the 1-minute load average.

    python tests/serve/harness/serving_hops.py --vllm VLLM_VENV/bin/vllm \\
        --model tests/serve/harness/tiny-llama --rounds 2 --requests 20 --out build/hops

Writes ``hops.jsonl`` (one line per request) and ``hops.md`` (per arm and kind:
p50 / p90 of each hop, bursts, CPU seconds per process) under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_to_real import vllm_server  # noqa: E402

from prefixkv.adapters.lab.sim.served import ServedEngine  # noqa: E402
from prefixkv.adapters.lab.sim.serving_path import METRICS, metric_totals  # noqa: E402

NOSPIN = Path(__file__).resolve().parent / "nospin"
PROMPT_TOKENS = 8
BACKGROUND_TOKENS = 4096
SPIN_S = 1.0
"""vLLM's ``busy_loop_s``: a shm queue reader spins this long after its last read."""


def process_cpu(pgid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each process of group ``pgid``, by its name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) != pgid:  # fields[2]: pgrp
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        out[name] = out.get(name, 0.0) + cpu
    return out


def run_queue_wait_s() -> float:
    """Seconds this process's thread waited for a core so far (0 where the kernel does
    not say: ``/proc/self/schedstat``, Linux with schedstats)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def metrics(client: Any) -> dict[str, float]:
    r = await client.get("/metrics")
    return metric_totals(r.text)


def delta(after: dict[str, float], before: dict[str, float], *keys: str) -> float | None:
    names = [METRICS[k] for k in keys]
    if any(n not in after or n not in before for n in names):
        return None
    return sum(after[n] - before[n] for n in names)


async def timed(
    engine: ServedEngine, client: Any, prompt: list[int], tokens: int, pgid: int
) -> dict[str, Any]:
    before = await metrics(client)
    cpu0 = process_cpu(pgid)
    wait0 = run_queue_wait_s()
    c = await engine.complete(client, prompt, tokens)
    wait1 = run_queue_wait_s()
    cpu1 = process_cpu(pgid)
    after = await metrics(client)
    for _ in range(20):
        if (delta(after, before, "done") or 0) >= 1:
            break
        await asyncio.sleep(0.01)
        after = await metrics(client)
    whole = delta(after, before, "done") == 1
    decode_client = c.latency_s - c.ttft_s
    row: dict[str, Any] = {
        "client_ttft_ms": 1e3 * c.ttft_s,
        "client_decode_ms": 1e3 * decode_client,
        "client_tpot_ms": 1e3 * decode_client / max(1, len(c.itl_s)),
        "chunks": len(c.itl_s) + 1,
        "client_wait_ms": 1e3 * (wait1 - wait0),
        "cpu_s": {k: round(cpu1.get(k, 0.0) - v, 3) for k, v in cpu0.items()},
    }
    if whole:
        server = delta(after, before, "server_ttft")
        queue = delta(after, before, "queue")
        prefill = delta(after, before, "prefill")
        decode = delta(after, before, "decode")
        if None not in (server, queue, prefill, decode):
            assert server is not None and queue is not None
            assert prefill is not None and decode is not None
            row.update(
                server_ttft_ms=1e3 * server,
                engine_queue_ms=1e3 * queue,
                engine_prefill_ms=1e3 * prefill,
                engine_decode_ms=1e3 * decode,
                api_ms=1e3 * (server - queue - prefill),
                to_client_ms=1e3 * (c.ttft_s - server),
                burst=decode_client < 0.25 * decode,
            )
    return row


async def probe(url: str, pgid: int, n: int, tokens: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)

    def fresh(k: int) -> list[int]:
        return [rng.randrange(3, 32000) for _ in range(k)]

    engine = ServedEngine(url)
    rows = []
    async with engine.client() as client:
        await engine.info(client)
        for _ in range(3):  # warm up
            await engine.complete(client, fresh(PROMPT_TOKENS), tokens)
        for pause, kind, count in ((0.3, "lone", n), (SPIN_S + 0.5, "lone-after-1.5s", n // 2)):
            for _ in range(count):
                await asyncio.sleep(pause)  # the server idles first
                row = await timed(engine, client, fresh(PROMPT_TOKENS), tokens, pgid)
                rows.append({"kind": kind, **row})
        background = asyncio.ensure_future(engine.complete(client, fresh(64), BACKGROUND_TOKENS))
        try:
            await asyncio.sleep(0.2)
            for k in range(n):
                row = await timed(engine, client, fresh(PROMPT_TOKENS), tokens, pgid)
                rows.append({"kind": "busy", **row})
                await asyncio.sleep(0.003 * (k % 5))
        finally:
            background.cancel()
            await asyncio.gather(background, return_exceptions=True)
    return rows


def _pct(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


HOPS = ("client_ttft_ms", "engine_queue_ms", "engine_prefill_ms", "api_ms", "to_client_ms",
        "client_tpot_ms", "engine_decode_ms", "client_wait_ms")  # fmt: skip


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = (
        "| arm | kind | n | load (1 min) | "
        + " | ".join(f"{h[:-3]} p50 / p90 ms" for h in HOPS)
        + " | bursts | CPU s per request (API / engine core / worker) |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for arm in ("spin", "nospin"):
        for kind in ("lone", "lone-after-1.5s", "busy"):
            sel = [r for r in rows if r["arm"] == arm and r["kind"] == kind]
            if not sel:
                continue
            cells = []
            for h in HOPS:
                v = [r[h] for r in sel if h in r]
                cells.append(f"{_pct(v, 0.5):.1f} / {_pct(v, 0.9):.1f}" if v else "-")
            bursts = sum(1 for r in sel if r.get("burst"))
            cpu: dict[str, list[float]] = {}
            for r in sel:
                for k, v in r["cpu_s"].items():
                    cpu.setdefault(k, []).append(v)
            names = sorted(cpu)
            # process names (comm) are cut at 15 characters: VLLM::EngineCor
            api = [n for n in names if "EngineCor" not in n and "Worker" not in n]
            core = [n for n in names if "EngineCor" in n]
            worker = [n for n in names if "Worker" in n]

            loads = sorted({r["load1"] for r in sel})
            lines.append(
                f"| {arm} | {kind} | {len(sel)} | {loads[0]:.2f}-{loads[-1]:.2f} | "
                + " | ".join(cells)
                + f" | {bursts}/{len(sel)} | {_mean_cpu(cpu, api, len(sel))} / "
                f"{_mean_cpu(cpu, core, len(sel))} / {_mean_cpu(cpu, worker, len(sel))} |"
            )
    return "\n".join(lines) + "\n"


def _mean_cpu(cpu: dict[str, list[float]], group: list[str], n: int) -> str:
    """The mean CPU seconds per request of the processes ``group`` together."""
    vals = [sum(cpu[name][i] for name in group) for i in range(n)] if group else []
    return f"{statistics.fmean(vals):.3f}" if vals else "-"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm", required=True, help="the vllm executable")
    ap.add_argument("--model", default=str(ROOT / "tests/serve/harness/tiny-llama"))
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both arms")
    ap.add_argument("--arms", default="spin,nospin")
    ap.add_argument("--requests", type=int, default=20, help="requests of each kind a round")
    ap.add_argument("--tokens", type=int, default=32, help="tokens each timed request decodes")
    ap.add_argument("--out", type=Path, default=Path("build/hops"))
    ap.add_argument("--start-timeout", type=float, default=300)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    arms = args.arms.split(",")
    base_path = os.environ.get("PYTHONPATH")
    for rnd in range(args.rounds):
        for arm in arms if rnd % 2 == 0 else arms[::-1]:
            if arm == "nospin":
                os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(NOSPIN), base_path]))
            elif base_path is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = base_path
            log = args.out / f"server-{arm}-{rnd}.log"
            with vllm_server(args.vllm, args.model, log, args.start_timeout) as url:
                pgid = _server_pgid(log)
                load1 = os.getloadavg()[0]
                t0 = time.time()
                got = asyncio.run(probe(url, pgid, args.requests, args.tokens, 1000 * rnd))
                for r in got:
                    rows.append({"arm": arm, "round": rnd, "load1": load1, **r})
                print(f"round {rnd} {arm}: {len(got)} requests in {time.time() - t0:.0f} s, "
                      f"load {load1:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    with (args.out / "hops.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    md = table(rows)
    (args.out / "hops.md").write_text(md)
    print(md)
    return 0


def _server_pgid(log: Path) -> int:
    """The process group of the server whose log is ``log`` (its API server's pid:
    the server is started in a new session)."""
    for line in log.read_text(errors="replace").splitlines():
        if "(APIServer pid=" in line:
            return int(line.split("(APIServer pid=")[1].split(")")[0])
    raise RuntimeError(f"no API server pid in {log}")


if __name__ == "__main__":
    raise SystemExit(main())
