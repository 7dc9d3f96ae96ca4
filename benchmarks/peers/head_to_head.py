"""Head to head with the real engines: prefixkv against vLLM 0.33 and SGLang 0.5.23.

Replays the same traces through the vLLM and SGLang replay oracles (which drive the
engines' own prefix-cache code on CPU, like their schedulers) and through prefixkv's
vLLM- and SGLang-shaped engine classes, in one run on one machine, checks that the hits
agree request for request, and prints the ratios of the performance goals:

* hash chain: index time per request (hashing, lookup, allocation, registration,
  free) against vLLM's ``KVCacheManager``. Both sides time the same work, each call
  between two ``perf_counter`` reads: vLLM's block hasher (called from
  ``Request.__init__`` and ``append_output_token_ids``; building the request and
  appending the token are not timed), ``get_computed_blocks``, ``allocate_slots``
  (admission, each decode step) and ``free``; prefixkv's ``get_computed_blocks`` (its
  hashing included), ``allocate_slots`` (hashing a block that fills) and ``free``.
  ``new_step_starts`` is left out on both sides: a no-op for one full-attention group
  in vLLM (``SingleTypeKVCacheManager.new_step_starts`` returns ``None``) and in
  prefixkv; the oracle still reports its time;
* radix tree (page 1): ``match_prefix`` calls/s against SGLang's ``RadixCache`` and
  its Rust core (``UnifiedRadixCache``), insert time (``cache_(un)finished_req``),
  and the whole replay's time in the tree.

Not part of the test suite. Needs the side environments (tests/README.md,
"The engine tests and the recorders"):

    python benchmarks/peers/head_to_head.py \\
        --vllm-python .peers/vllm/bin/python --sglang-python .peers/sglang/bin/python
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.lab.replay import Driver, ReplayResult, replay
from prefixkv.adapters.lab.traces import TraceRequest, load_any, write_trace
from prefixkv.adapters.lab.workloads import make_workload
from prefixkv.indexes import make_index
from prefixkv.indexes.buildinfo import build_kind
from prefixkv.indexes.registry import pool_owned_options

# The engines' replay oracles (the same ones that recorded the fidelity fixtures).
ORACLES = Path(__file__).resolve().parents[2] / "tests" / "engines" / "recorders"

# The anchor workloads: a few hundred requests, ~1.2K-token prompts, 5-80 output tokens.
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "shared_system_prompt": (
        "shared_system_prompt",
        {"num_requests": 400, "system_len": 1024, "user_len": (64, 320), "output_len": (5, 80)},
    ),
    "multi_turn": ("multi_turn", {"num_sessions": 48, "system_len": 256}),
    "long_document": ("long_document", {"num_documents": 12}),
}
# The oracle's call kinds summed; its "step_other" (new_step_starts) is a no-op on
# both sides and is reported in the detail only.
VLLM_CALLS = ("hash", "lookup", "allocate_prefill", "allocate_decode", "free")
INSERT_CALLS = ("cache_unfinished_req", "cache_finished_req")


class TimedIndex:
    """Wraps an index and sums the seconds spent in each of its methods."""

    TIMED = ("match_prefix", "insert", "lock", "unlock", "relock", "evict")

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        for name in self.TIMED:
            setattr(self, name, self._timed(name))

    def _timed(self, name: str) -> Callable[..., Any]:
        method = getattr(self.inner, name)
        seconds, calls = self.seconds, self.calls

        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - t0
                calls[name] = calls.get(name, 0) + 1

        return call

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_oracle(cmd: Sequence[str]) -> dict[str, Any]:
    """Run one oracle command; its hits and summary."""
    subprocess.run(list(cmd), check=True, stdout=subprocess.DEVNULL)
    out = Path(cmd[list(cmd).index("--out") + 1])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    return {"hits": [r["hit_tokens"] for r in lines if "id" in r], "summary": lines[-1]["summary"]}


def min_by_call(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per call kind, the least seconds over repeated runs (the least disturbed one)."""
    return {k: min(r.get(k, 0.0) for r in runs) for k in runs[0]}


def _each_call() -> None:
    """The step hook that makes a replay time each engine-class call alone."""


