"""The cluster report: runs.csv, requests.csv, results.json, the plots and report.md.

Runs fall in groups by their labels: fault-free runs at the main fleet (the policy
comparison), the sweeps over fleet size and capacity, fault runs, and the request-rate
sweep's runs. Hit ratios are set against round robin and the pooled figure of the same fleet.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..cluster.metrics import ClusterResult
from ..extras import require_extra
from ..sim.rate_sweep import saturation_of
from ..sim.runs import run_table
from . import plots
from .markdown import (
    Column,
    definitions,
    fixed,
    image,
    machine_info,
    partial_notice,
    rate,
    table,
    titled_table,
    write_text,
)
from .tables import request_rows, write_json, write_rows

__all__ = [
    "GROWTH_LIMIT",
    "OUTPUT_NAMES",
    "POLICY_COLUMNS",
    "POOLED_MEANING",
    "policy_rows",
    "report_notes",
    "write_report",
]

OUTPUT_NAMES = (
    "report.md", "results.json", "runs.csv", "requests.csv", "hit_ratio.png", "frontier.png",
    "ttft_cdf.png", "overlap.png", "decision_latency.png", "hit_vs_replicas.png",
    "hit_vs_capacity.png", "faults.png",
)  # fmt: skip
"""Every file :func:`write_report` may write."""

GROWTH_LIMIT = 3.0
"""TTFT growth (last quarter of arrivals over the first) above which a run is overloaded."""

POLICY_COLUMNS: tuple[Column, ...] = (
    ("policy", "<", "the routing policy (`name[@index][:key=value]`); pooled and infinite "
     "are the bounds: one cache of N x capacity, and one that never evicts"),
    ("index", "<", "the router's cluster index: chained (hash chain), radix (block tree), "
     "approx (decision history), none"),
    ("hit ratio", ">", "prompt tokens served from cache over all prompt tokens, at each "
     "request's first admission (Dynamo's cache efficiency)"),
    ("/ round robin", ">", "hit ratio over round robin's, same fleet"),
    ("/ pooled", ">", "hit ratio over the pooled figure, same fleet (above 1: see the notes)"),
    ("TTFT mean (s)", ">", "arrival to the end of the step that produced the first "
     "output token, in simulated seconds"),
    ("TTFT p90 (s)", ">", "the same, 90th percentile"),
    ("offered load", ">", "compute seconds the replicas needed per second of arrivals, "
     "per replica; above 1 the queues grow without bound"),
    ("TTFT growth", ">", "mean TTFT of the last quarter of arrivals over the first "
     "quarter's: near 1 in a steady state"),
    ("req/s offered / achieved", ">", "requests per second over the arrival window, and "
     "finished per second from the first arrival to the last finish; overloaded also when "
     "the achieved rate is over 10% short and queueing grows over 0.1 s per s of run"),
    ("load CV", ">", "coefficient of variation (population std / mean) of the seconds each "
     "replica spent computing: 0 is perfectly even"),
    ("decision p99 (µs, CPU / wall)", ">", "the router's time per decision, 99th "
     "percentile: CPU time of its thread / wall clock; hashing the prompt's blocks excluded"),
    ("overlap MAE (tok)", ">", "mean absolute error of the index's predicted hit tokens on "
     "the chosen replica against the hit it then got"),
    ("phantom", ">", "share of predictions above the realized hit: blocks the router "
     "believed cached that were not (stale information)"),
)  # fmt: skip
"""The policy table's columns."""

