"""Every PNG plot the lab draws, over one figure, palette and title rule: two shapes for
every command (:func:`plot_ttft_cdf`, :func:`plot_against`), then what only ``compare``
(:func:`write_plots`) or ``cluster`` draws. matplotlib is imported only when a plot is
drawn; each file is written whole or not at all.
"""

from __future__ import annotations

import itertools
import math
import statistics
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import StrPath, save_figure
from prefixkv.indexes.registry import describe_index

from ..cluster.metrics import ClusterResult
from ..compare.run import WorkloadResult
from ..extras import require_extra
from ..sim.metrics import RequestRow, RunMetrics, SimResult
from ..sim.runs import RunRow, SweepHit, run_table
from .markdown import seconds, tokens

Curve = tuple[str, Sequence[float]]  # a CDF's legend entry and its values

__all__ = [
    "num_plots", "plot_against", "plot_capacity_sweep", "plot_decision_latency", "plot_faults",
    "plot_frontier", "plot_hit_ratio", "plot_overlap", "plot_policy_ttft", "plot_ttft_cdf",
    "ttft_curves", "write_plots",
]  # fmt: skip

_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
# Equal runs draw equal lines: distinct dashes and markers keep each one visible.
_DASHES = ("-", "--", ":", "-.")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

_SEGMENTS = {  # strip-plot colour and legend per kind of prompt token
    "hit": ("#2ca02c", "hit (served from the cache)"),
    "boundary": ("#ff7f0e", "matched, recomputed: block boundary"),
    "last block": ("#d62728", "matched, recomputed: last block (len-1 cap)"),
    "new": ("#d0d0d0", "new (not cached)"),
}
_ENGINE_COLOURS = {"vllm": "#1f77b4", "sglang": "#ff7f0e"}  # by IndexDescription.models
_NO_CACHE_COLOUR = "#7f7f7f"
_SPARE_COLOURS = ("#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#2ca02c")


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _per_run(n: int, per: float = 0.6, height: float = 4.0) -> Any:
    return _figure(max(6.0, per * n + 2), height).subplots()


def _run_ticks(ax: Any, labels: Sequence[str], start: int = 0, fontsize: str = "small") -> None:
    ticks = range(start, start + len(labels))
    ax.set_xticks(ticks, labels, rotation=30, ha="right", fontsize=fontsize)


def _style(i: int) -> dict[str, str]:
    return {
        "color": _COLOURS[i % len(_COLOURS)],
        "linestyle": _DASHES[i % len(_DASHES)],
        "marker": _MARKERS[i % len(_MARKERS)],
    }


def _save(fig: Any, path: StrPath, title: str) -> Path:
    if title:
        fig.suptitle(textwrap.fill(title, 100), fontsize="small")
    return save_figure(fig, path)


def _axes(ax: Any, xlabel: str, ylabel: str, **settings: Any) -> None:
    """Label the axes, set ``settings`` (scales, limits), draw the grid."""
    ax.set(xlabel=xlabel, ylabel=ylabel, **settings)
    ax.grid(True, which="both", alpha=0.3)


def _decimal_log_axis(ax: Any, values: Sequence[float]) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log")
    ax.set_xticks(sorted(values))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: tokens(v)))


def plot_ttft_cdf(
    curves: Sequence[Curve], path: StrPath, *, title: str = "Time to first token"
) -> Path:
    """One empirical CDF of TTFT per curve (``(legend, seconds)``), on a log time axis."""
    ax = _figure(6.8, 4.2).subplots()
    for i, (label, values) in enumerate(curves):
        ttft = sorted(max(v, 1e-4) for v in values)
        if ttft:
            frac = [(k + 1) / len(ttft) for k in range(len(ttft))]
            style = {**_style(i), "marker": None}
            ax.step(ttft, frac, where="post", label=label, **style)
    _axes(ax, "TTFT (s, log scale)", "fraction of requests", xscale="log", ylim=(0, 1))
    ax.legend(loc="lower right", fontsize="x-small")
    return _save(ax.figure, path, title)


def ttft_curves(
    results: Sequence[SimResult | ClusterResult], label_key: str = "backend"
) -> list[Curve]:
    """Each run's TTFTs, named by its ``label_key`` label (else index and block size)."""
    out: list[Curve] = []
    for res in results:
        labels = res.labels
        name = labels.get(label_key) or f"{labels.get('index')} (block {labels.get('block_size')})"
        out.append(_curve(name, res.requests, res.run.ttft_p50_s))
    return out


