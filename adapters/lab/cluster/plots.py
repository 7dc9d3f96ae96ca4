"""Plots of cluster runs: hit ratio per policy and against fleet size and capacity, the
hit-ratio / load-imbalance frontier, TTFT CDFs, predicted against realized overlap,
router decision latency, and the fault runs.

matplotlib is imported inside each function (``Figure`` rendered by Agg, no pyplot
state), so runs need it only when a plot is asked for. Every plot takes a ``title``
(the report's: what it shows, the trace, the fleet and the arrivals), so a plot
pasted on its own keeps its context; each file is written whole or not at all.
"""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..traces.files import atomic_writer
from .metrics import ClusterResult

__all__ = [
    "plot_decision_latency",
    "plot_faults",
    "plot_frontier",
    "plot_hit_ratio",
    "plot_overlap",
    "plot_sweep",
    "plot_ttft_cdf",
]

_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
_DASHES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig, fig.subplots(1, ncols)


def _save(fig: Any, path: str | os.PathLike[str], title: str) -> Path:
    if title:
        fig.suptitle(textwrap.fill(title, 100), fontsize="small")
    out = Path(path)
    with atomic_writer(out) as f:
        fig.savefig(f, format="png")
    return out


def _name(res: ClusterResult) -> str:
    return str(res.labels["policy"])


def _bound(results: Sequence[ClusterResult], name: str) -> ClusterResult | None:
    return next((r for r in results if r.labels["policy"] == name), None)