_FAULT_COLUMNS: tuple[Column, ...] = (
    ("policy", "<", ""),
    ("faults", "<", "the injected faults (`--faults`)"),
    ("hit ratio", ">", ""),
    ("fault-free", ">", "the hit ratio without the faults, same policy and fleet"),
    ("TTFT mean (s)", ">", ""),
    ("dropped", ">", "event batches lost on the way"),
    ("gaps", ">", "sequence gaps the router saw"),
    ("replays", ">", "event replays it asked for"),
    ("restarts", ">", "replica restarts it detected"),
    ("resyncs", ">", "full resyncs from a dump"),
    ("rerouted", ">", "requests routed again after their replica died"),
    ("swept", ">", "reservations dropped after their TTL (a completion never arrived)"),
    ("phantom blocks", ">", "blocks the router still believes cached after the run"),
    ("invariants", "<", "no lost or duplicated request, no decision for a dead replica, "
     "every view converged: `hold`, or what broke"),
)  # fmt: skip


def _key(res: ClusterResult) -> tuple[Any, ...]:
    return (res.labels["num_replicas"], res.labels["capacity_tokens"])


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


def policy_rows(
    runs: Sequence[ClusterResult], all_runs: Sequence[ClusterResult]
) -> list[list[str]]:
    """One row of :data:`POLICY_COLUMNS` cells per run (ratios against ``all_runs``' bounds)."""
    ref = _refs(all_runs)
    rows = []
    for r in runs:
        run = r.run
        rows.append([
            r.labels["policy"], r.labels["index"], fixed(run.hit_ratio),
            fixed(_ratio(r, ref["round_robin"].get(_key(r))), 2),
            fixed(_ratio(r, ref["pooled"].get(_key(r))), 2),
            fixed(run.ttft_mean_s, 2), fixed(run.ttft_p90_s, 2), fixed(run.offered_load, 2),
            fixed(run.ttft_growth, 1),
            f"{fixed(run.offered_rate, 3)} / {fixed(run.achieved_rate, 3)}"
            f"{' overloaded' if run.overloaded else ''}", fixed(run.load_cv),
            f"{fixed(run.decision_cpu_p99_us, 0)} / {fixed(run.decision_p99_us, 0)}",
            fixed(run.overlap_mae_tokens, 0), fixed(run.phantom_rate, 3),
        ])  # fmt: skip
    return rows


POOLED_MEANING = (
    "pooled: one cache of N x capacity that every replica reaches (Mooncake's global "
    "cache). It bounds a policy's hits only when admissions happen in the same order at "
    "the same times: a policy whose replicas queue requests admits them later, after more "
    "of what they share is cached, and can beat it. infinite: the same with no capacity "
    "limit."
)
"""What the pooled and infinite rows are."""


def report_notes(runs: Sequence[ClusterResult], all_runs: Sequence[ClusterResult]) -> list[str]:
    """One paragraph per warning about the fault-free ``runs`` of one fleet: overload and
    policies above a bound (found among ``all_runs``)."""
    ref = _refs(all_runs)
    policies = [r for r in runs if r.labels["policy"] not in ("pooled", "infinite")]
    hot = [
        r
        for r in policies
        if r.run.offered_load > 1 or r.run.ttft_growth > GROWTH_LIMIT or r.run.overloaded
    ]
    notes = [_overload_note(hot, len(policies))] if hot else []
    above = [
        f"{r.labels['policy']} {fixed(r.run.hit_ratio)} > {fixed(p.run.hit_ratio)}"
        for r in policies
        if (p := ref["pooled"].get(_key(r))) is not None and r.run.hit_ratio > p.run.hit_ratio
    ]
    if above:
        notes.append(
            f"**Above the pooled figure.** {', '.join(above)}. Pooled is one LRU cache of N x "
            "capacity fed in arrival order: a reference, not an optimum. Routing that "
            "keeps each session on its own replica shields it from other sessions' "
            "evictions and can beat one shared LRU, most with interleaved long sessions "
            "(agentic traces replayed open-loop), and replicas that queue requests admit "
            "them later, after more of what they share is cached. Infinite (no eviction) "
            "is the upper bound for admissions at the same times."
        )
    above = [
        r.labels["policy"]
        for r in policies
        if (i := ref["infinite"].get(_key(r))) is not None
        and r.run.hit_ratio > i.run.hit_ratio + 1e-12
    ]
    if above:
        notes.append(
            f"**Above the infinite bound: {', '.join(above)}.** "
            "No policy can hit more than a cache that never evicts when its requests are "
            "admitted at the same times; above it, the policy's replicas admitted requests "
            "later (queueing), after more of their prefixes were cached. On a fleet that is "
            "not overloaded this is a bug: please report it with this report."
        )
    return notes