def _curve(name: str, requests: Sequence[RequestRow], ttft_p50_s: float) -> Curve:
    return (f"{name} (p50 {seconds(ttft_p50_s)})", [r.ttft_s for r in requests])


def plot_against(
    rows: Sequence[Mapping[str, Any]],
    path: StrPath,
    *,
    x: str,
    measures: Sequence[tuple[str, str]],
    label_key: str,
    xlabel: str,
    title: str = "",
) -> Path:
    """One line per ``label_key`` value of flat run ``rows`` against column ``x`` (log
    axis), a panel per ``(column, axis label)`` of ``measures`` (a ratio drawn 0..1)."""
    lines: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        lines.setdefault(str(row[label_key]), []).append(row)
    fig = _figure(5.0 * len(measures) + 1.8, 4.2)
    axes = fig.subplots(1, len(measures), squeeze=False)[0]
    for ax, (column, ylabel) in zip(axes, measures, strict=True):
        for i, (name, group) in enumerate(lines.items()):
            group = sorted(group, key=lambda r: r[x])
            ax.plot([r[x] for r in group], [r[column] for r in group], label=name, **_style(i))
        _decimal_log_axis(ax, sorted({r[x] for r in rows}))
        _axes(ax, xlabel, ylabel, ylim=(0, 1) if "ratio" in column else (0, None))
        ax.legend(fontsize="x-small", ncol=2)
    return _save(fig, path, title)


def plot_capacity_sweep(
    runs: Sequence[Mapping[str, Any]], path: StrPath, *, title: str = "What KV capacity buys"
) -> Path:
    """Hit ratio and TTFT p90 against KV capacity, one line per backend."""
    return plot_against(
        runs, path, x="capacity_tokens", label_key="backend", title=title,
        measures=(("hit_ratio", "prefix hit ratio"), ("ttft_p90_s", "TTFT p90 (s)")),
        xlabel="KV capacity (tokens, log scale)",
    )  # fmt: skip


def _colour(index: str, position: int) -> str:
    """A colour per engine modelled (grey: no cache), else the ``position``-th spare."""
    description = describe_index(index)
    if not description.caches:
        return _NO_CACHE_COLOUR
    spare = _SPARE_COLOURS[position % len(_SPARE_COLOURS)]
    return _ENGINE_COLOURS.get(description.models or "", spare)


def _label(b: RunRow) -> str:
    labels = b.labels
    unit = describe_index(labels["index"]).unit
    return f"{labels['backend']} ({labels['driver']}, {unit} {labels['block_size']})"


def _panels(fig: Any, n: int, cols: int) -> list[Any]:
    axes = list(fig.subplots(math.ceil(n / cols), cols, squeeze=False).flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return axes[:n]


def _legend_below(fig: Any, ax: Any, fontsize: str = "medium") -> None:
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(3, len(labels)),
               fontsize=fontsize)  # fmt: skip


def plot_capacity(workloads: Sequence[WorkloadResult], path: Path) -> bool:
    """Hit ratio vs capacity, a panel per workload with a sweep; whether one was drawn."""
    swept = [w for w in workloads if w.sweep]
    if not swept:
        return False
    cols = min(3, len(swept))
    fig = _figure(4.6 * cols, 3.4 * math.ceil(len(swept) / cols) + 0.5)
    axes = _panels(fig, len(swept), cols)
    for ax, w in zip(axes, swept, strict=True):
        caps = w.sweep_capacities
        ratio = {
            (p.labels["backend"], p.labels["capacity_tokens"]): p.part(SweepHit).hit_ratio
            for p in w.sweep
        }
        for pos, b in enumerate(w.backends):
            ys = [ratio.get((b.labels["backend"], c), math.nan) for c in caps]
            colour = _colour(b.labels["index"], pos)
            ax.plot(caps, ys, marker="o", label=_label(b), color=colour)
        ax.axvline(w.capacity_tokens, color="#555555", linestyle=":", linewidth=1)
        _decimal_log_axis(ax, caps)
        ax.set_title(f"{w.name} ({w.num_requests} requests)", fontsize=10)
        _axes(ax, "KV capacity (tokens, log scale)", "hit ratio (tokens)", ylim=(-0.02, 1.02))
    _legend_below(fig, axes[0])
    _save(fig, path, "Prefix-cache hit ratio vs cache capacity (dotted: the table's capacity)")
    return True


