"""The speed guard: ratios measured within one run, compared with a stored baseline.

Wall times on a shared machine move with its load; the ratio of two things measured
side by side in one run moves far less. ``make bench`` measures, in one run:

* ``index_ops/...``: the index-operation benchmarks (``test_index_ops.py``, read from
  pytest-benchmark's JSON), each radix tree's least time over the hash chain's on
  the same operation and sizes;
* ``trace/...``: a replay of a trace (the generated conversations below, or
  ``--trace``: a real one, such as Mooncake's) through the hash chain (vLLM's call
  order) and the radix tree (SGLang's), by CPU time (trace decode included), the
  median over ``--repeat`` rounds of each round's ratio: radix over hash chain, and, with
  ``--pure-python``, the compiled build over the pure-Python one, the same replay run
  by that interpreter in the same rounds;
* ``engines/...``: with ``--vllm-python`` and ``--sglang-python`` (the side
  environments of ``make engine-envs``), the ratios ``peers/head_to_head.py`` prints
  (prefixkv over vLLM's ``KVCacheManager`` and SGLang's ``RadixCache`` and Rust core).

Each ratio is compared with ``benchmarks/baseline.json`` (which says its machine, date
and load); every one that moved by more than ``--tolerance`` (20%) either way is
printed, and the exit status is 1 when any did: a 2x loss cannot land unseen, and a
gain asks for the baseline to be recorded again (``--update``, ``make bench-baseline``).
Ratios the baseline lacks (no engines here, another trace) are printed, not judged.

    make bench                                     # the benchmarks, then this guard
    build/wheel-venv/bin/python benchmarks/guard.py --index-ops build/bench/index_ops.json \\
        --pure-python .venv/bin/python [--trace conversation_trace.jsonl --max-requests 300]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline.json"
# The two backends as ``prefixkv replay`` runs them: each through its own engine class.
BACKENDS = ("hash_chain:16", "radix:1")
REFERENCE = "hash_chain-16"  # the index-ops benchmarks' denominator


# ------------------------------------------------------------------ measuring


def replay_times(trace: Path, capacity: int, k: int, repeat: int,
                 max_requests: int | None) -> dict[str, dict[str, float]]:  # fmt: skip
    """Per backend, the least CPU seconds of this process over ``repeat`` interleaved
    replays of ``trace`` (streamed: its decode is inside the replay's time). CPU time,
    not wall time: on a loaded machine a process waits for a core a varying share of
    the wall time, which moved these ratios by half from one run to the next."""
    from prefixkv.adapters.lab.compare import parse_backends
    from prefixkv.adapters.lab.replay import replay
    from prefixkv.adapters.lab.traces import open_trace

    best: dict[str, dict[str, float]] = {}
    for _ in range(repeat):
        for label in BACKENDS:
            (spec,) = parse_backends(label)
            source = open_trace(trace, max_requests=max_requests)
            cpu = time.process_time()
            result = replay(source, spec.make(), spec.num_blocks(capacity), driver=spec.driver,
                            concurrency=k, keep_per_request=False)  # fmt: skip
            got = {"replay_cpu_s": time.process_time() - cpu,
                   "hit_ratio": result.summary()["hit_ratio"]}  # fmt: skip
            old = best.setdefault(label, got)
            old["replay_cpu_s"] = min(old["replay_cpu_s"], got["replay_cpu_s"])
    return best


def conversations(path: Path, tokens: int, seed: int = 0) -> int:
    """A Mooncake-format trace of growing conversations (prompts 1K-30K tokens, outputs
    of 20-400 tokens decoded step by step); returns its prompt tokens.

    Each turn extends its conversation's previous prompt, so later turns hit; eight
    conversations are open at a time, so the K-live replay interleaves them.
    """
    import random

    rng = random.Random(seed)
    lines: list[str] = []
    open_: list[list[int]] = []
    next_id = total = 0
    while total < tokens:
        if len(open_) < 8:
            open_.append([])
        ids = open_[rng.randrange(len(open_))]
        length = min(30_000, 512 * len(ids) + rng.randint(600, 6000))
        need = -(-length // 512)
        ids.extend(range(next_id, next_id + need - len(ids)))
        next_id = max(next_id, ids[-1] + 1)
        record = {"timestamp": len(lines), "input_length": length,
                  "output_length": rng.randint(20, 400), "hash_ids": ids[:need]}  # fmt: skip
        lines.append(json.dumps(record) + "\n")
        total += length
        if length >= 30_000 - 512:
            open_.remove(ids)
    path.write_text("".join(lines))
    return total


def trace_ratios(args: argparse.Namespace, trace: Path, name: str) -> dict[str, float]:
    """The ``trace/...`` ratios of one trace, each the median over ``--repeat`` rounds of
    the ratio within the round (the two sides a few seconds apart, so a change of load
    between rounds cancels); with ``--pure-python`` each round also replays in that
    interpreter."""
    ratios: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        got = replay_times(trace, args.capacity_tokens, args.k, 1, args.max_requests)
        hc, rx = (got[b] for b in BACKENDS)
        if abs(hc["hit_ratio"] - rx["hit_ratio"]) > 0.05:
            print(f"note: {name}: hit ratios {hc['hit_ratio']:.4f} (hash chain) and "
                  f"{rx['hit_ratio']:.4f} (radix) differ", file=sys.stderr)  # fmt: skip
        key = f"trace/{name}/replay CPU: radix:1 / hash_chain:16"
        ratios.setdefault(key, []).append(rx["replay_cpu_s"] / hc["replay_cpu_s"])
        if args.pure_python:
            pure = pure_times(args, trace)
            for label in BACKENDS:
                key = f"trace/{name}/replay CPU {label}: {build_kind()} / pure Python"
                ratio = got[label]["replay_cpu_s"] / pure[label]["replay_cpu_s"]
                ratios.setdefault(key, []).append(ratio)
    return {key: statistics.median(values) for key, values in ratios.items()}


def pure_times(args: argparse.Namespace, trace: Path) -> dict[str, dict[str, float]]:
    """One round of :func:`replay_times` run by the ``--pure-python`` interpreter."""
    cmd = [args.pure_python, str(Path(__file__).resolve()), "--times-only", "--trace",
           str(trace), "--capacity-tokens", str(args.capacity_tokens), "-k", str(args.k),
           "--repeat", "1"]  # fmt: skip
    if args.max_requests is not None:
        cmd += ["--max-requests", str(args.max_requests)]
    child = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if child["build"] == build_kind():
        raise SystemExit(f"--pure-python {args.pure_python} runs the {child['build']} build "
                         "too; give the pure-Python environment's interpreter")  # fmt: skip
    times: dict[str, dict[str, float]] = child["times"]
    return times


def index_op_ratios(path: Path) -> dict[str, float]:
    """Each radix tree's least time over the hash chain's, per index-ops benchmark and
    size (pytest-benchmark's JSON of ``test_index_ops.py``)."""
    data = json.loads(path.read_text())
    groups: dict[str, dict[str, float]] = {}
    for bench in data["benchmarks"]:
        if "test_index_ops.py" not in bench.get("fullname", ""):
            continue
        params = dict(bench.get("params") or {})
        if "name" not in params or "bs" not in params:
            continue
        backend = f"{params.pop('name')}-{params.pop('bs')}"
        test = bench["name"].split("[", 1)[0]
        sizes = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
        groups.setdefault(f"index_ops/{test}[{sizes}]", {})[backend] = bench["stats"]["min"]
    out = {}
    for key, by_backend in sorted(groups.items()):
        ref = by_backend.get(REFERENCE)
        for backend, seconds in sorted(by_backend.items()):
            if ref and backend != REFERENCE:
                out[f"{key}: {backend} / {REFERENCE}"] = seconds / ref
    return out


def engine_ratios(args: argparse.Namespace) -> dict[str, float]:
    """``peers/head_to_head.py``'s ratios, prefixkv against the engines' own code."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "h2h.json"
        subprocess.run([sys.executable, str(HERE / "peers" / "head_to_head.py"), "--vllm-python",
                        args.vllm_python, "--sglang-python", args.sglang_python, "--repeat",
                        str(args.repeat), "--json", str(out)], check=True)  # fmt: skip
        rows = json.loads(out.read_text())
    return {f"engines/{r['workload']}/{r['measure']} vs {r['reference']}": r["ratio"]
            for r in rows}  # fmt: skip


def build_kind() -> str:
    from prefixkv.indexes.buildinfo import build_kind as kind

    return kind()


# ------------------------------------------------------------------ comparing


def compare(ratios: dict[str, float], baseline: dict[str, float],
            tolerance: float) -> list[str]:  # fmt: skip
    """Print every ratio beside its baseline; return the keys that moved too far."""
    moved = []
    width = max(map(len, ratios), default=10)
    print(f"{'ratio':{width}} {'now':>8} {'baseline':>9} {'change':>7}")
    for key, now in ratios.items():
        base = baseline.get(key)
        if base is None:
            print(f"{key:{width}} {now:8.3f} {'-':>9} {'new':>7}")
            continue
        change = now / base - 1
        flag = ""
        if abs(change) > tolerance:
            moved.append(key)
            flag = "  MOVED"
        print(f"{key:{width}} {now:8.3f} {base:9.3f} {change:+7.0%}{flag}")
    return moved


def machine() -> dict[str, Any]:
    """What the baseline was measured on: CPU, cores, Python, build, load, date."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    now = datetime.datetime.now(datetime.timezone.utc)
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "build": build_kind(), "load_1min": None if load is None else round(load[0], 2),
            "date": now.strftime("%Y-%m-%d %H:%M UTC")}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--index-ops", type=Path,
                    help="pytest-benchmark JSON holding test_index_ops.py's results")  # fmt: skip
    ap.add_argument("--trace", type=Path, action="append", default=[],
                    help="a trace to replay (any format replay reads); default: generated "
                    "conversations")  # fmt: skip
    ap.add_argument("--tokens", type=int, default=4_000_000,
                    help="prompt tokens of the generated trace")  # fmt: skip
    ap.add_argument("--max-requests", type=int, default=None)
    ap.add_argument("--capacity-tokens", type=int, default=400_000)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pure-python", help="the pure-Python build's interpreter (compiled / pure)")
    ap.add_argument("--vllm-python")
    ap.add_argument("--sglang-python")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--tolerance", type=float, default=0.2)
    ap.add_argument("--update", action="store_true", help="record these ratios as the baseline")
    ap.add_argument("--note", default="", help="with --update: a note kept in the baseline")
    ap.add_argument("--times-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.times_only:  # the child run by --pure-python
        (trace,) = args.trace
        times = replay_times(trace, args.capacity_tokens, args.k, args.repeat, args.max_requests)
        print(json.dumps({"build": build_kind(), "times": times}))
        return 0
    t0 = time.perf_counter()
    ratios: dict[str, float] = {}
    if args.index_ops is not None:
        ratios.update(index_op_ratios(args.index_ops))
    with tempfile.TemporaryDirectory() as tmp:
        traces: Iterable[tuple[Path, str]] = [(t, t.stem) for t in args.trace]
        if not args.trace:
            path = Path(tmp) / "conversations.jsonl"
            conversations(path, args.tokens)
            traces = [(path, f"conversations-{args.tokens}")]
        for path, name in traces:
            if args.max_requests is not None:
                name = f"{name}[:{args.max_requests}]"
            ratios.update(trace_ratios(args, path, name))
    if args.vllm_python and args.sglang_python:
        ratios.update(engine_ratios(args))
    ratios = {k: round(v, 4) for k, v in ratios.items()}
    stored = json.loads(args.baseline.read_text()) if args.baseline.exists() else {}
    moved = compare(ratios, stored.get("ratios", {}), args.tolerance)
    print(f"guard: {len(ratios)} ratios in {time.perf_counter() - t0:.0f} s, "
          f"{len(moved)} moved by more than {args.tolerance:.0%}")  # fmt: skip
    if args.update:
        record = {"machine": machine(), "note": args.note,
                  "ratios": {**stored.get("ratios", {}), **ratios}}  # fmt: skip
        args.baseline.write_text(json.dumps(record, indent=1) + "\n")
        print(f"baseline recorded: {args.baseline}")
        return 0
    if moved:
        print("guard: a ratio moved; if that was meant (a speed-up), record the baseline again "
              "with `make bench-baseline`", file=sys.stderr)  # fmt: skip
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
