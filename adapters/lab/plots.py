"""The comparison's PNG plots: hit ratio vs capacity, index time vs prompt length, strips,
and with arrival-time runs the TTFT CDF and hit ratio / TTFT p90 vs capacity per workload.

matplotlib is imported inside each function (``Figure`` objects rendered by Agg, no
pyplot state), so the CLI runs without it until a plot is asked for.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import save_figure
from prefixkv.indexes.registry import describe_index

from .compare.k_live import BackendRun
from .compare.run import WorkloadResult
from .extras import require_extra
from .sim.plots import plot_capacity_sweep, plot_ttft_cdf

Tick = Callable[[int], object]

__all__ = [
    "SEGMENT_COLOURS",
    "backend_colour",
    "num_plots",
    "plot_capacity",
    "plot_index_time",
    "plot_strips",
    "plot_time",
    "write_plots",
]

SEGMENT_COLOURS: Mapping[str, str] = {
    "hit": "#2ca02c",
    "boundary": "#ff7f0e",
    "last block": "#d62728",
    "new": "#d0d0d0",
}
"""Strip-plot colours per kind of prompt token."""

_ENGINE_COLOURS = {"vllm": "#1f77b4", "sglang": "#ff7f0e"}  # by IndexDescription.models
_NO_CACHE_COLOUR = "#7f7f7f"
_SPARE_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#2ca02c")
_SEGMENT_LABELS = {
    "hit": "hit (served from the cache)",
    "boundary": "matched, recomputed: block boundary",
    "last block": "matched, recomputed: last block (len-1 cap)",
    "new": "new (not cached)",
}


def backend_colour(index: str, position: int) -> str:
    """A stable colour per engine modelled (grey: no cache); the ``position``-th spare otherwise."""
    description = describe_index(index)
    if not description.caches:
        return _NO_CACHE_COLOUR
    spare = _SPARE_COLOURS[position % len(_SPARE_COLOURS)]
    return _ENGINE_COLOURS.get(description.models or "", spare)


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _label(b: BackendRun) -> str:
    unit = describe_index(b.index).unit
    return f"{b.backend} ({b.driver}, {unit} {b.block_size})"


def _plain_log_ticks(ax: Any, values: Sequence[int]) -> None:
    """Label a log axis ``1k, 10k`` (and its minor ticks too when it spans < 1 decade)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    def fmt(x: float, _pos: int) -> str:
        if x >= 1000:
            return f"{x / 1000:g}k"
        return f"{x:g}"

    ax.xaxis.set_major_formatter(FuncFormatter(fmt))
    if values and max(values) < 10 * min(values):
        ax.xaxis.set_minor_formatter(FuncFormatter(fmt))
    else:
        ax.xaxis.set_minor_formatter(NullFormatter())


def plot_capacity(workloads: Sequence[WorkloadResult], path: Path) -> bool:
    """Hit ratio vs capacity in tokens (log x), one panel per workload with a sweep.

    Returns:
        Whether a file was written (``False`` when no workload has a sweep).
    """
    swept = [w for w in workloads if w.sweep]
    if not swept:
        return False
    cols = min(3, len(swept))
    rows = math.ceil(len(swept) / cols)
    fig = _figure(4.6 * cols, 3.4 * rows + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in axes.flat[len(swept) :]:
        ax.set_visible(False)
    for ax, w in zip(axes.flat, swept, strict=False):
        caps = w.sweep_capacities
        ratio = {(p.backend, p.capacity_tokens): p.hit_ratio for p in w.sweep}
        for pos, b in enumerate(w.backends):
            ys = [ratio.get((b.backend, c)) for c in caps]
            ys_plot = [math.nan if y is None else y for y in ys]
            ax.plot(caps, ys_plot, marker="o", label=_label(b), color=backend_colour(b.index, pos))
        ax.axvline(w.capacity_tokens, color="#555555", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        _plain_log_ticks(ax, caps)
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"{w.name} ({w.num_requests} requests)", fontsize=10)
        ax.set_xlabel("KV capacity (tokens, log scale)")
        ax.set_ylabel("hit ratio (tokens)")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)))
    fig.suptitle("Prefix-cache hit ratio vs cache capacity (dotted: the table's capacity)")
    save_figure(fig, path)
    return True


