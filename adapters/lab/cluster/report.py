"""The cluster report: tables (CSV, JSON), plots and ``report.md`` for a set of runs.

Runs fall in four groups, told apart by their labels: fault-free runs at the main
fleet size and capacity (the policy comparison), the sweeps over fleet size and
capacity, fault runs, and the request-rate sweep's runs (role ``rate``; their load
table is :mod:`.load_report`'s). Ratios are reported against round robin and the pooled
figure of the same fleet ("efficiency" = hit / pooled hit, the honest global-vs-local
number). As compare's report does, it defines every column, titles every plot with the
trace, the fleet and the arrivals, says what the pooled figure is, and says in notes
when the fleet is overloaded or a policy is above the pooled or infinite figure (a
bound only when admissions happen at the same times); an interrupted experiment's
report says it is partial. Every file is written whole or not at all.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.lab.sim.tables import write_rows
from prefixkv.adapters.outputs import atomic_writer

from ..extras import require_extra
from . import plots
from .load_report import header_lines, load_section
from .metrics import ClusterResult
from .rate_sweep import is_rate_run

__all__ = [
    "FAULT_COLUMNS",
    "GROWTH_LIMIT",
    "OUTPUT_NAMES",
    "POLICY_COLUMNS",
    "POOLED_MEANING",
    "RESULTS_FORMAT",
    "report_notes",
    "write_report",
]

RESULTS_FORMAT = "prefixkv-cluster/2"
"""The ``format`` of results.json: version 2 is an object (the command, ``partial``,
``runs``); version 1 was the bare list of runs."""

OUTPUT_NAMES = (
    "report.md", "results.json", "runs.csv", "requests.csv", "hit_ratio.png", "frontier.png",
    "ttft_cdf.png", "overlap.png", "decision_latency.png", "hit_vs_replicas.png",
    "hit_vs_capacity.png", "faults.png",
)  # fmt: skip
"""Every file :func:`write_report` may write (checked before the first run)."""

GROWTH_LIMIT = 3.0
"""TTFT growth (last quarter of arrivals over the first) above which a run is called
overloaded even when its offered load is below 1."""

POLICY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "the routing policy (`name[@index][:key=value]`); pooled and infinite are "
     "the bounds: one cache of N x capacity, and one that never evicts"),
    ("index", "the router's cluster index: chained (hash chain), radix (block tree), "
     "approx (decision history), none"),
    ("hit ratio", "prompt tokens served from cache over all prompt tokens, at each "
     "request's first admission (Dynamo's cache efficiency)"),
    ("/ round robin", "hit ratio over round robin's, same fleet"),
    ("/ pooled", "hit ratio over the pooled figure, same fleet (above 1: see the notes)"),
    ("TTFT mean, p90 (s)", "arrival to the end of the step that produced the first "
     "output token, in simulated seconds"),
    ("offered load", "compute seconds the replicas needed per second of arrivals, per "
     "replica; above 1 the queues grow without bound"),
    ("TTFT growth", "mean TTFT of the last quarter of arrivals over the first quarter's: "
     "near 1 in a steady state"),
    ("req/s offered / achieved", "requests per second over the arrival window, and "
     "finished per second from the first arrival to the last finish; overloaded also when "
     "the achieved rate is over 10% short and queueing grows over 0.1 s per s of run"),
    ("load CV", "coefficient of variation (population std / mean) of the seconds each "
     "replica spent computing: 0 is perfectly even"),
    ("decision p99 (µs)", "the router's time per decision, 99th percentile: CPU time of "
     "its thread / wall clock; hashing the prompt's blocks excluded"),
    ("overlap MAE (tok)", "mean absolute error of the index's predicted hit tokens on the "
     "chosen replica against the hit it then got"),
    ("phantom", "share of predictions above the realized hit: blocks the router "
     "believed cached that were not (stale information)"),
)  # fmt: skip
"""The policy table's columns and their definitions (the report prints both)."""

FAULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("faults", "the injected faults (`--faults`)"),
    ("hit ratio, fault-free", "with the faults and without them, same policy and fleet"),
    ("TTFT mean (s)", "with the faults"),
    ("dropped, gaps, replays, restarts, resyncs", "event batches lost on the way; "
     "sequence gaps the router saw; event replays it asked for; replica restarts it "
     "detected; full resyncs from a dump"),
    ("rerouted", "requests routed again after their replica died"),
    ("swept", "reservations dropped after their TTL (a completion never arrived)"),
    ("phantom blocks", "blocks the router still believes cached after the run"),
    ("invariants", "no lost or duplicated request, no decision for a dead replica, every "
     "view converged: `hold`, or what broke"),
)  # fmt: skip
"""The fault table's columns that the policy table does not define."""