def _overload_note(hot: Sequence[ClusterResult], num_policies: int) -> str:
    worst = max(hot, key=lambda r: (r.run.offered_load, r.run.ttft_growth))
    names = ", ".join(
        f"{r.labels['policy']} (load {fixed(r.run.offered_load, 2)}, "
        f"growth x{fixed(r.run.ttft_growth, 1)})"
        for r in hot
    )
    return (
        f"**Overload.** {len(hot)} of {num_policies} policies ran an overloaded fleet: "
        f"{names}. Their queues grow through the trace (offered load above 1, the "
        f"last quarter's TTFT above {GROWTH_LIMIT:g}x the first quarter's, or the "
        f"achieved rate short of the offered one while queueing grows; "
        f"{worst.labels['policy']} reaches a TTFT mean of "
        f"{fixed(worst.run.ttft_mean_s, 1)} s), so TTFT measures the backlog more than "
        "the routing. Lower `--request-rate`, raise `--time-scale`, or add replicas "
        "to compare policies in a steady state."
    )


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
    """Write ``runs.csv``, ``requests.csv`` (with ``requests_table``), ``results.json``, the
    plots (with ``plots``) and ``report.md``; returns the files written.

    ``source`` says what the requests were (plots carry it in their title); ``partial``,
    when the experiment was cut short, what happened; ``notes`` are paragraphs the reader
    must know; ``settings`` what the runs were sized for (``capacity_model``,
    ``admission``, ``rejected_requests``, ``slo``).

    Raises:
        ExtraNotInstalledError: ``plots`` without matplotlib (nothing written).
    """
    if plots:
        require_extra("report", "the cluster report's plots", ("matplotlib",))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = [write_rows(out / "runs.csv", run_table(r.run_row() for r in results))]
    if requests_table:
        files.append(write_rows(out / "requests.csv", request_rows(results, _REQUEST_LABELS)))
    doc = {
        "format": "prefixkv-cluster/2",
        "command": command,
        "source": source,
        "partial": bool(partial),
        "partial_reason": partial or None,
        "settings": dict(settings or {}),
        "notes": list(notes),
        "runs": [
            {"labels": dict(r.labels), "run": r.run_row().as_row(), "stats": r.stats,
             "invariants_broken": r.invariants.broken()}
            for r in results
        ],
    }  # fmt: skip
    files.append(write_json(out / "results.json", doc))
    drawn: list[Path] = []

    def draw(name: str, title: str, plot: Callable[[Path, str], Path]) -> list[str]:
        if not plots:
            return []
        drawn.append(plot(out / f"{name}.png", title))
        return image(title.split(":")[0], f"{name}.png")

    md = _markdown(results, draw, doc)
    return [*files, *drawn, write_text(out / "report.md", "\n".join(md) + "\n")]


_Draw = Callable[[str, str, Callable[[Path, str], Path]], list[str]]
"""Draws a plot (``name``, ``title``, how) when plots are asked for; gives its link."""
_REQUEST_LABELS = ("policy", "num_replicas", "capacity_tokens", "faults")  # requests.csv's
_SETTING_NAMES = {"capacity_model": "model and GPU", "slo": "SLO"}
_POLICY_FIGURES = (
    ("hit_ratio", "Prefix hit ratio per policy", plots.plot_hit_ratio),
    ("frontier", "Hit ratio against load imbalance", plots.plot_frontier),
    ("ttft_cdf", "TTFT distribution per policy", plots.plot_policy_ttft),
    ("overlap", "Predicted against realized hit tokens", plots.plot_overlap),
    ("decision_latency", "Router decision time", plots.plot_decision_latency),
)