def _binned_medians(xs: Sequence[int], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    if not xs:
        return [], []
    lo, hi = max(1, min(xs)), max(xs)
    if hi <= lo:
        return [float(lo)], [sorted(ys)[len(ys) // 2]]
    edges = [lo * (hi / lo) ** (i / 12) for i in range(13)]
    edges[-1] = hi + 1
    mx, my = [], []
    for left, right in itertools.pairwise(edges):
        sel = sorted(y for x, y in zip(xs, ys, strict=True) if left <= x < right)
        if sel:
            mx.append(math.sqrt(left * right))
            my.append(sel[len(sel) // 2])
    return mx, my


def _time_panel(ax: Any, workloads: Sequence[WorkloadResult], field: str, title: str) -> None:
    labels = [b.backend for b in workloads[0].backends]
    for pos, label in enumerate(labels):
        xs: list[int] = []
        ys: list[float] = []
        runs = [b for w in workloads for b in w.backends if b.backend == label]
        for b in runs:
            xs += b.per_request.prompt_tokens
            ys += [max(y, 0.01) for y in getattr(b.per_request, field)]
        meta = runs[0]
        colour = backend_colour(meta.index, pos)
        ax.scatter(xs, ys, s=6, alpha=0.25, color=colour, linewidths=0)
        mx, my = _binned_medians(xs, ys)
        ax.plot(mx, my, color=colour, linewidth=2, marker="o", markersize=3, label=_label(meta))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel("index time (µs, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def plot_index_time(workloads: Sequence[WorkloadResult], path: Path) -> None:
    """Per-request index time vs prompt length, all workloads pooled, per backend.

    Left: admission (lookup with hashing, prefill allocation, prompt registration);
    right: every cache call of the request, decode steps included. Dots are
    requests; lines are medians over log-spaced prompt-length bins.
    """
    fig = _figure(12.0, 4.9)
    left, right = fig.subplots(1, 2, sharey=True)
    _time_panel(left, workloads, "admit_us", "admission: lookup + prefill allocation + insert")
    _time_panel(right, workloads, "index_us", "whole request: admission + decode steps + release")
    right.set_ylabel("")
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)))
    fig.suptitle("Index time per request vs prompt length (dots: requests; lines: binned medians)")
    save_figure(fig, path)


def _segments(b: BackendRun, i: int) -> list[tuple[str, int]]:
    p = b.per_request
    hit, cap, bnd = p.hit_tokens[i], p.cap_lost_tokens[i], p.boundary_lost_tokens[i]
    new = p.prompt_tokens[i] - hit - cap - bnd
    return [("hit", hit), ("last block", cap), ("boundary", bnd), ("new", new)]


def plot_strips(w: WorkloadResult, path: Path) -> bool:
    """A few requests as bars of prompt tokens, coloured by fate, backends side by side.

    Each request gets its own panel and x range (tokens 0..prompt length), so a
    14-token boundary loss stays visible; dotted lines mark the largest block size
    when the prompt has at most 40 such blocks.

    Returns:
        Whether a file was written (``False`` when no request was selected).
    """
    chosen: list[int] = list(w.strip_requests)
    if not chosen:
        return False
    backends = w.backends
    block = max(b.block_size for b in backends)
    fig = _figure(9.0, 0.6 + len(chosen) * (0.45 * len(backends) + 0.55))
    axes = fig.subplots(len(chosen), 1, squeeze=False)[:, 0]
    for ax, i in zip(axes, chosen, strict=True):
        first = backends[0].per_request
        length = first.prompt_tokens[i]
        for row, b in enumerate(backends):
            left = 0
            y = len(backends) - 1 - row
            for kind, n in _segments(b, i):
                if n > 0:
                    ax.barh(y, n, left=left, height=0.7, color=SEGMENT_COLOURS[kind])
                left += n
            hit = b.per_request.hit_tokens[i]
            bnd = b.per_request.boundary_lost_tokens[i]
            cap = b.per_request.cap_lost_tokens[i]
            ax.text(
                length * 1.01,
                y,
                f"hit {hit} · boundary {bnd} · last block {cap}",
                va="center",
                fontsize=7,
            )
        if block > 1 and length // block <= 40:
            for x in range(block, length, block):
                ax.axvline(x, color="#444444", linestyle=":", linewidth=0.6)
        ax.set_yticks(range(len(backends)))
        ax.set_yticklabels([b.backend for b in reversed(backends)], fontsize=8)
        ax.set_xlim(0, length * 1.3)
        ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= length])
        ax.set_title(f"request {first.ids[i]} ({length} prompt tokens)", fontsize=9, loc="left")
        ax.tick_params(axis="x", labelsize=7)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[-1].set_xlabel("prompt token position")
    from matplotlib.patches import Patch

    handles = [Patch(color=SEGMENT_COLOURS[k], label=_SEGMENT_LABELS[k]) for k in SEGMENT_COLOURS]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    title = f"{w.name}: what happened to each prompt token"
    if block > 1:
        title += f" (dotted: {block}-token block boundaries)"
    fig.suptitle(title, fontsize=10)
    save_figure(fig, path)
    return True


def plot_time(w: WorkloadResult, out: Path) -> dict[str, str]:
    """The arrival-time plots of one workload: the TTFT CDF per backend at the table's
    capacity, and hit ratio and TTFT p90 against capacity when there are several.

    Returns:
        ``{"ttft_cdf_<workload>": file, "time_capacity_<workload>": file}`` for the
        files written (none without arrival-time runs).
    """
    written: dict[str, str] = {}
    table = w.arrival_at_table()
    if not table:
        return written
    part = _file_part(w.name)
    name = f"ttft_cdf_{part}.png"
    t = table[0]
    plot_ttft_cdf(
        [r.result for r in table],
        out / name,
        label_key="legend",
        title=f"{w.name}: time to first token\n{t.settings.describe_arrivals()}, "
        f"{w.capacity_tokens:,} tokens of KV, profile {t.settings.profile.name}",
    )
    written[f"ttft_cdf_{w.name}"] = name
    by_capacity = [r for r in w.arrival_runs if r.role != "rate"]
    if len({r.capacity_tokens for r in by_capacity}) > 1:
        name = f"time_vs_capacity_{part}.png"
        plot_capacity_sweep(
            [r.row() for r in by_capacity],
            out / name,
            title=f"{w.name}: what KV capacity buys ({t.settings.describe_arrivals()})",
        )
        written[f"time_capacity_{w.name}"] = name
    return written


def num_plots(workloads: Sequence[WorkloadResult]) -> int:
    """How many plot steps :func:`write_plots` reports through ``tick``."""
    return 2 + 2 * len(workloads)


def _file_part(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def write_plots(
    workloads: Sequence[WorkloadResult], out: Path, *, tick: Tick | None = None
) -> dict[str, str]:
    """Write every plot of a comparison into ``out``.

    Returns:
        File names relative to ``out``, by what they show: ``capacity`` (when some
        workload has a sweep), ``index_time``, ``strips_<workload>``, and with
        arrival-time runs ``ttft_cdf_<workload>`` and ``time_capacity_<workload>``.

    Raises:
        ExtraNotInstalledError: matplotlib is not installed (nothing written).
    """
    require_extra("report", "write_plots", ("matplotlib",))

    def step() -> None:
        if tick is not None:
            tick(1)

    written: dict[str, str] = {}
    if plot_capacity(workloads, out / "hit_ratio_vs_capacity.png"):
        written["capacity"] = "hit_ratio_vs_capacity.png"
    step()
    plot_index_time(workloads, out / "index_time_vs_prompt_length.png")
    written["index_time"] = "index_time_vs_prompt_length.png"
    step()
    for w in workloads:
        name = f"strips_{_file_part(w.name)}.png"
        if plot_strips(w, out / name):
            written[f"strips_{w.name}"] = name
        step()
        written.update(plot_time(w, out))
        step()
    return written
