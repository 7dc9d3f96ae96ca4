#!/usr/bin/env python3
"""The scheduler's own time per step inside ``vllm serve``: prefixkv against native.

Starts one server per configuration side by side (at most three: native prefix
caching, prefixkv's hash chain, prefixkv's radix tree), each with the scheduler
timed step by step (``step_timing.py``: the same timing wrapped around vLLM's
``Scheduler`` and prefixkv's ``PrefixKVScheduler``), the serving tests' settings (the
random-weight tiny Llama, 64 usable blocks of 32 tokens, 128 tokens a step, 4 running
requests) and no KV events. Then, ``--rounds`` times, replays the serving tests' trace
(``served_trace.py``: sequential, then paused waves; the same steps on every run)
against one server at a time, the others idle, the order reversed every other round,
each run from an empty prefix cache (``/reset_prefix_cache``). Reported per
configuration: the median over rounds of each run's median, mean and 90th percentile
of ``schedule()`` + ``update_from_output()`` per step, by the wall clock and by the
scheduler thread's CPU clock, the steps, and the load average around the run; with
``--cache`` (a run of its own: the timing costs) also the KV-cache manager's calls' share.

    PYTHONPATH=tests/serve/harness VENV/bin/python benchmarks/serve/step_time.py \\
        --vllm VENV/bin/vllm [--rounds 5] [--out step-time.json]

(run by the serving environment's Python: the serving harness needs ``openai``, and the
tiny Llama ``torch`` and ``safetensors``.)
Which prefixkv build runs is the serving environment's (``make wheel-venv`` then
``VENV/bin/pip install --no-deps --force-reinstall build/wheel/prefixkv-*.whl`` for
the compiled one); the report names it. Exit 1 when the hash chain's steps differ from
native's, or one configuration's from one run to the next (then the runs did not do
the same work and their times do not compare).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from served_trace import Plan, Replayer, build_plan
from tiny_llama import write_model_with
from vllm_server import ServeConfig, ServerError, VLLMServer

HERE = Path(__file__).resolve().parent
CLASSES = {
    "native": ("step_timing.TimedScheduler", None),
    "hash_chain": ("step_timing.TimedPrefixKVScheduler", "hash_chain"),
    "radix": ("step_timing.TimedPrefixKVScheduler", "radix"),
}
SERVE_ARGS = ("--max-num-batched-tokens", "128", "--max-num-seqs", "4", "--enable-log-requests")


def start(vllm: str, model: Path, label: str, times: Path, logs: Path, cache: bool) -> VLLMServer:
    """Launch one timed server (not yet waited for)."""
    cls, index = CLASSES[label]
    extra = [*SERVE_ARGS, "--scheduler-cls", cls]
    if index is not None:
        extra += ["--additional-config", json.dumps({"prefixkv": {"index": index}})]
    pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    config = ServeConfig(
        vllm=vllm, model=str(model), load_format="auto", num_gpu_blocks=65,
        extra_args=extra,
        env={"PYTHONPATH": pythonpath, "PREFIXKV_STEP_TIMES": str(times),
             "PREFIXKV_STEP_TIMES_CACHE": "1" if cache else "0", "VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip
    server = VLLMServer(config, logs / label, start_timeout=900, lifetime=7200)
    server.launch()
    return server


def read_steps(path: Path, skip: int) -> tuple[list[dict[str, Any]], int]:
    """The step lines of ``path`` after its first ``skip`` lines, and its line count."""
    lines = path.read_text().splitlines()
    rows = [json.loads(x) for x in lines[skip:]]
    return [r for r in rows if "schedule_ns" in r], len(lines)


def one_run(
    server: VLLMServer, plan: Plan, times: Path, seen: int, round_: int
) -> tuple[dict[str, Any], int]:
    """Replay ``plan`` once from an empty prefix cache; its steps' figures."""
    if server.control("/reset_prefix_cache").strip() in (b"false", b'"false"'):
        raise ServerError("/reset_prefix_cache refused")
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    Replayer(server, id_prefix=f"r{round_}-").replay(plan)
    wall = time.monotonic() - t0
    for _ in range(100):  # the scheduler appends a run's steps when it has nothing left
        steps, count = read_steps(times, seen)
        if steps:
            break
        time.sleep(0.1)
    else:
        raise ServerError(f"no step times in {times}")
    step_us = [(s["schedule_ns"] + s["update_ns"]) / 1e3 for s in steps]
    cpu_us = [(s["schedule_cpu_ns"] + s["update_cpu_ns"]) / 1e3 for s in steps]
    cache_us = [s["cache_ns"] / 1e3 for s in steps]
    return {
        "steps": len(steps),
        "schedule": [(s["tokens"], s["requests"]) for s in steps],
        "median_us": statistics.median(step_us),
        "mean_us": statistics.fmean(step_us),
        "p90_us": sorted(step_us)[int(0.9 * (len(step_us) - 1))],
        "cpu_median_us": statistics.median(cpu_us),
        "cpu_mean_us": statistics.fmean(cpu_us),
        "cache_median_us": statistics.median(cache_us),
        "cache_mean_us": statistics.fmean(cache_us),
        "replay_s": wall,
        "load": (load0, os.getloadavg()[0]),
    }, count