def _key(res: ClusterResult) -> tuple[Any, ...]:
    return (res.labels["num_replicas"], res.labels["capacity_tokens"])


def _fmt(value: float, digits: int = 3) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def _refs(all_runs: Sequence[ClusterResult]) -> dict[str, dict[tuple[Any, ...], ClusterResult]]:
    return {
        name: {
            _key(r): r for r in all_runs if r.labels["policy"] == name and not r.labels["faults"]
        }
        for name in ("round_robin", "pooled", "infinite")
    }


def _ratio(run: ClusterResult, ref: ClusterResult | None) -> float:
    if ref is None or not ref.run.hit_ratio:
        return math.nan
    return run.run.hit_ratio / ref.run.hit_ratio


def _policy_table(runs: Sequence[ClusterResult], all_runs: Sequence[ClusterResult]) -> list[str]:
    ref = _refs(all_runs)
    lines = [
        "| policy | index | hit ratio | / round robin | / pooled | TTFT mean (s) | TTFT p90 (s) "
        "| offered load | TTFT growth | req/s offered / achieved | load CV "
        "| decision p99 (µs, CPU / wall) | overlap MAE (tok) | phantom |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        run = r.run
        lines.append(
            f"| {r.labels['policy']} | {r.labels['index']} | {_fmt(run.hit_ratio)} "
            f"| {_fmt(_ratio(r, ref['round_robin'].get(_key(r))), 2)} "
            f"| {_fmt(_ratio(r, ref['pooled'].get(_key(r))), 2)} | {_fmt(run.ttft_mean_s, 2)} "
            f"| {_fmt(run.ttft_p90_s, 2)} | {_fmt(run.offered_load, 2)} "
            f"| {_fmt(run.ttft_growth, 1)} "
            f"| {_fmt(run.offered_rate, 3)} / {_fmt(run.achieved_rate, 3)}"
            f"{' overloaded' if run.overloaded else ''} | {_fmt(run.load_cv)} "
            f"| {_fmt(run.decision_cpu_p99_us, 0)} / {_fmt(run.decision_p99_us, 0)} "
            f"| {_fmt(run.overlap_mae_tokens, 0)} | {_fmt(run.phantom_rate, 3)} |"
        )
    return lines


POOLED_MEANING = (
    "pooled: one cache of N x capacity that every replica reaches (Mooncake's global "
    "cache). It bounds a policy's hits only when admissions happen in the same order at "
    "the same times: a policy whose replicas queue requests admits them later, after more "
    "of what they share is cached, and can beat it. infinite: the same with no capacity "
    "limit."
)
"""What the pooled and infinite rows are (the report prints it under the table)."""


def _definitions(columns: Sequence[tuple[str, str]]) -> list[str]:
    return ["| column | meaning |", "|---|---|", *(f"| {c} | {d} |" for c, d in columns)]


def _fault_table(
    runs: Sequence[ClusterResult], base: dict[tuple[Any, ...], ClusterResult]
) -> list[str]:
    lines = [
        "| policy | faults | hit ratio | fault-free | TTFT mean (s) | dropped | gaps | replays "
        "| restarts | resyncs | rerouted | swept | phantom blocks | invariants |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b = base.get((r.labels["policy"], *_key(r)))
        s = r.stats
        broken = r.invariants.broken()
        lines.append(
            f"| {r.labels['policy']} | `{r.labels['faults']}` | {_fmt(r.run.hit_ratio)} "
            f"| {_fmt(b.run.hit_ratio) if b else '-'} | {_fmt(r.run.ttft_mean_s, 2)} "
            f"| {s.get('dropped_batches', 0)} | {s.get('gaps', '-')} | {s.get('replays', '-')} "
            f"| {s.get('restarts', '-')} | {s.get('resyncs', '-')} | {r.run.rerouted_requests} "
            f"| {r.run.swept_reservations} | {r.invariants.phantom_blocks} "
            f"| {'hold' if not broken else '; '.join(broken)} |"
        )
    return lines


def _overloaded(r: ClusterResult) -> bool:
    run = r.run
    return run.offered_load > 1 or run.ttft_growth > GROWTH_LIMIT or run.overloaded


def report_notes(runs: Sequence[ClusterResult], all_runs: Sequence[ClusterResult]) -> list[str]:
    """The warnings a reader needs before trusting the table: overload (offered load
    above 1 or TTFT growing through the run) and policies above a bound.

    Args:
        runs: the fault-free runs of one fleet (size and capacity).
        all_runs: every fault-free run (where the bounds are found).

    Returns:
        One paragraph per note (empty when there is nothing to say).
    """
    notes: list[str] = []
    ref = _refs(all_runs)
    policies = [r for r in runs if r.labels["policy"] not in ("pooled", "infinite")]
    hot = [r for r in policies if _overloaded(r)]
    if hot:
        worst = max(hot, key=lambda r: (r.run.offered_load, r.run.ttft_growth))
        names = ", ".join(
            f"{r.labels['policy']} (load {_fmt(r.run.offered_load, 2)}, "
            f"growth x{_fmt(r.run.ttft_growth, 1)})"
            for r in hot
        )
        notes.append(
            f"**Overload.** {len(hot)} of {len(policies)} policies ran an overloaded fleet: "
            f"{names}. Their queues grow through the trace (offered load above 1, the "
            f"last quarter's TTFT above {GROWTH_LIMIT:g}x the first quarter's, or the "
            f"achieved rate short of the offered one while queueing grows; "
            f"{worst.labels['policy']} reaches a TTFT mean of "
            f"{_fmt(worst.run.ttft_mean_s, 1)} s), so TTFT measures the backlog more than "
            "the routing. Lower `--request-rate`, raise `--time-scale`, or add replicas "
            "to compare policies in a steady state."
        )
    above_pooled = [
        (r, p)
        for r in policies
        if (p := ref["pooled"].get(_key(r))) is not None and r.run.hit_ratio > p.run.hit_ratio
    ]
    if above_pooled:
        names = ", ".join(
            f"{r.labels['policy']} {_fmt(r.run.hit_ratio)} > {_fmt(p.run.hit_ratio)}"
            for r, p in above_pooled
        )
        notes.append(
            f"**Above the pooled figure.** {names}. Pooled is one LRU cache of N x "
            "capacity fed in arrival order: a reference, not an optimum. Routing that "
            "keeps each session on its own replica shields it from other sessions' "
            "evictions and can beat one shared LRU, most with interleaved long sessions "
            "(agentic traces replayed open-loop), and replicas that queue requests admit "
            "them later, after more of what they share is cached. Infinite (no eviction) "
            "is the upper bound for admissions at the same times."
        )
    above_infinite = [
        r
        for r in policies
        if (i := ref["infinite"].get(_key(r))) is not None
        and r.run.hit_ratio > i.run.hit_ratio + 1e-12
    ]
    if above_infinite:
        names = ", ".join(r.labels["policy"] for r in above_infinite)
        notes.append(
            f"**Above the infinite bound: {names}.** No policy can hit more than a cache "
            "that never evicts when its requests are admitted at the same times; above "
            "it, the policy's replicas admitted requests later (queueing), after more of "
            "their prefixes were cached. On a fleet that is not overloaded this is a bug: "
            "please report it with this report."
        )
    return notes


def _context(source: str, res: ClusterResult) -> str:
    labels = res.labels
    fleet = f"{labels['num_replicas']} replicas x {labels['capacity_tokens']:,} tokens each"
    return f"{source}; {fleet}" if source else fleet


def write_report(
    results: Sequence[ClusterResult],
    out_dir: str | os.PathLike[str],
    *,
    command: str = "",
    source: str = "",
    requests_table: bool = True,
    partial: str = "",
    plots: bool = True,
    notes: Sequence[str] = (),
    settings: Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write ``runs.csv``, ``requests.csv``, ``results.json``, the plots and ``report.md``.

    Args:
        results: every run (at least one).
        out_dir: the folder (created).
        command: the command line, quoted in the report.
        source: what the requests were (trace, arrivals); plots carry it in their title.
        requests_table: also write one row per request of every run.
        partial: when the experiment was cut short, what happened (e.g.
            ``"interrupted (Ctrl-C) after 2 of 9 runs"``); the report and
            results.json say the results are partial.
        plots: draw the PNG plots (they need matplotlib); without them the report
            has its tables only.
        notes: what the reader must know about the requests (those rejected for
            their length), one paragraph each.
        settings: what the runs were sized for (``capacity_model``, ``admission``,
            ``rejected_requests``, ``slo``), listed in the report's header and kept
            in results.json.

    Returns:
        The files written.

    Raises:
        ExtraNotInstalledError: ``plots`` without matplotlib (checked before anything
            is written).
    """
    if plots:
        require_extra("report", "the cluster report's plots", ("matplotlib",))
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
    doc = {
        "format": RESULTS_FORMAT,
        "command": command,
        "source": source,
        "partial": bool(partial),
        "partial_reason": partial or None,
        "settings": dict(settings or {}),
        "notes": list(notes),
        "runs": [
            {"labels": dict(r.labels), "run": r.run_row(), "stats": r.stats,
             "invariants_broken": r.invariants.broken()}
            for r in results
        ],
    }  # fmt: skip
    files.append(_write_text(out / "results.json", json.dumps(doc, indent=1, default=str)))
    md, plotted = _markdown(results, out, command=command, source=source, partial=partial,
                            draw=plots, notes=notes, settings=settings or {})  # fmt: skip
    files += plotted
    files.append(_write_text(out / "report.md", "\n".join(md) + "\n"))
    return files


def _write_text(path: Path, text: str) -> Path:
    with atomic_writer(path) as f:
        f.write(text.encode("utf-8"))
    return path


def _markdown(
    results: Sequence[ClusterResult],
    out: Path,
    *,
    command: str,
    source: str,
    partial: str,
    draw: bool = True,
    notes: Sequence[str] = (),
    settings: Mapping[str, Any] | None = None,
) -> tuple[list[str], list[Path]]:
    """The report's lines, drawing the plots it shows (when ``draw``); returns both."""
    files: list[Path] = []
    clean = [r for r in results if not r.labels["faults"] and not is_rate_run(r)]
    faulty = [r for r in results if r.labels["faults"]]
    first = results[0]
    main_key = _key(first)
    main = [r for r in clean if _key(r) == main_key]
    md = ["# prefixkv cluster report", ""]
    if partial:
        md += [f"**Partial results**: {partial}; only the runs below finished.", ""]
    md += [
        *([f"- requests: {source}"] if source else []),
        *([f"- command: `{command}`"] if command else []),
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{sys.version.split()[0]}, {platform.system()}",
        f"- fleet: {first.labels['backend']} replicas, block size {first.labels['block_size']}",
        *header_lines(settings or {}),
        "",
        *(line for note in notes for line in (note, "")),
        f"## Policies at {main_key[0]} replicas x {main_key[1]:,} tokens each",
        "",
        *_policy_table(main, clean),
        "",
        POOLED_MEANING,
        "",
    ]
    for note in report_notes(main, clean):
        md += [note, ""]
    md += ["Columns:", "", *_definitions(POLICY_COLUMNS), ""]
    md += load_section(results, main_key)
    context = _context(source, first)
    if main and draw:
        for name, plot, what in (
            ("hit_ratio", plots.plot_hit_ratio, "Prefix hit ratio per policy"),
            ("frontier", plots.plot_frontier, "Hit ratio against load imbalance"),
            ("ttft_cdf", plots.plot_ttft_cdf, "TTFT distribution per policy"),
            ("overlap", plots.plot_overlap, "Predicted against realized hit tokens"),
            ("decision_latency", plots.plot_decision_latency, "Router decision time"),
        ):
            files.append(plot(main, out / f"{name}.png", title=f"{what}: {context}"))
            md.append(f"![{what}]({name}.png)")
        md.append("")
    for key, label, name in (
        ("num_replicas", "replicas (log scale)", "hit_vs_replicas"),
        ("capacity_tokens", "KV capacity per replica (tokens, log scale)", "hit_vs_capacity"),
    ):
        other = "capacity_tokens" if key == "num_replicas" else "num_replicas"
        sweep = [r for r in clean if r.labels[other] == first.labels[other]]
        if len({r.labels[key] for r in sweep}) > 1:
            title = f"Hit ratio against {key.replace('_', ' ')}: {source or 'requests'}"
            md += [f"## Hit ratio against {key}", "", *_policy_table(sweep, clean), ""]
            if draw:
                files.append(plots.plot_sweep(sweep, key, out / f"{name}.png", xlabel=label,
                                              title=title))  # fmt: skip
                md += [f"![{title}]({name}.png)", ""]
    if faulty:
        base = {(r.labels["policy"], *_key(r)): r for r in clean}
        title = f"Hit ratio with faults against without: {context}"
        if draw:
            files.append(
                plots.plot_faults(
                    faulty, lambda r: base.get((r.labels["policy"], *_key(r))),
                    out / "faults.png", title=title,
                )
            )  # fmt: skip
        md += ["## Fault runs", "", *_fault_table(faulty, base), ""]
        md += ["Columns:", "", *_definitions(FAULT_COLUMNS), ""]
        md += [f"![{title}](faults.png)", ""] if draw else []
    return md, files
