"""The cluster figures of the README, on Mooncake's conversation and synthetic traces.

Replicas are Mooncake's prefill instances: the default cost profile (Llama-2-70B on two
A100s, from Vidur's profiling data), one output token per request (prefill-only, as
Mooncake's cache experiments), 512-token blocks (the traces' granularity), a 3M-token
KV cache each (Mooncake's per-node "local cache"), the trace's own timestamps
stretched (``--conversation-time-scale`` 2.5, ``--synthetic-time-scale`` 4: each fleet is
busy, round robin near saturation, not swamped). Groups:

* ``policies``: every policy and both bounds at 8 replicas (the hit ratio against
  round robin and the pooled bound, the load CV, Mooncake's TTFT ordering);
* ``frontier``: parameter sweeps (Dynamo's overlap credit and temperature, llm-d's
  3:2:2 preset, SGLang's struct defaults, Ray's imbalance check) for the hit-ratio /
  load-imbalance frontier;
* ``replicas``: 1 to 32 replicas at the load per replica of 8 (first
  ``--sweep-requests`` requests);
* ``capacity``: per-replica capacity from 0.5M to 30M tokens at 8 replicas;
* ``faults``: each fault on its own, for three event-fed and decision-fed policies
  (first ``--fault-requests`` requests).

Each group writes a ``prefixkv cluster`` report (tables, plots, report.md) under
``--out/<trace>/<group>``; ``summary.json`` collects the headline figures.

``--time-budget SECONDS`` bounds the whole benchmark: no run starts once the budget is
spent (the run under way finishes), and what was skipped is printed, listed in
``summary.json`` (``skipped``) and noted in each report it cut short. Ctrl-C writes
the runs that finished the same way. The full ``policies`` group on the conversation
trace takes about 15 minutes on 2 cores.

    python benchmarks/cluster_mooncake.py --conversation conversation_trace.jsonl \\
        --synthetic synthetic_trace.jsonl --out cluster-bench --time-budget 1800
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefixkv.adapters.lab.cluster.experiment import (
    ClusterInterrupted,
    plan_experiment,
    run_experiment,
)
from prefixkv.adapters.lab.cluster.faults import parse_faults
from prefixkv.adapters.lab.cluster.metrics import ClusterResult
from prefixkv.adapters.lab.cluster.run import ClusterSettings
from prefixkv.adapters.lab.outputs.cluster import write_report
from prefixkv.adapters.lab.sim.arrivals import sim_requests
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.traces import ReadSettings, open_trace
from prefixkv.adapters.outputs import atomic_writer
from prefixkv.adapters.router.policies import POLICIES
from prefixkv.adapters.router.routing import BOUNDS, parse_policies

CACHE_AWARE = ("ray_pca", "sglang", "dynamo", "llmd", "mooncake")
FRONTIER = (
    "round_robin,least_outstanding,pooled,"
    "dynamo,dynamo:overlap_score_credit=0.5,dynamo:overlap_score_credit=2,"
    "dynamo:overlap_score_credit=4,dynamo:temperature=0.5,dynamo:temperature=1,"
    "llmd,llmd:prefix_weight=3:kv_weight=2:queue_weight=2,"
    "sglang,sglang:cache_threshold=0.5:balance_abs_threshold=32:balance_rel_threshold=1.1,"
    "ray_pca,ray_pca:imbalanced_threshold=10,mooncake,prefix_hash,pow2"
)
FAULTS = (
    "drop=0.05",
    "drop_removals",
    "delay=0.05,jitter=0.5",
    "kill=3@50%",
    "restart=3@50%",
    "clear=3@50%",
    "router_restart@50%",
    "router_restart@50%:dump",
    "late_join@30%",
    "gap=3@50%",
    "mismatch=3:block_size",
    "mismatch=3:hash",
    "scale_up@30%,scale_down=0@60%",
)


def requests(
    path: Path, limit: int | None, scale: float, n0: int, cfg: ClusterSettings
) -> Iterator[SimRequest]:
    """The trace's requests, prefill-only, at the load per replica of ``n0`` replicas."""
    source = open_trace(path, "mooncake", max_requests=limit, settings=ReadSettings(output=False))
    return sim_requests(source, prefill_only=True, time_scale=scale * n0 / cfg.num_replicas)