def describe(run: dict[str, Any]) -> str:
    """One run in a line."""
    return (
        f"{run['steps']} steps, median {run['median_us']:.0f} us "
        f"(CPU {run['cpu_median_us']:.0f} us), mean {run['mean_us']:.0f} us, "
        f"load {run['load'][0]:.1f}"
    )


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per configuration: the median over rounds of each figure."""
    keys = ("median_us", "mean_us", "p90_us", "cpu_median_us", "cpu_mean_us",
            "cache_median_us", "cache_mean_us", "steps")  # fmt: skip
    return {
        label: {k: statistics.median(r[k] for r in rs) for k in keys} for label, rs in runs.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="the vllm executable to serve with")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default="native,hash_chain,radix")
    ap.add_argument("--out", default="step-time.json")
    ap.add_argument("--logs", default="build/step-time-logs")  # build/: ignored by git
    ap.add_argument("--cache", action="store_true", help="also time the KV-cache manager's calls")
    args = ap.parse_args(argv)
    labels = args.configs.split(",")
    if not 1 <= len(labels) <= 3 or not set(labels) <= set(CLASSES):
        ap.error(f"--configs: one to three of {', '.join(CLASSES)}")
    logs = Path(args.logs).resolve()
    plan = build_plan(0)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="prefixkv-step-time-") as d, ExitStack() as stack:
        model = write_model_with(args.vllm, Path(d) / "model")
        servers, times, seen = {}, {}, {}
        logs.mkdir(parents=True, exist_ok=True)
        for label in labels:
            times[label] = logs / f"{label}-steps.jsonl"
            times[label].unlink(missing_ok=True)
            servers[label] = start(args.vllm, model, label, times[label], logs, args.cache)
            stack.callback(servers[label].stop)
        for server in servers.values():
            server.wait_ready()
        for label in labels:
            info[label] = json.loads(times[label].read_text().splitlines()[0])
            seen[label] = 1
        for r in range(args.rounds):
            for label in labels if r % 2 == 0 else labels[::-1]:
                run, seen[label] = one_run(servers[label], plan, times[label], seen[label], r)
                runs[label].append(run)
                print(f"round {r} {label:10s} {describe(run)}", flush=True)
    summary = summarize(runs)
    same = True
    if "native" in runs and "hash_chain" in runs:
        same = all(a["schedule"] == b["schedule"]
                   for a, b in zip(runs["native"], runs["hash_chain"], strict=True))  # fmt: skip
    # The trace gives the same steps on every run of one configuration.
    repeat = {k: all(r["schedule"] == rs[0]["schedule"] for r in rs) for k, rs in runs.items()}
    for rs in runs.values():
        for run in rs:
            run.pop("schedule")
    result = {"info": info, "rounds": args.rounds, "summary": summary, "runs": runs,
              "hash_chain_same_steps_as_native": same, "same_steps_every_run": repeat}  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\n{'':12s}{'median us':>10s}{'mean us':>9s}{'p90 us':>8s}{'CPU med':>9s}"
          f"{'CPU mean':>9s}{'cache med':>10s}{'cache mean':>11s}{'steps':>7s}  build")  # fmt: skip
    for label, s in summary.items():
        print(f"{label:12s}{s['median_us']:10.0f}{s['mean_us']:9.0f}{s['p90_us']:8.0f}"
              f"{s['cpu_median_us']:9.0f}{s['cpu_mean_us']:9.0f}{s['cache_median_us']:10.1f}"
              f"{s['cache_mean_us']:11.1f}{s['steps']:7.0f}  "
              f"{info[label].get('prefixkv', 'vLLM')}")  # fmt: skip
    if not same:
        print("step_time: the hash chain's steps differ from native's", file=sys.stderr)
    if not all(repeat.values()):
        print(f"step_time: runs of one configuration took different steps: {repeat}",
              file=sys.stderr)  # fmt: skip
    return 0 if same and all(repeat.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
