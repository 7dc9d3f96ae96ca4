"""Plots of simulated runs: the TTFT distribution per backend, and what capacity buys.

matplotlib is imported inside each function (``Figure`` objects rendered by Agg,
no pyplot state), so the simulator runs without it until a plot is asked for.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import save_figure

from .metrics import SimResult

__all__ = ["plot_capacity_sweep", "plot_ttft_cdf", "run_label"]

_COLOURS = ("#1f77b4", "#ff7f0e", "#7f7f7f", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
# Equal runs draw equal lines: distinct dashes and markers keep each one visible.
_DASHES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v")


def run_label(labels: Mapping[str, Any], key: str = "backend") -> str:
    """A run's legend entry: ``labels[key]``, else its index class and block size."""
    if key in labels:
        return str(labels[key])
    return f"{labels.get('index', '?')} (block {labels.get('block_size', '?')})"


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig, fig.subplots(1, ncols)


def plot_ttft_cdf(
    results: Sequence[SimResult],
    path: str | os.PathLike[str],
    *,
    label_key: str = "backend",
    title: str = "Time to first token",
) -> Path:
    """One empirical CDF of TTFT per run, on a log time axis.

    Args:
        results: the runs to compare (typically one per backend, same trace).
        path: the PNG to write.
        label_key: the label naming a run in the legend (see :func:`run_label`).
        title: the figure's title.

    Returns:
        ``path``.
    """
    from matplotlib.ticker import FuncFormatter

    fig, ax = _figure(6.4, 4.2)
    for i, res in enumerate(results):
        ttft = sorted(r.ttft_s for r in res.requests)
        if not ttft:
            continue
        frac = [(k + 1) / len(ttft) for k in range(len(ttft))]
        name = run_label(res.labels, label_key)
        p50 = res.run.ttft_p50_s
        ax.step(ttft, frac, where="post", color=_COLOURS[i % len(_COLOURS)],
                linestyle=_DASHES[i % len(_DASHES)],
                label=f"{name} (p50 {_seconds(p50)})")  # fmt: skip
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g} s"))
    ax.set_xlabel("TTFT (log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    ax.set_title(title, fontsize=10)
    out = Path(path)
    save_figure(fig, out)
    return out


def _seconds(value: float) -> str:
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.2f} s"


def _tokens(value: float) -> str:
    # Decimal, as capacities are usually given (vLLM's 8k = 8,000).
    for unit, size in (("M", 10**6), ("k", 10**3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def plot_capacity_sweep(
    runs: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    label_key: str = "backend",
    title: str = "What KV capacity buys",
) -> Path:
    """Hit ratio and TTFT p90 against KV capacity, one line per backend.

    Args:
        runs: run rows (:func:`~.tables.run_rows`), several capacities per backend.
        path: the PNG to write.
        label_key: the label that tells backends apart.
        title: the figure's title.

    Returns:
        ``path``.
    """
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for row in runs:
        lines.setdefault(run_label(row, label_key), []).append(row)
    from matplotlib.ticker import FuncFormatter, NullLocator

    fig, (hit_ax, ttft_ax) = _figure(10.0, 4.0, ncols=2)
    caps: set[int] = set()
    for i, (name, rows) in enumerate(lines.items()):
        rows = sorted(rows, key=lambda r: r["capacity_tokens"])
        x = [r["capacity_tokens"] for r in rows]
        caps.update(x)
        style = {
            "color": _COLOURS[i % len(_COLOURS)],
            "linestyle": _DASHES[i % len(_DASHES)],
            "marker": _MARKERS[i % len(_MARKERS)],
            "label": name,
        }
        hit_ax.plot(x, [r["hit_ratio"] for r in rows], **style)
        ttft_ax.plot(x, [r["ttft_p90_s"] for r in rows], **style)
    for ax, ylabel in ((hit_ax, "prefix hit ratio"), (ttft_ax, "TTFT p90 (s)")):
        ax.set_xscale("log")
        ax.set_xticks(sorted(caps))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _tokens(v)))
        ax.set_xlabel("KV capacity (tokens, log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    hit_ax.set_ylim(0, 1.0)
    ttft_ax.set_ylim(bottom=0)
    fig.suptitle(title, fontsize=11)
    out = Path(path)
    save_figure(fig, out)
    return out