def _markdown(results: Sequence[ClusterResult], draw: _Draw, doc: Mapping[str, Any]) -> list[str]:
    """The report's lines: the run, then a section per axis, drawing its plots."""
    clean = [r for r in results if not r.labels["faults"] and r.labels.get("role") != "rate"]
    first, source = results[0], doc["source"]
    m = machine_info()
    md = ["# prefixkv cluster report", ""]
    if doc["partial_reason"]:
        md += partial_notice(doc["partial_reason"], "runs")
    md += [
        *([f"- requests: {source}"] if source else []),
        *([f"- command: `{doc['command']}`"] if doc["command"] else []),
        f"- machine: {m['machine']}, {m['cpu_count']} CPUs, Python {m['python']}, {m['platform']}",
        f"- fleet: {first.labels['backend']} replicas, block size {first.labels['block_size']}",
        *(
            f"- {_SETTING_NAMES.get(k, k.replace('_', ' '))}: {v}"
            for k, v in doc["settings"].items()
            if v is not None and v != ""
        ),
        "",
        *(line for note in doc["notes"] for line in (note, "")),
    ]
    md += _policy_axis([r for r in clean if _key(r) == _key(first)], clean, draw, source)
    md += _load_section(results, _key(first))
    for key in ("num_replicas", "capacity_tokens"):
        md += _fleet_axis(clean, key, first, draw, source)
    return md + _fault_axis([r for r in results if r.labels["faults"]], clean, draw, source)


def _policy_axis(
    main: Sequence[ClusterResult], clean: Sequence[ClusterResult], draw: _Draw, source: str
) -> list[str]:
    if not main:
        return []
    replicas, capacity = _key(main[0])
    md = titled_table(
        f"## Policies at {replicas} replicas x {capacity:,} tokens each",
        POLICY_COLUMNS,
        policy_rows(main, clean),
        [POOLED_MEANING, *report_notes(main, clean)],
    )
    md += ["Columns:", "", *definitions(POLICY_COLUMNS)]
    context = _context(source, main[0])
    for name, what, plot in _POLICY_FIGURES:
        md += draw(name, f"{what}: {context}", functools.partial(plot, main))
    return md


def _fleet_axis(
    clean: Sequence[ClusterResult], key: str, first: ClusterResult, draw: _Draw, source: str
) -> list[str]:
    other = "capacity_tokens" if key == "num_replicas" else "num_replicas"
    sweep = [r for r in clean if r.labels[other] == first.labels[other]]
    if len({r.labels[key] for r in sweep}) < 2:
        return []
    title = f"Hit ratio against {key.replace('_', ' ')}: {source or 'requests'}"
    md = titled_table(f"## Hit ratio against {key}", POLICY_COLUMNS, policy_rows(sweep, clean))
    rows = [{**r.labels, "hit_ratio": r.run.hit_ratio} for r in sweep]
    xlabel = "replicas" if key == "num_replicas" else "KV capacity per replica (tokens)"
    name = "hit_vs_replicas" if key == "num_replicas" else "hit_vs_capacity"
    return md + draw(name, title, lambda p, t: plots.plot_against(
        rows, p, x=key, measures=(("hit_ratio", "prefix hit ratio"),), label_key="policy",
        xlabel=f"{xlabel} (log scale)", title=t))  # fmt: skip


