"""The cluster report: tables (CSV, JSON), plots and ``report.md`` for a set of runs.

Runs fall in three groups, told apart by their labels: fault-free runs at the main
fleet size and capacity (the policy comparison), the sweeps over fleet size and
capacity, and fault runs. Ratios are reported against round robin and the pooled
figure of the same fleet ("efficiency" = hit / pooled hit, the honest global-vs-local
number); the report says what the pooled figure is, and flags a policy above it (it
is a bound only when admissions happen at the same times).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.lab.sim.tables import write_rows

from . import plots
from .metrics import ClusterResult

__all__ = ["POOLED_MEANING", "bound_notes", "write_report"]


def _key(res: ClusterResult) -> tuple[Any, ...]:
    return (res.labels["num_replicas"], res.labels["capacity_tokens"])


def _fmt(value: float, digits: int = 3) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _policy_table(runs: Sequence[ClusterResult], all_runs: Sequence[ClusterResult]) -> list[str]:
    ref = {
        name: {
            _key(r): r for r in all_runs if r.labels["policy"] == name and not r.labels["faults"]
        }
        for name in ("round_robin", "pooled", "random")
    }
    lines = [
        "| policy | index | hit ratio | / round robin | / pooled | TTFT mean (s) | TTFT p90 (s) "
        "| load CV | decision p99 (us, CPU / wall) | overlap MAE (tok) | phantom |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        run = r.run
        rr = ref["round_robin"].get(_key(r))
        pooled = ref["pooled"].get(_key(r))
        vs_rr = run.hit_ratio / rr.run.hit_ratio if rr and rr.run.hit_ratio else math.nan
        vs_pool = (
            run.hit_ratio / pooled.run.hit_ratio if pooled and pooled.run.hit_ratio else math.nan
        )
        lines.append(
            f"| {r.labels['policy']} | {r.labels['index']} | {_fmt(run.hit_ratio)} "
            f"| {_fmt(vs_rr, 2)} | {_fmt(vs_pool, 2)} | {_fmt(run.ttft_mean_s, 2)} "
            f"| {_fmt(run.ttft_p90_s, 2)} | {_fmt(run.load_cv)} "
            f"| {_fmt(run.decision_cpu_p99_us, 0)} / {_fmt(run.decision_p99_us, 0)} "
            f"| {_fmt(run.overlap_mae_tokens, 0)} | {_fmt(run.phantom_rate, 3)} |"
        )
    return lines


POOLED_MEANING = (
    "pooled: one cache of N x capacity that every request reaches, each admitted when "
    "it arrives (Mooncake's global cache). It bounds a policy's hits only when admissions "
    "happen in the same order at the same times: a policy whose replicas queue requests "
    "admits them later, after more of what they share is cached, and can beat it. "
    "infinite: the same with no capacity limit."
)


def bound_notes(runs: Sequence[ClusterResult], all_runs: Sequence[ClusterResult]) -> list[str]:
    """One line per policy whose hit ratio is above the pooled (or infinite) figure of
    the same fleet: that figure is then no bound, and the line says so."""
    ref = {
        name: {
            _key(r): r for r in all_runs if r.labels["policy"] == name and not r.labels["faults"]
        }
        for name in ("pooled", "infinite")
    }
    out = []
    for r in runs:
        policy = r.labels["policy"]
        if policy in ("pooled", "infinite"):
            continue
        for name, what in (("pooled", "the pooled figure"), ("infinite", "the infinite cache")):
            bound = ref[name].get(_key(r))
            if bound is not None and r.run.hit_ratio > bound.run.hit_ratio + 1e-12:
                out.append(
                    f"**{policy} is above {what}** ({r.run.hit_ratio:.3f} > "
                    f"{bound.run.hit_ratio:.3f} at {_key(r)[0]} replicas x {_key(r)[1]} tokens): "
                    f"{name} is not a bound here; its replicas admitted requests later than "
                    f"{name} did (queueing), after more of their prefixes were cached."
                )
    return out


def _fault_table(
    runs: Sequence[ClusterResult], base: dict[tuple[Any, ...], ClusterResult]
) -> list[str]:
    lines = [
        "| policy | faults | hit ratio | fault-free | dropped | gaps | replays | restarts "
        "| resyncs | rerouted | swept | phantom blocks | invariants |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b = base.get((r.labels["policy"], *_key(r)))
        s = r.stats
        broken = r.invariants.broken()
        lines.append(
            f"| {r.labels['policy']} | `{r.labels['faults']}` | {_fmt(r.run.hit_ratio)} "
            f"| {_fmt(b.run.hit_ratio) if b else '-'} | {s.get('dropped_batches', 0)} "
            f"| {s.get('gaps', '-')} | {s.get('replays', '-')} | {s.get('restarts', '-')} "
            f"| {s.get('resyncs', '-')} | {r.run.rerouted_requests} | {r.run.swept_reservations} "
            f"| {r.invariants.phantom_blocks} | {'hold' if not broken else '; '.join(broken)} |"
        )
    return lines


def write_report(
    results: Sequence[ClusterResult],
    out_dir: str | os.PathLike[str],
    *,
    command: str = "",
    source: str = "",
    requests_table: bool = True,
) -> list[Path]:
    """Write ``runs.csv``, ``requests.csv``, ``results.json``, the plots and ``report.md``.

    Args:
        results: every run.
        out_dir: the folder (created).
        command: the command line, quoted in the report.
        source: what the requests were (trace, arrivals).
        requests_table: also write one row per request of every run.

    Returns:
        The files written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [write_rows(out / "runs.csv", [r.run_row() for r in results])]
    if requests_table:
        rows = [
            {"policy": r.labels["policy"], "num_replicas": r.labels["num_replicas"],
             "capacity_tokens": r.labels["capacity_tokens"], "faults": r.labels["faults"],
             **q.as_row(r.labels["block_size"])}
            for r in results
            for q in r.requests
        ]  # fmt: skip
        files.append(write_rows(out / "requests.csv", rows))
    payload = [
        {"labels": dict(r.labels), "run": r.run_row(), "stats": r.stats,
         "invariants_broken": r.invariants.broken()}
        for r in results
    ]  # fmt: skip
    (out / "results.json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    files.append(out / "results.json")

    clean = [r for r in results if not r.labels["faults"]]
    faulty = [r for r in results if r.labels["faults"]]
    main_key = _key(results[0])
    main = [r for r in clean if _key(r) == main_key]
    md = [
        "# prefixkv cluster report",
        "",
        f"- requests: {source}" if source else "",
        f"- command: `{command}`" if command else "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"{platform.system()}",
        f"- fleet: {results[0].labels['backend']} replicas, "
        f"block size {results[0].labels['block_size']}",
        "",
        f"## Policies at {main_key[0]} replicas x {main_key[1]} tokens",
        "",
        *_policy_table(main, clean),
        "",
        POOLED_MEANING,
        "",
        *(line for note in bound_notes(main, clean) for line in (note, "")),
    ]
    if main:
        files.append(plots.plot_hit_ratio(main, out / "hit_ratio.png"))
        files.append(plots.plot_frontier(main, out / "frontier.png"))
        files.append(plots.plot_ttft_cdf(main, out / "ttft_cdf.png"))
        files.append(plots.plot_overlap(main, out / "overlap.png"))
        files.append(plots.plot_decision_latency(main, out / "decision_latency.png"))
        md += [
            f"![{p}]({p}.png)"
            for p in ("hit_ratio", "frontier", "ttft_cdf", "overlap", "decision_latency")
        ]
        md.append("")
    for key, label, name in (
        ("num_replicas", "replicas (log scale)", "hit_vs_replicas"),
        ("capacity_tokens", "KV capacity per replica (tokens, log scale)", "hit_vs_capacity"),
    ):
        other = "capacity_tokens" if key == "num_replicas" else "num_replicas"
        sweep = [r for r in clean if r.labels[other] == results[0].labels[other]]
        if len({r.labels[key] for r in sweep}) > 1:
            files.append(plots.plot_sweep(sweep, key, out / f"{name}.png", xlabel=label))
            md += [
                f"## Hit ratio against {key}",
                "",
                *_policy_table(sweep, clean),
                "",
                f"![{name}]({name}.png)",
                "",
            ]
    if faulty:
        base = {(r.labels["policy"], *_key(r)): r for r in clean}
        files.append(
            plots.plot_faults(
                faulty, lambda r: base.get((r.labels["policy"], *_key(r))), out / "faults.png"
            )
        )
        md += ["## Fault runs", "", *_fault_table(faulty, base), "", "![faults](faults.png)", ""]
    (out / "report.md").write_text(
        "\n".join(line for line in md if line is not None) + "\n", encoding="utf-8"
    )
    files.append(out / "report.md")
    return files