def _binned_medians(xs: Sequence[int], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    if not xs:
        return [], []
    lo, hi = max(1, min(xs)), max(xs)
    if hi <= lo:
        return [float(lo)], [statistics.median_high(ys)]
    edges = [lo * (hi / lo) ** (i / 12) for i in range(13)]
    edges[-1] = hi + 1
    mx, my = [], []
    for left, right in itertools.pairwise(edges):
        sel = [y for x, y in zip(xs, ys, strict=True) if left <= x < right]
        if sel:
            mx.append(math.sqrt(left * right))
            my.append(statistics.median_high(sel))
    return mx, my


def _time_panel(ax: Any, workloads: Sequence[WorkloadResult], field: str, title: str) -> None:
    labels = [b.labels["backend"] for b in workloads[0].backends]
    for pos, label in enumerate(labels):
        runs = [b for w in workloads for b in w.backends if b.labels["backend"] == label]
        requests = [r for b in runs for r in b.requests]
        xs = [r.prompt_tokens for r in requests]
        ys = [max(getattr(r, field), 0.01) for r in requests]
        colour = _colour(runs[0].labels["index"], pos)
        ax.scatter(xs, ys, s=6, alpha=0.25, color=colour, linewidths=0)
        mx, my = _binned_medians(xs, ys)
        ax.plot(mx, my, color=colour, linewidth=2, marker="o", markersize=3, label=_label(runs[0]))
    ax.set_title(title, fontsize=10)
    xlabel, ylabel = "prompt length (tokens, log scale)", "index time (µs, log scale)"
    _axes(ax, xlabel, ylabel, xscale="log", yscale="log")


def plot_index_time(workloads: Sequence[WorkloadResult], path: Path) -> None:
    """Per-request index time vs prompt length, per backend: admission, whole request."""
    fig = _figure(12.0, 4.9)
    left, right = fig.subplots(1, 2, sharey=True)
    _time_panel(left, workloads, "admit_us", "admission: lookup + prefill allocation + insert")
    _time_panel(right, workloads, "index_us", "whole request: admission + decode steps + release")
    right.set_ylabel("")
    _legend_below(fig, left)
    title = "Index time per request vs prompt length (dots: requests; lines: binned medians)"
    _save(fig, path, title)


def _strip_panel(ax: Any, backends: Sequence[RunRow], i: int, block: int) -> None:
    first = backends[0].requests[i]
    length = first.prompt_tokens
    for row, b in enumerate(backends):
        y = len(backends) - 1 - row
        p = b.requests[i]
        hit, cap, bnd = p.hit_tokens, p.cap_lost_tokens, p.boundary_lost_tokens
        new = p.prompt_tokens - hit - cap - bnd
        left = 0
        for kind, n in {"hit": hit, "last block": cap, "boundary": bnd, "new": new}.items():
            if n > 0:
                ax.barh(y, n, left=left, height=0.7, color=_SEGMENTS[kind][0])
            left += n
        text = f"hit {hit} · boundary {bnd} · last block {cap}"
        ax.text(length * 1.01, y, text, va="center", fontsize=7)
    if block > 1 and length // block <= 40:
        for x in range(block, length, block):
            ax.axvline(x, color="#444444", linestyle=":", linewidth=0.6)
    ax.set_yticks(range(len(backends)))
    ax.set_yticklabels([b.labels["backend"] for b in reversed(backends)], fontsize=8)
    ax.set_xlim(0, length * 1.3)
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= length])
    ax.set_title(f"request {first.request_id} ({length} prompt tokens)", fontsize=9, loc="left")
    ax.tick_params(axis="x", labelsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_strips(w: WorkloadResult, path: Path) -> bool:
    """A few requests as bars of prompt tokens by fate, a panel each (whether drawn)."""
    chosen = w.strip_requests
    if not chosen:
        return False
    backends = w.backends
    block = max(b.labels["block_size"] for b in backends)
    fig = _figure(9.0, 0.6 + len(chosen) * (0.45 * len(backends) + 0.55))
    axes = fig.subplots(len(chosen), 1, squeeze=False)[:, 0]
    for ax, i in zip(axes, chosen, strict=True):
        _strip_panel(ax, backends, i, block)
    axes[-1].set_xlabel("prompt token position")
    from matplotlib.patches import Patch

    handles = [Patch(color=colour, label=label) for colour, label in _SEGMENTS.values()]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8)
    title = f"{w.name}: what happened to each prompt token"
    if block > 1:
        title += f" (dotted: {block}-token block boundaries)"
    _save(fig, path, title)
    return True


