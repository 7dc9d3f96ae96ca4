"""The cluster report: tables (CSV, JSON), plots and ``report.md`` for a set of runs.

Runs fall in four groups, told apart by their labels: fault-free runs at the main fleet
size and capacity (the policy comparison), the sweeps over fleet size and capacity,
fault runs, and the request-rate sweep's runs (role ``rate``; their load table is
:mod:`.cluster_load`'s). Ratios are reported against round
robin and the pooled figure of the same fleet ("efficiency" = hit / pooled hit, the
honest global-vs-local number). As compare's report does, it defines every column,
titles every plot with the trace, the fleet and the arrivals, says what the pooled
figure is, and says in notes when the fleet is overloaded or a policy is above the
pooled or infinite figure (a bound only when admissions happen at the same times); an
interrupted experiment's report says it is partial. Every file is written whole or not
at all.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster.experiment import is_rate_run
from ..cluster.metrics import ClusterResult
from ..extras import require_extra
from ..sim.runs import run_table
from . import plots
from .cluster_load import header_lines, load_section
from .markdown import (
    Column,
    definitions,
    fixed,
    image,
    machine_info,
    partial_notice,
    titled_table,
    write_text,
)
from .tables import request_rows, write_json, write_rows

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
"""The policy table's columns and their definitions (the report prints both)."""

