"""End-to-end trace replay: wall time, peak memory, throughput, and where the time goes.

Every figure comes from ``prefixkv replay`` run as a child process (load, scan,
expansion, replay and the result file all counted), its peak RSS read from the
kernel's rusage of that child. Not a CI test; four modes:

    # (a) one trace at one capacity, hash chain (block 16) and radix (page 1)
    python benchmarks/trace_replay.py wall --trace conversation_trace.jsonl \\
        --capacity-tokens 1m -k 8
    # (b) prompt tokens/s, load + replay, prompts of 1K-100K tokens, no eviction
    python benchmarks/trace_replay.py throughput --tokens 20m
    # (c) the same capacity over the trace and over a copy N times longer
    python benchmarks/trace_replay.py memory --trace conversation_trace.jsonl --lengthen 10 \
        --head 1200
    # where the time goes: cProfile of an in-process replay, top functions by own time
    python benchmarks/trace_replay.py profile --trace conversation_trace.jsonl \\
        --index radix --size 1 --capacity-tokens 1m -k 8
    # the same split in instructions (valgrind's callgrind; a loaded machine cannot
    # change them): the lab's share (trace decode, K-live driver, rows) and the engine
    # class's calls, for the first N requests; run it with the compiled build's Python
    python benchmarks/trace_replay.py instructions --trace conversation_trace.jsonl \\
        --capacity-tokens 1m -k 8 --max-requests 1000

Prints one JSON line per run and a Markdown table at the end (five modes in all).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.lab.cli.args import parse_token_count

BACKENDS = {"hash_chain": ("--block-size", 16), "radix": ("--page-size", 1)}


def run_replay(
    trace: Path, index: str, size: int, capacity: int | None, k: int, extra: Sequence[str] = ()
) -> dict[str, Any]:
    """``prefixkv replay`` in a child process: its summary, wall seconds and peak RSS."""
    flag = "--page-size" if index == "radix" else "--block-size"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "hits.jsonl"
        cmd = [sys.executable, "-m", "prefixkv.adapters.lab", "replay", str(trace),
               "--index", index, flag, str(size), "-k", str(k), "-q", "--out", str(out),
               *extra]  # fmt: skip
        if capacity is not None:
            cmd += ["--capacity-tokens", str(capacity)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read() if proc.stderr else ""
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"prefixkv replay failed ({proc.returncode}): {err.strip()}")
        summary = json.loads(out.read_text().splitlines()[-1])["summary"]
    peak = usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    return {
        "index": index,
        "size": size,
        "capacity_tokens": summary["config"]["capacity_tokens"],
        "concurrency": k,
        "requests": summary["requests"],
        "prompt_tokens": summary["total_prompt_tokens"],
        "hit_ratio": round(summary["hit_ratio"], 5),
        "evicted_blocks": summary["evicted_blocks"],
        "wall_s": round(wall, 2),
        "scan_s": round(summary["scan_seconds"], 2),
        "replay_s": round(summary["wall_seconds"], 2),
        "in_index_s": round(summary["seconds_total_in_index"], 2),
        "peak_rss_mib": round(peak / 2**20, 1),
        "prompt_tokens_per_s": round(
            summary["total_prompt_tokens"] / (summary["scan_seconds"] + summary["wall_seconds"])
        ),
    }


def _table(rows: list[dict[str, Any]], cols: Sequence[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r.get(c, '')}" for c in cols) + " |")
    return "\n".join(lines)


def mode_wall(args: argparse.Namespace) -> None:
    rows = []
    for index, (_, size) in BACKENDS.items():
        for _ in range(args.repeat):
            row = run_replay(args.trace, index, size, args.capacity_tokens, args.k)
            print(json.dumps(row), flush=True)
            rows.append(row)
    cols = ["index", "size", "capacity_tokens", "hit_ratio", "wall_s", "scan_s", "replay_s",
            "in_index_s", "peak_rss_mib"]  # fmt: skip
    print(_table(rows, cols))


def synthetic_trace(path: Path, tokens: int, seed: int) -> tuple[int, int]:
    """A Mooncake-format trace of growing conversations, prompts 1K-100K tokens.

    Each session's turn extends its previous prompt (512-token ids), so later turns
    hit; lengths are log-uniform. Returns ``(prompt tokens, no-eviction capacity)``.
    """
    rng = random.Random(seed)
    next_id = total = distinct = largest = 0
    lines = []
    while total < tokens:
        ids: list[int] = []
        length = 0
        for _ in range(rng.randint(2, 8)):
            grow = int(math.exp(rng.uniform(math.log(1000), math.log(100_000))))
            length = min(100_000, max(length + 1000, grow))
            need = -(-length // 512)
            if need > len(ids):
                fresh = need - len(ids)
                ids.extend(range(next_id, next_id + fresh))
                next_id += fresh
            record = {"timestamp": len(lines), "input_length": length, "output_length": 1,
                      "hash_ids": ids[:need]}  # fmt: skip
            lines.append(record)
            total += length
            largest = max(largest, length)
            if total >= tokens:
                break
        distinct += len(ids)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    capacity = distinct * 512 + 64 * len(lines) + 16 * largest
    return total, capacity


def mode_throughput(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "synthetic.jsonl"
        total, capacity = synthetic_trace(trace, args.tokens, args.seed)
        print(json.dumps({"trace_prompt_tokens": total, "capacity_tokens": capacity}))
        for index, size in (("hash_chain", 16), ("radix", 1), ("radix", 16)):
            best = None
            for _ in range(args.repeat):
                row = run_replay(trace, index, size, capacity, 1)
                assert row["evicted_blocks"] == 0, row
                print(json.dumps(row), flush=True)
                if best is None or row["wall_s"] < best["wall_s"]:
                    best = row
            assert best is not None
            rows.append(best)
    cols = ["index", "size", "prompt_tokens", "hit_ratio", "wall_s", "scan_s", "replay_s",
            "in_index_s", "prompt_tokens_per_s", "peak_rss_mib"]  # fmt: skip
    print(_table(rows, cols))


def lengthen(trace: Path, copies: int, out: Path, head: int | None = None) -> None:
    """``copies`` back-to-back copies of (the first ``head`` lines of) a Mooncake trace,
    each with its own hash ids."""
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    records = records[:head]
    offset = 1 + max(h for r in records for h in r["hash_ids"])
    span = 1 + max(r.get("timestamp", 0) for r in records)
    with out.open("w") as f:
        for c in range(copies):
            for r in records:
                copy = dict(r, hash_ids=[h + c * offset for h in r["hash_ids"]],
                            timestamp=r.get("timestamp", 0) + c * span)  # fmt: skip
                f.write(json.dumps(copy) + "\n")


def mode_memory(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        short = Path(tmp) / "x1.jsonl"
        long = Path(tmp) / f"x{args.lengthen}.jsonl"
        lengthen(args.trace, 1, short, args.head)
        lengthen(args.trace, args.lengthen, long, args.head)
        for index, (_, size) in BACKENDS.items():
            base = run_replay(short, index, size, args.capacity_tokens, args.k)
            longer = run_replay(long, index, size, args.capacity_tokens, args.k)
            for row, name in ((base, "1x"), (longer, f"{args.lengthen}x")):
                row["trace"] = name
                print(json.dumps(row), flush=True)
            longer["rss_ratio"] = round(longer["peak_rss_mib"] / base["peak_rss_mib"], 3)
            rows += [base, longer]
    print(_table(rows, ["index", "size", "trace", "requests", "prompt_tokens", "wall_s",
                        "peak_rss_mib", "rss_ratio"]))  # fmt: skip


def mode_profile(args: argparse.Namespace) -> None:
    from prefixkv.adapters.lab.backends import roomy_capacity
    from prefixkv.adapters.lab.compare import parse_backends
    from prefixkv.adapters.lab.replay import replay
    from prefixkv.adapters.lab.traces import open_trace

    label = f"{args.index}:{args.size}"
    (spec,) = parse_backends(label)
    source = open_trace(args.trace, max_requests=args.max_requests)
    capacity = args.capacity_tokens or roomy_capacity(source.scan(), [spec])
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    result = replay(source, spec.make(), spec.num_blocks(capacity), driver=spec.driver,
                    concurrency=args.k, keep_per_request=False)  # fmt: skip
    prof.disable()
    wall = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    root = str(Path(__file__).resolve().parent.parent)
    rows = []
    for (file, line, func), (_, calls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        where = file.replace(root + "/", "") if file.startswith(root) else Path(file).name
        rows.append({"function": f"{where}:{func}", "line": line, "calls": calls,
                     "own_s": round(own, 3), "cum_s": round(cum, 3)})  # fmt: skip
    rows.sort(key=lambda r: -r["own_s"])
    print(json.dumps({"index": label, "wall_s_profiled": round(wall, 2), **result.summary()}))
    print(_table(rows[: args.top], ["function", "line", "calls", "own_s", "cum_s"]))


# The engine classes' calls the lab's seats make (the compiled build names each native
# function CPyDef_<module>___<Class>___<method>, called from Python or compiled code).
ENGINE_CALLS = ("___allocate_slots", "___get_computed_blocks", "KVCacheManager___free",
                "___alloc_for_extend", "___alloc_for_decode", "___cache_unfinished_req",
                "___cache_finished_req")  # fmt: skip


def inclusive_counts(profile: Path) -> tuple[int, dict[str, int]]:
    """A callgrind profile's total and each function's inclusive instructions (outermost
    frames only: a recursive function's inner frames are named ``f'2``)."""
    cmd = ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(profile)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    total, counts = 0, dict[str, int]()
    for m in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+(\S+)", text, re.MULTILINE):
        n, name = int(m.group(1).replace(",", "")), m.group(2)
        if name == "PROGRAM":
            total = n
        elif not name.endswith("'2"):
            fn = name.rsplit(":", 1)[-1]
            counts[fn] = max(counts.get(fn, 0), n)
    return total, counts


def _by_count(item: tuple[str, int]) -> int:
    return -item[1]


def instruction_split(total: int, counts: dict[str, int]) -> dict[str, Any]:
    """Where a replay's instructions went: start-up imports, the scan, the trace decode
    (the requests the replay iterates), the engine classes' calls, the rows written and
    the rest (the K-live driver, the seats' loops, the clock reads)."""
    imports = counts.get("builtin___import__", 0)
    decode = counts.get("enum_next", 0)  # KLive.run's enumerate over the trace
    scan = max(0, counts.get("islice_next", 0) - decode)
    engine = {fn.split("___", 1)[1]: n for fn, n in counts.items()
              if fn.startswith("CPyDef_") and fn.endswith(ENGINE_CALLS)}  # fmt: skip
    rows = counts.get("JSONEncoder_encode", 0) + counts.get("_io_BufferedWriter_write", 0)
    in_engine = sum(engine.values())
    lab = total - imports - in_engine
    return {
        "total_G": total / 1e9,
        "startup_imports_G": imports / 1e9,
        "engine_calls_G": in_engine / 1e9,
        "lab_G": lab / 1e9,
        "lab_scan_G": scan / 1e9,
        "lab_trace_decode_G": decode / 1e9,
        "lab_rows_G": rows / 1e9,
        "lab_driver_G": (lab - scan - decode - rows) / 1e9,
        "engine_G": {k: round(n / 1e9, 3) for k, n in sorted(engine.items(), key=_by_count)},
    }


def mode_instructions(args: argparse.Namespace) -> None:
    for tool in ("valgrind", "callgrind_annotate"):
        if shutil.which(tool) is None:
            raise SystemExit(f"the instructions mode needs {tool} (valgrind's package)")
    rows = []
    for index, (_, size) in BACKENDS.items():
        flag = "--page-size" if index == "radix" else "--block-size"
        with tempfile.TemporaryDirectory() as tmp:
            profile = Path(tmp) / "callgrind.out"
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={profile}",
                   sys.executable, "-m", "prefixkv.adapters.lab", "replay", str(args.trace),
                   "--index", index, flag, str(size), "-k", str(args.k), "-q",
                   "--out", str(Path(tmp) / "hits.jsonl"), "--max-requests",
                   str(args.max_requests),
                   "--capacity-tokens", str(args.capacity_tokens)]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"prefixkv replay under callgrind failed: {proc.stderr[-2000:]}")
            split = instruction_split(*inclusive_counts(profile))
        rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in split.items()}
        row = {"index": index, "requests": args.max_requests, **rounded}
        if not split["engine_G"]:
            row["note"] = "no compiled engine class found: run it with the compiled build"
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(_table(rows, ["index", "requests", "total_G", "startup_imports_G", "engine_calls_G",
                        "lab_G", "lab_trace_decode_G", "lab_driver_G", "lab_rows_G",
                        "lab_scan_G"]))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for name in ("wall", "memory", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--trace", type=Path, required=True)
        p.add_argument("--capacity-tokens", type=parse_token_count, default=1_000_000)
        p.add_argument("-k", type=int, default=8)
        p.add_argument("--repeat", type=int, default=1)
    sub.choices["memory"].add_argument("--lengthen", type=int, default=10)
    sub.choices["memory"].add_argument(
        "--head", type=int, default=None, help="lengthen only the first N requests"
    )
    prof = sub.choices["profile"]
    prof.add_argument("--index", default="hash_chain")
    prof.add_argument("--size", type=int, default=16)
    prof.add_argument("--top", type=int, default=25)
    prof.add_argument("--max-requests", type=int, default=None)
    ins = sub.add_parser("instructions")
    ins.add_argument("--trace", type=Path, required=True)
    ins.add_argument("--capacity-tokens", type=parse_token_count, default=1_000_000)
    ins.add_argument("-k", type=int, default=8)
    ins.add_argument("--max-requests", type=int, default=1000)
    tp = sub.add_parser("throughput")
    tp.add_argument("--tokens", type=parse_token_count, default=20_000_000)
    tp.add_argument("--seed", type=int, default=0)
    tp.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    {"wall": mode_wall, "throughput": mode_throughput, "memory": mode_memory,
     "profile": mode_profile, "instructions": mode_instructions}[args.mode](args)  # fmt: skip


if __name__ == "__main__":
    main()