def headline(results: list[ClusterResult]) -> dict[str, Any] | None:
    """The targets: the best load-aware policy against pooled, round robin's gap, TTFT
    order (``None`` when round robin, pooled or every cache-aware policy was skipped)."""
    by = {r.labels["policy"]: r for r in results}
    needed = ("pooled", "round_robin", "random", "least_outstanding")
    if any(p not in by for p in needed) or not any(p in by for p in CACHE_AWARE):
        return None
    pooled, rr = by["pooled"].run, by["round_robin"].run
    balanced = [by[p] for p in CACHE_AWARE if p in by and by[p].run.load_cv <= 0.1]
    best = max(balanced, key=lambda r: r.run.hit_ratio, default=None)
    ttft = {p: by[p].run.ttft_mean_s for p in ("random", "least_outstanding", "pooled") if p in by}
    cache_aware = min((by[p] for p in CACHE_AWARE if p in by), key=lambda r: r.run.ttft_mean_s)
    return {
        "pooled_hit": pooled.hit_ratio,
        "infinite_hit": by["infinite"].run.hit_ratio if "infinite" in by else math.nan,
        "round_robin_hit": rr.hit_ratio,
        "round_robin_over_pooled": rr.hit_ratio / pooled.hit_ratio,
        "best_balanced_policy": best.labels["policy"] if best else None,
        "best_balanced_hit": best.run.hit_ratio if best else math.nan,
        "best_balanced_over_pooled": best.run.hit_ratio / pooled.hit_ratio if best else math.nan,
        "best_balanced_load_cv": best.run.load_cv if best else math.nan,
        "ttft_mean_s": {**ttft, "cache_aware": cache_aware.run.ttft_mean_s},
        "ttft_cache_aware_policy": cache_aware.labels["policy"],
        "ttft_over_pooled": {
            k: v / ttft["pooled"]
            for k, v in {**ttft, "cache_aware": cache_aware.run.ttft_mean_s}.items()
        },
    }


def progress(trace: str, group: str) -> Callable[[ClusterResult], None]:
    """Prints one line per finished run."""

    def line(r: ClusterResult) -> None:
        lab, run = r.labels, r.run
        print(
            f"{trace:12} {group:9} {lab['policy']:<40} N={lab['num_replicas']:<3} "
            f"cap={lab['capacity_tokens']:<9} {lab['faults'] or '-':<30} hit {run.hit_ratio:.3f} "
            f"TTFT {run.ttft_mean_s:8.2f} s CV {run.load_cv:.3f} "
            f"{'ok' if not r.invariants.broken() else 'BROKEN'}",
            flush=True,
        )

    return line


def write_json(path: Path, doc: Any) -> None:
    """``doc`` as indented JSON, replacing ``path`` whole (the bench's one output rule)."""
    with atomic_writer(path) as f:
        f.write(json.dumps(doc, indent=1).encode("utf-8"))


