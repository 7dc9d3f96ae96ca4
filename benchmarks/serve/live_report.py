"""The live fleet's tables: per policy, per fault run, and the files a run leaves."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from live_run import Fault, LiveRun, RequestRow

from prefixkv.adapters.lab.compare.k_live import percentile

__all__ = ["fault_summary", "markdown", "print_run", "report", "run_row", "write_rows"]

POLICY_COLUMNS = (
    "run", "index", "requests", "predicted_equal_served", "hit_ratio_metrics",
    "hit_ratio_usage", "ttft_p50_ms", "ttft_p90_ms", "sync_p50_ms", "per_server",
)  # fmt: skip
FAULT_COLUMNS = (
    "faults", "requests", "mispredicted", "mispredicted_before", "mispredicted_during",
    "mispredicted_after", "exact_again_from", "sync_timeouts", "stream",
)  # fmt: skip
SIM_COLUMNS = (
    "policy", "requests", "decisions_equal", "hit_ratio_live", "hit_ratio_sim",
    "hit_gap_points", "hits_equal", "ttft_p50_live_ms", "ttft_p50_sim_ms",
)  # fmt: skip


def fault_summary(run: LiveRun, faults: Sequence[Fault]) -> dict[str, Any]:
    """Mispredictions before, during and after the faults, and the first request
    after which every prediction was exact again."""
    start = min(f.start for f in faults)
    end = max(f.start + (f.count if f.kind != "restart" else 1) for f in faults)
    wrong = [r.index for r in run.mispredicted()]
    last_wrong = max(wrong, default=-1)
    return {
        "faults": [f.text for f in faults],
        "requests": len(run.rows),
        "mispredicted": len(wrong),
        "mispredicted_before": sum(1 for i in wrong if i < start),
        "mispredicted_during": sum(1 for i in wrong if start <= i < end),
        "mispredicted_after": sum(1 for i in wrong if i >= end),
        "mispredicted_ids": [run.rows[i].id for i in wrong],
        "exact_again_from": last_wrong + 1 if wrong else start,
        "sync_timeouts": sum(1 for r in run.rows if not r.synced),
        "stream": run.stream_stats,
        "relays": run.relay_stats,
    }


def run_row(run: LiveRun) -> dict[str, Any]:
    """One line of the policy table."""
    ttft = [r.ttft_s for r in run.rows]
    exact = [r.exact for r in run.rows if r.exact is not None]
    return {
        "run": run.name,
        "index": run.index,
        "requests": len(run.rows),
        "hit_ratio_metrics": run.hit_ratio_metrics(),
        "hit_ratio_usage": run.hit_ratio_usage(),
        "predicted_equal_served": f"{sum(exact)}/{len(exact)}" if exact else "n/a",
        "ttft_p50_ms": percentile(ttft, 50) * 1e3,
        "ttft_p90_ms": percentile(ttft, 90) * 1e3,
        "sync_p50_ms": percentile([r.sync_s for r in run.rows], 50) * 1e3,
        "per_server": [
            sum(1 for r in run.rows if r.replica == k) for k in range(len(run.counters_delta))
        ],
    }


def write_rows(path: Path, rows: Sequence[RequestRow]) -> None:
    """A run's requests as CSV (outputs left out)."""
    names = [f for f in RequestRow.__dataclass_fields__ if f != "output"] + ["exact"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, names)
        w.writeheader()
        for r in rows:
            d = asdict(r)
            d.pop("output")
            w.writerow({**d, "exact": r.exact})


def markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table of ``columns`` (floats to 3 significant digits)."""

    def cell(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join(
        "| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |\n" for r in rows
    )


def print_run(run: LiveRun) -> None:
    row = run_row(run)
    print(
        f"  {run.name:<24} hit {row['hit_ratio_metrics']:.3f} "
        f"(usage {row['hit_ratio_usage']:.3f})  predicted == served "
        f"{row['predicted_equal_served']}  TTFT p50 {row['ttft_p50_ms']:.0f} ms  "
        f"p90 {row['ttft_p90_ms']:.0f} ms  per server {row['per_server']}  [{run.wall_s:.0f} s]",
        flush=True,
    )


def report(results: dict[str, Any]) -> str:
    """The tables as markdown."""
    parts = [
        "# The router against a live vLLM fleet\n",
        f"Command: `{results['command']}`  \nMachine: {results['machine']}; "
        f"load average after: {results.get('load_average_after')}  \n"
        f"Trace: {results['trace']}\n",
        "## Policies (fault-free), one request at a time\n",
        markdown(
            [r for r in results["runs"] if not r["faults"]]
            + ([results["peer"]["summary"]] if "summary" in results.get("peer", {}) else []),
            POLICY_COLUMNS,
        ),
    ]
    if results["faults"]:
        parts += [
            "\n## Faults between the servers and the router (llmd, chained index)\n",
            markdown(
                results["faults"],
                FAULT_COLUMNS,
            ),
        ]
    if "peer" in results:
        peer = {k: v for k, v in results["peer"].items() if k != "rows"}
        parts += [
            "\n## Peer router\n",
            "```\n" + json.dumps(peer, indent=1, default=str) + "\n```\n",
        ]
    if results.get("sim"):
        parts += [
            "\n## Simulator (prefixkv cluster's library) vs the live fleet\n",
            "The same requests, in the same order, one at a time; the same with the CLI: "
            f"`{results.get('cluster_command', '')}`\n",
            markdown(results["sim"], SIM_COLUMNS),
        ]
    return "\n".join(parts)