def plot_time(w: WorkloadResult, out: Path) -> dict[str, str]:
    """One workload's arrival-time plots: the TTFT CDF, and hit ratio and TTFT p90 against
    capacity when there are several; the files written by what they show."""
    table = w.arrival_at_table()
    if not table:
        return {}
    part, labels = _file_part(w.name), table[0].labels
    arrivals = labels["arrivals"]
    title = (
        f"{w.name}: time to first token\n{arrivals}, {w.capacity_tokens:,} tokens of KV, "
        f"profile {labels['profile']}"
    )
    curves = [
        _curve(f"{r.labels['backend']} as {r.labels['engine']}", r.requests,
               r.part(RunMetrics).ttft_p50_s)
        for r in table
    ]  # fmt: skip
    written = {f"ttft_cdf_{w.name}": f"ttft_cdf_{part}.png"}
    plot_ttft_cdf(curves, out / written[f"ttft_cdf_{w.name}"], title=title)
    by_capacity = [r for r in w.arrival_runs if r.labels["role"] != "rate"]
    if len({r.labels["capacity_tokens"] for r in by_capacity}) > 1:
        name = f"time_vs_capacity_{part}.png"
        title = f"{w.name}: what KV capacity buys ({arrivals})"
        plot_capacity_sweep(run_table(by_capacity), out / name, title=title)
        written[f"time_capacity_{w.name}"] = name
    return written


def num_plots(workloads: Sequence[WorkloadResult]) -> int:
    """How many steps :func:`write_plots` reports through ``tick``."""
    return 2 + 2 * len(workloads)


def _file_part(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def write_plots(
    workloads: Sequence[WorkloadResult], out: Path, *, tick: Callable[[int], object]
) -> dict[str, str]:
    """Write every plot of a comparison into ``out``; the file names by what they show.

    Raises:
        ExtraNotInstalledError: matplotlib is not installed (nothing written).
    """
    require_extra("report", "write_plots", ("matplotlib",))
    written: dict[str, str] = {}
    if plot_capacity(workloads, out / "hit_ratio_vs_capacity.png"):
        written["capacity"] = "hit_ratio_vs_capacity.png"
    tick(1)
    plot_index_time(workloads, out / "index_time_vs_prompt_length.png")
    written["index_time"] = "index_time_vs_prompt_length.png"
    tick(1)
    for w in workloads:
        name = f"strips_{_file_part(w.name)}.png"
        if plot_strips(w, out / name):
            written[f"strips_{w.name}"] = name
        tick(1)
        written.update(plot_time(w, out))
        tick(1)
    return written


def _hit_axis(ax: Any, legend: str = "small") -> None:
    ax.set_ylabel("prefix hit ratio")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=legend)


def _policy(res: ClusterResult) -> str:
    return str(res.labels["policy"])


def _bound(results: Sequence[ClusterResult], name: str) -> ClusterResult | None:
    return next((r for r in results if r.labels["policy"] == name), None)


def plot_hit_ratio(results: Sequence[ClusterResult], path: Path, title: str) -> Path:
    """Hit ratio per policy (bars), with round robin's and the bounds' as lines."""
    ax = _per_run(len(results))
    policies = [r for r in results if r.labels["policy"] not in ("pooled", "infinite")]
    hits = [r.run.hit_ratio for r in policies]
    ax.bar(range(len(hits)), hits, color=_COLOURS[0])
    for i, h in enumerate(hits):
        ax.text(i, h, f"{h:.3f}", ha="center", va="bottom", fontsize="x-small")
    for ref, style in (("round_robin", ":"), ("pooled", "--"), ("infinite", "-.")):
        res = _bound(results, ref)
        if res is not None:
            ax.axhline(res.run.hit_ratio, color="black", linestyle=style, linewidth=1,
                       label=f"{ref} {res.run.hit_ratio:.3f}")  # fmt: skip
    _run_ticks(ax, [_policy(r) for r in policies])
    _hit_axis(ax)
    labels = results[0].labels
    ax.set_title(f"{labels['num_replicas']} replicas x {tokens(labels['capacity_tokens'])} tokens")
    return _save(ax.figure, path, title)


def plot_policy_ttft(results: Sequence[ClusterResult], path: Path, title: str) -> Path:
    """One TTFT CDF per policy."""
    return plot_ttft_cdf(ttft_curves(results, "policy"), path, title=title)