class Budget:
    """The time budget: the deadline :func:`run_experiment` gets, and what it skipped."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.skipped: dict[str, list[str]] = {}

    def spent(self) -> bool:
        """Whether no run may start any more."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def skip(self, where: str, what: str) -> None:
        """Record that ``what`` (a run, or a fault plan's runs) of ``where`` was skipped."""
        self.skipped.setdefault(where, []).append(what)

    def note(self, where: str, finished: int, planned: int) -> str:
        """What the report of ``where`` lacks (empty when nothing was skipped)."""
        missed = self.skipped.get(where, [])
        if not missed:
            return ""
        return (
            f"the time budget of {self.seconds:g} s ran out after {finished} of {planned} "
            f"runs; skipped: {'; '.join(missed)}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--conversation", type=Path)
    ap.add_argument("--synthetic", type=Path)
    ap.add_argument("--out", type=Path, default=Path("cluster-bench"))
    ap.add_argument("--groups", default="policies,frontier,replicas,capacity,faults")
    ap.add_argument("--conversation-time-scale", type=float, default=2.5)
    ap.add_argument("--synthetic-time-scale", type=float, default=4.0)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--capacity-tokens", type=int, default=3_000_000)
    ap.add_argument("--max-requests", type=int)
    ap.add_argument("--sweep-requests", type=int, default=4000)
    ap.add_argument("--fault-requests", type=int, default=3000)
    ap.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="start no run after this many seconds; say what was skipped (default: no limit)",
    )
    args = ap.parse_args()
    if args.time_budget is not None and not 0 < args.time_budget < float("inf"):
        ap.error(f"--time-budget must be a positive number of seconds, got {args.time_budget}")

    groups = args.groups.split(",")
    base = ClusterSettings(
        num_replicas=args.replicas,
        capacity_tokens=args.capacity_tokens,
        block_size=512,
        keep_tokens=False,
    )
    summary: dict[str, Any] = {}
    budget = Budget(args.time_budget)
    interrupted = False
    traces = {
        "conversation": (args.conversation, args.conversation_time_scale),
        "synthetic": (args.synthetic, args.synthetic_time_scale),
    }
    for name, (path, scale) in traces.items():
        if path is None or interrupted:
            continue
        for group in groups:
            if interrupted:
                break
            where = f"{name}/{group}"
            t0 = time.perf_counter()
            limit = args.max_requests
            policies = ",".join((*POLICIES, *BOUNDS))
            replicas: list[int] = [args.replicas]
            capacities = [args.capacity_tokens]
            cfg = base
            if group == "frontier":
                policies = FRONTIER
            elif group == "replicas":
                policies = "round_robin,least_outstanding,sglang,llmd,dynamo,pooled,infinite"
                replicas = [1, 2, 4, 8, 16, 32]
                limit = args.sweep_requests
            elif group == "capacity":
                policies = "round_robin,sglang,llmd,dynamo,pooled,infinite"
                capacities = [500_000, 1_000_000, 3_000_000, 10_000_000, 30_000_000]
                limit = args.sweep_requests
            elif group == "faults":
                policies = "dynamo,llmd,sglang"
                limit = args.fault_requests
                cfg = dataclasses.replace(base, keep_tokens=True, buffer_steps=1000)
            specs = parse_policies(policies, tuple(POLICIES))
            results: list[ClusterResult] = []
            planned, stopped = 0, False
            fault_list = (None, *FAULTS) if group == "faults" else (None,)
            for spec_text in fault_list:
                plan = None
                if spec_text is not None:
                    if budget.spent():  # resolving the plan reads the trace: skip that too
                        runs = sum(not s.is_bound for s in specs)
                        planned += runs
                        budget.skip(where, f"{runs} runs with faults {spec_text}")
                        continue
                    span_reqs = list(requests(path, limit, scale, args.replicas, cfg))
                    span = (span_reqs[-1].arrival or 0.0) - (span_reqs[0].arrival or 0.0)
                    plan = parse_faults(spec_text).resolve(span)
                runs = plan_experiment(specs, cfg, replicas=replicas, capacities=capacities,
                                       faults=plan, fault_free=spec_text is None)  # fmt: skip
                planned += len(runs)
                try:
                    results += run_experiment(
                        lambda c, path=path, limit=limit, scale=scale: requests(
                            path, limit, scale, args.replicas, c
                        ),
                        runs,
                        on_run=progress(name, group),
                        deadline=budget.deadline,
                        on_skip=lambda run, where=where: budget.skip(where, run.describe()),
                    )
                except ClusterInterrupted as stop:  # Ctrl-C: write what finished, then stop
                    results += stop.results
                    stopped = interrupted = True
                    break
            summary.setdefault("wall_s", {})[where] = round(time.perf_counter() - t0)
            note = budget.note(where, len(results), planned)
            if stopped:
                note = f"interrupted (Ctrl-C) after {len(results)} of {planned} runs"
            if note:
                summary.setdefault("skipped", {})[where] = note
                print(f"{where}: {note}", flush=True)
            if results:
                write_report(
                    results,
                    args.out / name / group,
                    command=f"python benchmarks/cluster_mooncake.py --groups {group} ...",
                    source=f"Mooncake {name} trace, prefill-only, timestamps x {scale} "
                    f"(x {args.replicas}/N when sweeping N)",
                    requests_table=False,
                    partial=note,
                )
            if group == "policies" and results:
                summary[name] = headline(results)
            write_json(args.out / "summary.json", summary)
    print(json.dumps(summary, indent=1))
    if interrupted:
        raise SystemExit(130)


if __name__ == "__main__":
    main()