def replay_best(
    reqs: list[TraceRequest], name: str, block_size: int, num_blocks: int, driver: Driver,
    repeat: int, time_methods: bool = True,
) -> tuple[ReplayResult, dict[str, float], dict[str, float], dict[str, int]]:  # fmt: skip
    """``repeat`` replays with garbage collection paused; the least seconds per call kind
    (engine class calls) and per index method, and the first result (its hits). Without
    ``time_methods`` the index runs unwrapped (the wrapper's own calls are not in the
    engine class times then) and no method times come back."""
    results: list[ReplayResult] = []
    timed: list[TimedIndex] = []
    for _ in range(repeat):
        index = make_index(name, block_size=block_size, **pool_owned_options(name))
        if time_methods:
            spy = TimedIndex(index)
            timed.append(spy)
            index = spy
        gc.collect()
        gc.disable()
        try:
            # A step hook, even one that does nothing, makes the seat time each decode
            # call on its own, as the engines' oracles time theirs; without one it times
            # the whole decode loop, the lab's bookkeeping between the calls with it.
            results.append(replay(reqs, index, num_blocks, driver=driver, on_step=_each_call))
        finally:
            gc.enable()
    by_call = min_by_call([r.seconds_by_call for r in results])
    if not timed:
        return results[0], by_call, {}, {}
    by_method = min_by_call([t.seconds for t in timed])
    return results[0], by_call, by_method, timed[0].calls


def row(workload: str, what: str, ref_name: str, ref: float, ours: float, ratio: float,
        goal: str) -> dict[str, Any]:  # fmt: skip
    return {"workload": workload, "measure": what, "reference": ref_name, "ref": ref,
            "prefixkv": ours, "ratio": ratio, "goal": goal}  # fmt: skip


def hash_chain_rows(args: argparse.Namespace, name: str, reqs: list[TraceRequest],
                    trace: Path, tmp: Path) -> list[dict[str, Any]]:  # fmt: skip
    """vLLM's KVCacheManager against the hash chain behind prefixkv's vLLM KVCacheManager."""
    n = len(reqs)
    blocks = sum(len(r.tokens) + len(r.output) for r in reqs) // 16 + 4 * n  # no eviction
    cmd = [args.vllm_python, str(ORACLES / "vllm_oracle.py"), str(trace), "--num-blocks",
           str(blocks + 1), "--repeat", "1", "--out", str(tmp / "v.jsonl"),
           "--quiet"]  # fmt: skip
    # One replay of each engine in turn, repeated: a drift in the machine's pace (a
    # noisy neighbour, a frequency change) then meets both sides alike, where timing all
    # of vLLM's replays before all of ours let it land on one side only.
    refs: list[dict[str, Any]] = []
    mine_runs: list[dict[str, float]] = []
    for _ in range(args.repeat):
        refs.append(run_oracle(cmd))
        ours, by_call, _, _ = replay_best(reqs, "hash_chain", 16, blocks, "vllm", 1, False)
        mine_runs.append(by_call)
        if [h["hit_tokens"] for h in ours.hits] != refs[-1]["hits"]:
            raise SystemExit(f"{name}: hash chain hits differ from vLLM's")
    ref_s = min_by_call([v["summary"]["seconds_min"] for v in refs])
    by_call = min_by_call(mine_runs)
    ref = sum(ref_s[k] for k in VLLM_CALLS)
    mine = sum(by_call.values())
    out = row(name, "hash chain: index µs per request", "vLLM 0.33 KVCacheManager",
              ref / n * 1e6, mine / n * 1e6, mine / ref, "<= 0.0625")  # fmt: skip
    out["detail_seconds"] = {"vllm": dict(ref_s), "prefixkv": by_call}
    return [out]