def plot_frontier(results: Sequence[ClusterResult], path: Path, title: str) -> Path:
    """Hit ratio against load imbalance (CV of busy time), a point per run."""
    ax = _figure(6.8, 4.6).subplots()
    for i, r in enumerate(results):
        style = _style(i)
        ax.scatter([r.run.load_cv], [r.run.hit_ratio], color=style["color"],
                   marker=style["marker"], label=_policy(r))  # fmt: skip
    pooled = _bound(results, "pooled")
    if pooled is not None:
        ax.axhline(pooled.run.hit_ratio * 0.9, color="grey", linestyle=":", linewidth=1,
                   label="0.9 x pooled")  # fmt: skip
    ax.axvline(0.1, color="grey", linestyle="--", linewidth=1, label="CV 0.1")
    top = max((r.run.load_cv for r in results if not math.isnan(r.run.load_cv)), default=0.0)
    ax.set_xlim(0, max(0.2, 1.1 * top))
    ax.set_xlabel("load imbalance: CV of replica busy time")
    ax.grid(True, alpha=0.3)
    _hit_axis(ax, "x-small")
    return _save(ax.figure, path, title)


def plot_overlap(results: Sequence[ClusterResult], path: Path, title: str) -> Path:
    """Predicted against realized hit tokens, one panel per policy that predicts."""
    runs = [r for r in results if r.run.overlap_predictions]
    cols = max(1, min(4, len(runs)))
    fig = _figure(3.2 * cols, 3.0 * max(1, math.ceil(len(runs) / cols)))
    for ax, res in zip(_panels(fig, max(1, len(runs)), cols), runs, strict=False):
        pts = [
            (r.predicted_hit_tokens, r.hit_tokens)
            for r in res.requests
            if r.predicted_hit_tokens is not None
        ]
        top = max((max(p) for p in pts), default=1) or 1
        ax.scatter([p for p, _ in pts], [h for _, h in pts], s=4, alpha=0.3)
        ax.plot([0, top], [0, top], color="grey", linewidth=1)
        for axis in ("x", "y"):  # most requests hit little: spread the corner
            getattr(ax, f"set_{axis}scale")("symlog", linthresh=max(res.labels["block_size"], 1))
        run = res.run
        mae = f"MAE {run.overlap_mae_tokens:.0f} tok, phantom {run.phantom_rate:.1%}"
        ax.set_title(f"{_policy(res)}\n{mae}", fontsize="small")
        ax.set_xlabel("predicted (tokens)", fontsize="small")
        ax.set_ylabel("realized (tokens)", fontsize="small")
    return _save(fig, path, title)


def plot_decision_latency(results: Sequence[ClusterResult], path: Path, title: str) -> Path:
    """Router decision time per policy: CPU (box, whiskers p1-p99) and wall-clock p99."""
    runs = [r for r in results if r.requests]
    ax = _per_run(len(runs))
    data = [[max(q.decision_cpu_us, 1e-2) for q in r.requests] for r in runs]
    ax.boxplot(data, whis=(1, 99), showfliers=False)
    ax.scatter(range(1, len(runs) + 1), [max(r.run.decision_p99_us, 1e-2) for r in runs],
               marker="x", color="grey", label="wall-clock p99")  # fmt: skip
    _run_ticks(ax, [_policy(r) for r in runs], start=1)
    ax.axhline(1000, color="red", linestyle="--", linewidth=1, label="1 ms")
    ax.set_yscale("log")
    ax.set_ylabel("decision CPU time (µs, log; hashing excluded)")
    ax.legend(fontsize="small")
    return _save(ax.figure, path, title)


def plot_faults(
    results: Sequence[ClusterResult],
    baseline: Callable[[ClusterResult], ClusterResult | None],
    path: Path,
    title: str,
) -> Path:
    """Hit ratio of each fault run beside its fault-free run; broken invariants in red."""
    ax = _per_run(len(results), per=0.7, height=4.2)
    for i, res in enumerate(results):
        base = baseline(res)
        ok = not res.invariants.broken()
        if base is not None:
            ax.bar(i - 0.2, base.run.hit_ratio, width=0.4, color="#bbbbbb",
                   label="fault-free" if i == 0 else None)  # fmt: skip
        ax.bar(i + 0.2, res.run.hit_ratio, width=0.4, color=_COLOURS[0] if ok else "red",
               label="with faults" if i == 0 else None)  # fmt: skip
    _run_ticks(ax, [f"{_policy(r)}\n{r.labels['faults']}" for r in results], fontsize="x-small")
    _hit_axis(ax)
    ax.set_title("stale information may cost hits, never correctness", fontsize="small")
    return _save(ax.figure, path, title)