def _fault_axis(
    faulty: Sequence[ClusterResult], clean: Sequence[ClusterResult], draw: _Draw, source: str
) -> list[str]:
    if not faulty:
        return []
    base = {(r.labels["policy"], *_key(r)): r for r in clean}

    def fault_free(r: ClusterResult) -> ClusterResult | None:
        return base.get((r.labels["policy"], *_key(r)))

    title = f"Hit ratio with faults against without: {_context(source, faulty[0])}"
    rows = []
    for r in faulty:
        b, s = fault_free(r), r.stats
        broken = r.invariants.broken()
        rows.append([
            r.labels["policy"], f"`{r.labels['faults']}`", fixed(r.run.hit_ratio),
            fixed(b.run.hit_ratio) if b else "-", fixed(r.run.ttft_mean_s, 2),
            str(s.get("dropped_batches", 0)),
            *(str(s.get(k, "-")) for k in ("gaps", "replays", "restarts", "resyncs")),
            str(r.run.rerouted_requests), str(r.run.swept_reservations),
            str(r.invariants.phantom_blocks), "hold" if not broken else "; ".join(broken),
        ])  # fmt: skip
    md = titled_table("## Fault runs", _FAULT_COLUMNS, rows)
    md += ["Columns:", "", *definitions(c for c in _FAULT_COLUMNS if c[2])]
    return md + draw("faults", title, functools.partial(plots.plot_faults, faulty, fault_free))


_LOAD_COLUMNS: tuple[Column, ...] = tuple(
    (header, "-", "")
    for header in (
        "policy", "request rate", "req/s offered", "sent", "achieved", "goodput",
        "TTFT p50 (s)", "TTFT p90 (s)", "hit ratio", "verdict",
    )
)  # fmt: skip


def _load_section(results: Sequence[ClusterResult], key: tuple[Any, ...]) -> list[str]:
    """The load table of fleet ``key``'s fault-free runs, and where each policy saturates."""
    runs = [r for r in results if not r.labels["faults"] and _key(r) == key]
    if not runs:
        return []
    order = {p: k for k, p in enumerate(dict.fromkeys(r.labels["policy"] for r in runs))}
    runs.sort(key=lambda r: (order[r.labels["policy"]], r.labels.get("request_rate") or 0.0))
    rates = {r.labels.get("request_rate") for r in runs}
    slo = next((r.run.slo for r in runs if r.run.slo), "")
    title = "## Load" + (" and the request-rate sweep" if len(rates) > 1 else "")
    rows = []
    for r in runs:
        run, load = r.run, r.run.load()
        verdict = "overloaded" if load.overloaded else "held back" if load.held_back else "ok"
        rows.append(
            [r.labels["policy"], rate(r.labels.get("request_rate")), rate(load.offered_rate),
             rate(load.sent_rate), rate(load.achieved_rate), rate(load.goodput),
             rate(run.ttft_p50_s), rate(run.ttft_p90_s), f"{run.hit_ratio:.3f}", verdict]
        )  # fmt: skip
    lines = [
        f"{title} at {key[0]} replicas x {key[1]:,} tokens each",
        "",
        table(_LOAD_COLUMNS, rows),
        "",
        "Request rate: the Poisson rate asked for (`-`: the trace's timestamps). Offered: "
        "requests per second of the arrival window asked for; sent: as sent (closed loop, a "
        "session's turn waits for its previous answer plus think time: `held back`); "
        "achieved: finished per second from the first arrival to the last finish. "
        "`overloaded`: the achieved rate falls more than 10% short of the sent rate and "
        "queueing grows by more than 0.1 s per s of run (queues grow without bound). "
        + (
            f"Goodput: finished requests per second meeting the SLO ({slo}), as "
            "`vllm bench serve --goodput`."
            if slo
            else "Goodput needs an SLO (`--slo-ttft`, `--slo-tpot`, `--slo-e2el`)."
        ),
        "",
    ]
    if len(rates) > 1:
        points = [
            (r.labels["policy"], float(r.labels["request_rate"]), r.run.load())
            for r in runs
            if r.labels.get("request_rate") is not None
        ]
        lines += [f"- {s.describe()}" for s in saturation_of(points)] + [""]
    return lines