FAULT_COLUMNS: tuple[Column, ...] = (
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
"""The fault table's columns (those without a meaning are the policy table's)."""


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
"""What the pooled and infinite rows are (the report prints it under the table)."""


def fault_rows(
    runs: Sequence[ClusterResult], base: dict[tuple[Any, ...], ClusterResult]
) -> list[list[str]]:
    """One row of :data:`FAULT_COLUMNS` cells per fault run (``base``: the fault-free
    runs by policy, replicas and capacity)."""
    rows = []
    for r in runs:
        b = base.get((r.labels["policy"], *_key(r)))
        s = r.stats
        broken = r.invariants.broken()
        rows.append([
            r.labels["policy"], f"`{r.labels['faults']}`", fixed(r.run.hit_ratio),
            fixed(b.run.hit_ratio) if b else "-", fixed(r.run.ttft_mean_s, 2),
            str(s.get("dropped_batches", 0)),
            *(str(s.get(k, "-")) for k in ("gaps", "replays", "restarts", "resyncs")),
            str(r.run.rerouted_requests), str(r.run.swept_reservations),
            str(r.invariants.phantom_blocks), "hold" if not broken else "; ".join(broken),
        ])  # fmt: skip
    return rows


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
    ref = _refs(all_runs)
    policies = [r for r in runs if r.labels["policy"] not in ("pooled", "infinite")]
    above_pooled = [
        (r, p)
        for r in policies
        if (p := ref["pooled"].get(_key(r))) is not None and r.run.hit_ratio > p.run.hit_ratio
    ]
    above_infinite = [
        r
        for r in policies
        if (i := ref["infinite"].get(_key(r))) is not None
        and r.run.hit_ratio > i.run.hit_ratio + 1e-12
    ]
    notes = [
        _overload_note([r for r in policies if _overloaded(r)], len(policies)),
        _above_pooled_note(above_pooled),
        _above_infinite_note(above_infinite),
    ]
    return [note for note in notes if note]


def _overload_note(hot: Sequence[ClusterResult], num_policies: int) -> str:
    if not hot:
        return ""
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


def _above_pooled_note(above: Sequence[tuple[ClusterResult, ClusterResult]]) -> str:
    if not above:
        return ""
    names = ", ".join(
        f"{r.labels['policy']} {fixed(r.run.hit_ratio)} > {fixed(p.run.hit_ratio)}"
        for r, p in above
    )
    return (
        f"**Above the pooled figure.** {names}. Pooled is one LRU cache of N x "
        "capacity fed in arrival order: a reference, not an optimum. Routing that "
        "keeps each session on its own replica shields it from other sessions' "
        "evictions and can beat one shared LRU, most with interleaved long sessions "
        "(agentic traces replayed open-loop), and replicas that queue requests admit "
        "them later, after more of what they share is cached. Infinite (no eviction) "
        "is the upper bound for admissions at the same times."
    )


def _above_infinite_note(above: Sequence[ClusterResult]) -> str:
    if not above:
        return ""
    return (
        f"**Above the infinite bound: {', '.join(r.labels['policy'] for r in above)}.** "
        "No policy can hit more than a cache that never evicts when its requests are "
        "admitted at the same times; above it, the policy's replicas admitted requests "
        "later (queueing), after more of their prefixes were cached. On a fleet that is "
        "not overloaded this is a bug: please report it with this report."
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
    files = [write_rows(out / "runs.csv", run_table(r.run_row() for r in results))]
    if requests_table:
        files.append(write_rows(out / "requests.csv", request_rows(results, _REQUEST_LABELS)))
    about = _About(command, source, partial, tuple(notes), dict(settings or {}))
    files.append(write_json(out / "results.json", _results_doc(results, about)))
    drawer = _Drawer(out, plots)
    md = _markdown(results, drawer, about)
    return [*files, *drawer.files, write_text(out / "report.md", "\n".join(md) + "\n")]


@dataclass(frozen=True, slots=True)
class _About:
    """What a report says about its runs besides their rows: :func:`write_report`'s
    ``command``, ``source``, ``partial``, ``notes`` and ``settings``."""

    command: str
    source: str
    partial: str
    notes: tuple[str, ...]
    settings: dict[str, Any]


def _results_doc(results: Sequence[ClusterResult], about: _About) -> dict[str, Any]:
    """results.json: what ran, on what, whether it is partial, and every run's row."""
    return {
        "format": RESULTS_FORMAT,
        "command": about.command,
        "source": about.source,
        "partial": bool(about.partial),
        "partial_reason": about.partial or None,
        "settings": dict(about.settings),
        "notes": list(about.notes),
        "runs": [
            {"labels": dict(r.labels), "run": r.run_row().as_row(), "stats": r.stats,
             "invariants_broken": r.invariants.broken()}
            for r in results
        ],
    }  # fmt: skip


_REQUEST_LABELS = ("policy", "num_replicas", "capacity_tokens", "faults")
"""requests.csv's run columns: the run's policy and fleet (then the request's record
and route)."""


class _Drawer:
    """Draws a report's plots into its folder (when asked to) and links them."""

    def __init__(self, out: Path, draw: bool) -> None:
        self.out, self.draw = out, draw
        self.files: list[Path] = []

    def __call__(self, name: str, title: str, plot: Callable[[Path, str], Path]) -> list[str]:
        """``plot(path, title)`` into ``<name>.png``; the link (nothing when not drawing)."""
        if not self.draw:
            return []
        self.files.append(plot(self.out / f"{name}.png", title))
        return image(title.split(":")[0], f"{name}.png")


def _markdown(results: Sequence[ClusterResult], draw: _Drawer, about: _About) -> list[str]:
    """The report's lines: the run, then a section per axis (policy, fleet size,
    capacity, faults), drawing the plots each shows."""
    clean = [r for r in results if not r.labels["faults"] and not is_rate_run(r)]
    first, source = results[0], about.source
    m = machine_info()
    md = ["# prefixkv cluster report", ""]
    if about.partial:
        md += partial_notice(about.partial, "runs")
    md += [
        *([f"- requests: {source}"] if source else []),
        *([f"- command: `{about.command}`"] if about.command else []),
        f"- machine: {m['machine']}, {m['cpu_count']} CPUs, Python {m['python']}, {m['platform']}",
        f"- fleet: {first.labels['backend']} replicas, block size {first.labels['block_size']}",
        *header_lines(about.settings),
        "",
        *(line for note in about.notes for line in (note, "")),
    ]
    md += _policy_axis([r for r in clean if _key(r) == _key(first)], clean, draw, source)
    md += load_section(results, _key(first))
    for key in ("num_replicas", "capacity_tokens"):
        md += _fleet_axis(clean, key, first, draw, source)
    return md + _fault_axis([r for r in results if r.labels["faults"]], clean, draw, source)


def _policy_axis(
    main: Sequence[ClusterResult], clean: Sequence[ClusterResult], draw: _Drawer, source: str
) -> list[str]:
    """Every policy on the main fleet: the table, its notes, its definitions, five plots."""
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
    figures: tuple[tuple[str, str, Callable[[Path, str], Path]], ...] = (
        ("hit_ratio", "Prefix hit ratio per policy",
         lambda p, t: plots.plot_hit_ratio(main, p, title=t)),
        ("frontier", "Hit ratio against load imbalance",
         lambda p, t: plots.plot_frontier(main, p, title=t)),
        ("ttft_cdf", "TTFT distribution per policy",
         lambda p, t: plots.plot_ttft_cdf(plots.ttft_curves(main, "policy"), p, title=t)),
        ("overlap", "Predicted against realized hit tokens",
         lambda p, t: plots.plot_overlap(main, p, title=t)),
        ("decision_latency", "Router decision time",
         lambda p, t: plots.plot_decision_latency(main, p, title=t)),
    )  # fmt: skip
    for name, what, plot in figures:
        md += draw(name, f"{what}: {context}", plot)
    return md


def _fleet_axis(
    clean: Sequence[ClusterResult], key: str, first: ClusterResult, draw: _Drawer, source: str
) -> list[str]:
    """Hit ratio against the fleet size or the capacity, when the experiment swept it."""
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
    faulty: Sequence[ClusterResult], clean: Sequence[ClusterResult], draw: _Drawer, source: str
) -> list[str]:
    """Each fault run beside its fault-free run, and whether the invariants held."""
    if not faulty:
        return []
    base = {(r.labels["policy"], *_key(r)): r for r in clean}
    title = f"Hit ratio with faults against without: {_context(source, faulty[0])}"
    md = titled_table("## Fault runs", FAULT_COLUMNS, fault_rows(faulty, base))
    md += ["Columns:", "", *definitions(c for c in FAULT_COLUMNS if c[2])]
    return md + draw("faults", title, lambda p, t: plots.plot_faults(
        faulty, lambda r: base.get((r.labels["policy"], *_key(r))), p, title=t))  # fmt: skip