def plot_hit_ratio(
    results: Sequence[ClusterResult], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Hit ratio per policy (bars), with round robin's and the bounds' as lines."""
    fig, ax = _figure(max(6.0, 0.6 * len(results) + 2), 4.0)
    policies = [r for r in results if r.labels["policy"] not in ("pooled", "infinite")]
    names = [_name(r) for r in policies]
    hits = [r.run.hit_ratio for r in policies]
    ax.bar(range(len(names)), hits, color=_COLOURS[0])
    for i, h in enumerate(hits):
        ax.text(i, h, f"{h:.3f}", ha="center", va="bottom", fontsize="x-small")
    for ref, style in (("round_robin", ":"), ("pooled", "--"), ("infinite", "-.")):
        res = _bound(results, ref)
        if res is not None:
            ax.axhline(res.run.hit_ratio, color="black", linestyle=style, linewidth=1,
                       label=f"{ref} {res.run.hit_ratio:.3f}")  # fmt: skip
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize="small")
    ax.set_ylabel("prefix hit ratio")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small")
    labels = results[0].labels
    ax.set_title(f"{labels['num_replicas']} replicas x {_tokens(labels['capacity_tokens'])} tokens")
    return _save(fig, path, title)


def _tokens(value: float) -> str:
    for unit, size in (("M", 10**6), ("K", 10**3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def plot_sweep(
    results: Sequence[ClusterResult],
    key: str,
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    title: str = "",
) -> Path:
    """Hit ratio against a swept label (``num_replicas`` or ``capacity_tokens``), one
    line per policy, log x axis."""
    lines: dict[str, list[ClusterResult]] = {}
    for r in results:
        lines.setdefault(_name(r), []).append(r)
    fig, ax = _figure(6.8, 4.2)
    xs: set[float] = set()
    for i, (name, runs) in enumerate(lines.items()):
        runs = sorted(runs, key=lambda r: r.labels[key])
        x = [r.labels[key] for r in runs]
        xs.update(x)
        ax.plot(x, [r.run.hit_ratio for r in runs], color=_COLOURS[i % len(_COLOURS)],
                linestyle=_DASHES[i % len(_DASHES)], marker=_MARKERS[i % len(_MARKERS)],
                label=name)  # fmt: skip
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log")
    ax.set_xticks(sorted(xs))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens(v)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("prefix hit ratio")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    return _save(fig, path, title)


def plot_frontier(
    results: Sequence[ClusterResult], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Hit ratio against load imbalance (CV of busy time), one point per run: good
    policies sit top left; the pooled bound marks the best balanced hit ratio."""
    fig, ax = _figure(6.8, 4.6)
    for i, r in enumerate(results):
        ax.scatter([r.run.load_cv], [r.run.hit_ratio], color=_COLOURS[i % len(_COLOURS)],
                   marker=_MARKERS[i % len(_MARKERS)], label=_name(r))  # fmt: skip
    pooled = _bound(results, "pooled")
    if pooled is not None:
        ax.axhline(pooled.run.hit_ratio * 0.9, color="grey", linestyle=":", linewidth=1,
                   label="0.9 x pooled")  # fmt: skip
    ax.axvline(0.1, color="grey", linestyle="--", linewidth=1, label="CV 0.1")
    top = max((r.run.load_cv for r in results if not math.isnan(r.run.load_cv)), default=0.0)
    ax.set_xlim(0, max(0.2, 1.1 * top))
    ax.set_xlabel("load imbalance: CV of replica busy time")
    ax.set_ylabel("prefix hit ratio")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    return _save(fig, path, title)


def plot_ttft_cdf(
    results: Sequence[ClusterResult], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Empirical CDF of TTFT per run, log time axis."""
    fig, ax = _figure(6.8, 4.2)
    for i, res in enumerate(results):
        ttft = sorted(max(r.metrics.ttft_s, 1e-4) for r in res.requests)
        if not ttft:
            continue
        frac = [(k + 1) / len(ttft) for k in range(len(ttft))]
        ax.step(ttft, frac, where="post", color=_COLOURS[i % len(_COLOURS)],
                linestyle=_DASHES[i % len(_DASHES)],
                label=f"{_name(res)} (mean {res.run.ttft_mean_s:.3g} s)")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="x-small")
    return _save(fig, path, title)


def plot_overlap(
    results: Sequence[ClusterResult], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Predicted against realized hit tokens, one panel per policy that predicts."""
    runs = [r for r in results if r.run.overlap_predictions]
    cols = max(1, min(4, len(runs)))
    rows = max(1, math.ceil(len(runs) / cols))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3.2 * cols, 3.0 * rows), dpi=110, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, res in zip(axes.flat, runs, strict=False):
        bs = res.labels["block_size"]
        pts = [
            (r.predicted_blocks * bs, r.metrics.hit_tokens)
            for r in res.requests
            if r.predicted_blocks is not None
        ]
        top = max((max(p) for p in pts), default=1) or 1
        ax.scatter([p for p, _ in pts], [h for _, h in pts], s=4, alpha=0.3)
        ax.plot([0, top], [0, top], color="grey", linewidth=1)
        for axis in ("x", "y"):  # most requests hit little: spread the corner
            getattr(ax, f"set_{axis}scale")("symlog", linthresh=max(bs, 1))
        ax.set_title(
            f"{_name(res)}\nMAE {res.run.overlap_mae_tokens:.0f} tok, "
            f"phantom {res.run.phantom_rate:.1%}",
            fontsize="small",
        )
        ax.set_xlabel("predicted (tokens)", fontsize="small")
        ax.set_ylabel("realized (tokens)", fontsize="small")
    for ax in list(axes.flat)[len(runs) :]:
        ax.set_visible(False)
    return _save(fig, path, title)


def plot_decision_latency(
    results: Sequence[ClusterResult], path: str | os.PathLike[str], *, title: str = ""
) -> Path:
    """Router decision time per policy, CPU (box: p25-p75, whiskers p1-p99) and wall
    clock (p99 marked), hashing apart."""
    runs = [r for r in results if r.requests]
    fig, ax = _figure(max(6.0, 0.6 * len(runs) + 2), 4.0)
    data = [[max(q.decision_cpu_us, 1e-2) for q in r.requests] for r in runs]
    ax.boxplot(data, whis=(1, 99), showfliers=False)
    ax.scatter(range(1, len(runs) + 1), [max(r.run.decision_p99_us, 1e-2) for r in runs],
               marker="x", color="grey", label="wall-clock p99")  # fmt: skip
    ax.set_xticks(range(1, len(runs) + 1), [_name(r) for r in runs], rotation=30, ha="right",
                  fontsize="small")  # fmt: skip
    ax.axhline(1000, color="red", linestyle="--", linewidth=1, label="1 ms")
    ax.set_yscale("log")
    ax.set_ylabel("decision CPU time (µs, log; hashing excluded)")
    ax.legend(fontsize="small")
    return _save(fig, path, title)


def plot_faults(
    results: Sequence[ClusterResult],
    baseline: Callable[[ClusterResult], ClusterResult | None],
    path: str | os.PathLike[str],
    *,
    title: str = "",
) -> Path:
    """Hit ratio of each fault run beside its fault-free run; broken invariants in red."""
    fig, ax = _figure(max(6.0, 0.7 * len(results) + 2), 4.2)
    for i, res in enumerate(results):
        base = baseline(res)
        ok = not res.invariants.broken()
        if base is not None:
            ax.bar(i - 0.2, base.run.hit_ratio, width=0.4, color="#bbbbbb",
                   label="fault-free" if i == 0 else None)  # fmt: skip
        ax.bar(i + 0.2, res.run.hit_ratio, width=0.4, color=_COLOURS[0] if ok else "red",
               label="with faults" if i == 0 else None)  # fmt: skip
    ax.set_xticks(range(len(results)),
                  [f"{_name(r)}\n{r.labels['faults']}" for r in results],
                  rotation=30, ha="right", fontsize="x-small")  # fmt: skip
    ax.set_ylabel("prefix hit ratio")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small")
    ax.set_title("stale information may cost hits, never correctness", fontsize="small")
    return _save(fig, path, title)