def radix_rows(args: argparse.Namespace, name: str, reqs: list[TraceRequest], trace: Path,
               tmp: Path) -> list[dict[str, Any]]:  # fmt: skip
    """SGLang's RadixCache and Rust core against the radix tree behind the SGLang engine class."""
    n = len(reqs)
    cap = sum(len(r.tokens) + len(r.output) for r in reqs) + 8 * n  # no eviction
    runs: dict[str, list[dict[str, Any]]] = {"radix": [], "unified-rust": []}
    for _ in range(args.repeat):  # the oracle times one replay; repeat it, keep the least
        for cache in runs:
            cmd = [args.sglang_python, str(ORACLES / "sglang_oracle.py"), str(trace),
                   "--page-size", "1", "--capacity-tokens", str(cap), "--concurrency", "1",
                   "--cache", cache, "--out", str(tmp / f"s-{cache}.jsonl")]  # fmt: skip
            runs[cache].append(run_oracle(cmd))
    ours, by_call, by_method, calls = replay_best(reqs, "radix", 1, cap, "sglang", args.repeat)
    for cache, rs in runs.items():
        if any([h["hit_tokens"] for h in ours.hits] != r["hits"] for r in rs):
            raise SystemExit(f"{name}: radix hits differ from SGLang ({cache})")
    ref_calls = {c: min_by_call([r["summary"]["seconds_by_call"] for r in rs])
                 for c, rs in runs.items()}  # fmt: skip
    ref_n = {c: rs[0]["summary"]["calls_by_call"] for c, rs in runs.items()}
    out = []
    mine_mps = calls["match_prefix"] / by_method["match_prefix"]
    for label, cache, goal in (("SGLang RadixCache", "radix", ">= 4"),
                               ("SGLang Rust core", "unified-rust", ">= 4")):  # fmt: skip
        mps = ref_n[cache]["match_prefix"] / ref_calls[cache]["match_prefix"]
        out.append(row(name, "radix: match_prefix calls/s", label, mps, mine_mps,
                       mine_mps / mps, goal))  # fmt: skip
    sg = ref_calls["radix"]
    ref_ins = sum(sg.get(k, 0.0) for k in INSERT_CALLS)
    mine_ins = sum(by_call.get(k, 0.0) for k in INSERT_CALLS)
    out.append(row(name, "radix: insert µs per request (speed-up)", "SGLang RadixCache",
                   ref_ins / n * 1e6, mine_ins / n * 1e6, ref_ins / mine_ins, ">= 4"))  # fmt: skip
    ref_tree = sum(sg.values())
    # SGLang's decode-step slot allocation runs in its allocator, outside the tree's
    # methods; prefixkv's alloc_for_decode is that allocation (no eviction here).
    mine_tree = sum(by_call.values()) - by_call.get("alloc_for_decode", 0.0)
    out.append(row(name, "radix: whole replay in the tree, s", "SGLang RadixCache",
                   ref_tree, mine_tree, mine_tree / ref_tree, "<= 0.5"))  # fmt: skip
    mine_all = sum(by_call.values())
    out.append(row(name, "radix: same, + decode slot allocation", "SGLang RadixCache",
                   ref_tree, mine_all, mine_all / ref_tree, "(context)"))  # fmt: skip
    out[-1]["detail_seconds"] = {"sglang": sg, "prefixkv": by_call}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--sglang-python", required=True)
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    ap.add_argument("--trace", action="append", default=[], help="extra trace files")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    traces = {w: make_workload(WORKLOADS[w][0], **WORKLOADS[w][1])
              for w in args.workload or list(WORKLOADS)}  # fmt: skip
    for t in args.trace:
        traces[Path(t).stem] = load_any(t, max_requests=400, tokens_per_id=16)
    rows: list[dict[str, Any]] = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, reqs in traces.items():
            trace = tmp / f"{name}.jsonl"
            write_trace(trace, reqs)
            rows += hash_chain_rows(args, name, reqs, trace, tmp)
            rows += radix_rows(args, name, reqs, trace, tmp)
    load_after = os.getloadavg()[0]
    print(f"{platform.machine()}, Python {platform.python_version()}, prefixkv {build_kind()} "
          f"build, best of {args.repeat} replays each; hits equal the engines' request for "
          f"request; 1-minute load average {load_before:.1f} at the start, {load_after:.1f} "
          "at the end")  # fmt: skip
    head = ("workload", "measure", "reference", "reference", "prefixkv", "ratio", "goal")
    print(f"{head[0]:21} {head[1]:40} {head[2]:25} {head[3]:>10} {head[4]:>10} {head[5]:>6}  goal")
    for r in rows:
        print(f"{r['workload']:21} {r['measure']:40} {r['reference']:25} {r['ref']:10.4g} "
              f"{r['prefixkv']:10.4g} {r['ratio']:6.3f}  {r['goal']}")  # fmt: skip
    if args.json:
        for r in rows:  # each row says the run's conditions
            r["build"] = build_kind()
            r["load_average_1min"] = [load_before, load_after]
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
