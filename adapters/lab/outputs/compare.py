"""``compare``'s outputs: its tables (terminal and report.md), results.json, tidy tables.

One column list per table serves the terminal and Markdown; report.md has a section per
axis that moved: per workload the index (the K-live table), the capacity (sweep and
anchors), the scheduler (the arrival-time table and its headline) and the request rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prefixkv.indexes.registry import describe_index

from ..compare.anchors import CapacityAnchor
from ..compare.run import Comparison, WorkloadResult
from ..extras import has_extra
from ..sim.load import LoadSummary
from ..sim.metrics import RunMetrics
from ..sim.rate_sweep import saturation_of
from ..sim.runs import IndexTimes, KLiveHits, RunRow, SweepHit
from .markdown import (
    Column,
    definitions,
    human_bytes,
    image,
    markdown_table,
    partial_notice,
    rate,
    seconds,
    table,
    titled_table,
    write_text,
)
from .tables import write_tables

__all__ = [
    "ANCHOR_COLUMNS",
    "COLUMNS",
    "RATE_COLUMNS",
    "TIME_COLUMNS",
    "anchor_rows",
    "capacity_lines",
    "load_lines",
    "rate_rows",
    "rate_runs",
    "results_document",
    "saturation_lines",
    "table_rows",
    "time_rows",
    "time_title",
    "workload_title",
    "write_compare_tables",
    "write_report",
]

_BACKEND: Column = ("backend", "<", "the index, as NAME or NAME:granularity")

COLUMNS: tuple[Column, ...] = (
    _BACKEND,
    ("driver", "<", "the scheduler it is driven like: vllm, sglang or the generic manager"),
    ("unit", ">", "tokens per block (hash chain, none) or page (radix): the hit granularity"),
    ("hit ratio", ">", "prompt tokens served from the cache / all prompt tokens"),
    ("hit tok", ">", "prompt tokens served from the cache"),
    ("boundary lost", ">", "tokens equal to content the cache held (or computed in a partial "
     "last block it could not keep) but recomputed because they share a block with "
     "different tokens (SPEC BB-2, BB-8)"),
    ("last blk lost", ">", "cached tokens recomputed because a hit stops at len - 1: the "
     "whole last block at block granularity, one token at page size 1 (BB-1, BB-3)"),
    ("evicted blk/tok", ">", "blocks evicted from the index, and the tokens they held"),
    ("admit µs p50/p99", ">", "index time to admit a request: lookup (hashing included), "
     "prefill allocation and registering the prompt; median / 99th percentile over requests"),
    ("request µs p50/p99", ">", "index time of all a request's cache calls: admission, one "
     "allocation per decode step, release; median / 99th percentile over requests"),
    ("peak blk", ">", "most blocks (pages) the index held at once"),
    ("index mem", ">", "estimated bytes of the index structures at the peak (not the KV)"),
)  # fmt: skip
"""The K-live table's columns."""

TIME_COLUMNS: tuple[Column, ...] = (
    _BACKEND,
    ("engine", "<", "the scheduler it runs as: vllm (prefill chunks and decode rows mixed in "
     "a step) or sglang (a prefill step whenever one fits, else a decode step), and its "
     "queue order"),
    ("hit ratio", ">", "prompt tokens served from the cache at first admission / all"),
    ("TTFT p50/p90/p99", ">", "time to first token: arrival to the end of its first step"),
    ("queue mean/p90", ">", "arrival to the first step that computed any of the request"),
    ("E2E p50", ">", "arrival to the last output token"),
    ("req/s", ">", "finished requests per second, first arrival to last finish"),
    ("offered/achieved", ">", "requests per second offered (over the arrival window) and "
     "achieved (finished, first arrival to last finish, as vllm bench serve's request "
     "throughput)"),
    ("goodput", ">", "requests per second that met every SLO bound (--slo-ttft, --slo-tpot, "
     "--slo-e2el), as vllm bench serve --goodput; - without an SLO"),
    ("load", "<", "overloaded when the achieved rate falls over 10% short of the sent rate "
     "and the queueing delay grows by over 0.1 s per second of run (a least-squares "
     "trend); closed loop when sessions held the sent rate below the offered one"),
    ("prefill GPU-s", ">", "GPU-seconds of prefill computed / saved by prefix hits, by the "
     "cost profile's prefill terms; both count every admission, so a preempted request's "
     "recompute and its re-hit on its own blocks are in them"),
    ("evicted blk", ">", "blocks (pages) evicted from the index"),
    ("preempt", ">", "preemptions (vLLM) or retractions (SGLang): requests recomputed"),
)  # fmt: skip
"""The arrival-time table's columns."""


RATE_COLUMNS: tuple[Column, ...] = (
    ("rate", ">", "the request rate asked for (req/s)"),
    ("backend", "<", "the index, and the engine it runs as"),
    ("offered/achieved", ">", "requests per second offered and achieved"),
    ("goodput", ">", "requests per second that met the SLO (- without one)"),
    ("TTFT p50/p90", ">", "time to first token"),
    ("TPOT p50", ">", "time per output token after the first"),
    ("hit ratio", ">", "prompt tokens served from the cache"),
    ("load", "<", "ok, closed loop, or OVERLOADED (queues grow without bound)"),
)
"""The request-rate sweep table's columns."""

ANCHOR_COLUMNS: tuple[Column, ...] = (
    _BACKEND,
    ("infinite-cache hit", ">", "hit ratio with nothing ever evicted: the most any capacity "
     "gives"),
    ("working set (capacity needed)", ">", "the smallest capacity that reaches the "
     "infinite-cache hit ratio (within 5%, by bisection over replays): the largest live "
     "plus reusable footprint, above which the hit ratio stops improving"),
    ("knee", ">", "the smallest capacity reaching 98% of the infinite-cache hit ratio (by "
     "bisection); without --capacity-search, the sweep's point farthest above the line "
     "from its tightest to its roomiest point (log capacity)"),
    ("hit at knee", ">", "hit ratio at the knee"),
    ("all requests' KV", ">", "every request's prompt and output at once (nothing evicted): "
     "the sum, not what is needed"),
)  # fmt: skip
"""The capacity anchors table's columns."""


def _us(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def _gpu_s(value: float) -> str:
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def _load_word(load: LoadSummary) -> str:
    return "OVERLOADED" if load.overloaded else "closed loop" if load.held_back else "ok"


def _as_engine(t: RunRow) -> str:
    return f"{t.labels['backend']} as {t.labels['engine']}"


def table_rows(backends: Sequence[RunRow]) -> list[list[str]]:
    """One row of :data:`COLUMNS` cells per backend's K-live run."""
    return [_k_live_row(b.labels, b.part(KLiveHits), b.part(IndexTimes)) for b in backends]


def _k_live_row(labels: Mapping[str, Any], h: KLiveHits, t: IndexTimes) -> list[str]:
    return [
        labels["backend"],
        labels["driver"],
        str(labels["block_size"]),
        f"{h.hit_ratio:.1%}",
        f"{h.hit_tokens:,}",
        f"{h.boundary_lost_tokens:,}",
        f"{h.cap_lost_tokens:,}",
        f"{h.evicted_blocks:,} / {h.evicted_tokens:,}",
        f"{_us(t.admit_us_p50)} / {_us(t.admit_us_p99)}",
        f"{_us(t.index_us_p50)} / {_us(t.index_us_p99)}",
        f"{h.peak_cached_blocks:,}",
        human_bytes(h.index_memory_bytes),
    ]


def time_rows(runs: Sequence[RunRow]) -> list[list[str]]:
    """One row of :data:`TIME_COLUMNS` cells per arrival-time run."""
    return [_time_row(t.labels, t.part(RunMetrics), t.part(LoadSummary)) for t in runs]


def _time_row(labels: Mapping[str, Any], r: RunMetrics, load: LoadSummary) -> list[str]:
    return [
        labels["backend"],
        f"{labels['engine']}, {labels['policy']}",
        f"{r.hit_ratio:.1%}",
        f"{seconds(r.ttft_p50_s)} / {seconds(r.ttft_p90_s)} / {seconds(r.ttft_p99_s)}",
        f"{seconds(r.queueing_mean_s)} / {seconds(r.queueing_p90_s)}",
        seconds(r.e2e_p50_s),
        f"{r.request_throughput:.3g}",
        f"{rate(load.offered_rate)} / {rate(load.achieved_rate)}",
        rate(load.goodput),
        _load_word(load),
        f"{_gpu_s(r.prefill_gpu_s)} / {_gpu_s(r.saved_gpu_s)}",
        f"{r.evicted_blocks:,}",
        f"{r.num_preemptions:,}",
    ]


def load_lines(w: WorkloadResult) -> list[str]:
    """One line per run at the table's capacity and rate that is overloaded or held back
    by closed-loop sessions."""
    return [
        f"{w.name}, {_as_engine(t)}: {load.verdict()}"
        for t in w.arrival_at_table()
        if (load := t.part(LoadSummary)).overloaded or load.held_back
    ]


def rate_runs(w: WorkloadResult) -> list[RunRow]:
    """The rate sweep's runs at the table's capacity, by rate then backend (empty: no sweep)."""
    if not any(t.labels["role"] == "rate" for t in w.arrival_runs):
        return []
    runs = [t for t in w.arrival_runs if t.labels["role"] in ("table", "rate")]
    return sorted(
        runs,
        key=lambda t: (t.labels["request_rate"] or 0.0, t.labels["backend"], t.labels["engine"]),
    )


def rate_rows(runs: Sequence[RunRow]) -> list[list[str]]:
    """One row of :data:`RATE_COLUMNS` cells per run."""
    return [_rate_row(t, t.part(RunMetrics), t.part(LoadSummary)) for t in runs]


def _rate_row(t: RunRow, r: RunMetrics, load: LoadSummary) -> list[str]:
    return [
        f"{t.labels['request_rate'] or 0.0:g}",
        _as_engine(t),
        f"{rate(load.offered_rate)} / {rate(load.achieved_rate)}",
        rate(load.goodput),
        f"{seconds(r.ttft_p50_s)} / {seconds(r.ttft_p90_s)}",
        seconds(r.tpot_p50_s),
        f"{r.hit_ratio:.1%}",
        _load_word(load),
    ]


def saturation_lines(w: WorkloadResult) -> list[str]:
    """Per backend and engine, where the rate sweep saturates it (empty without a sweep)."""
    points = [
        (_as_engine(r), rps, r.part(LoadSummary))
        for r in rate_runs(w)
        if (rps := r.labels["request_rate"]) is not None
    ]
    return [s.describe() for s in saturation_of(points)]


_SEARCH = "- (--capacity-search finds it)"


def anchor_rows(w: WorkloadResult) -> list[list[str]]:
    """One row of :data:`ANCHOR_COLUMNS` cells per backend."""
    return [_anchor_row(a) for a in w.anchors]


def _anchor_row(a: CapacityAnchor) -> list[str]:
    knee = _SEARCH if a.num_points < 3 else "- (the sweep has no bend: --capacity-search finds it)"
    return [
        a.backend,
        f"{a.infinite_hit_ratio:.1%}",
        _SEARCH if a.working_set_tokens is None else a.describe(a.working_set_tokens),
        knee if a.knee_tokens is None else a.describe(a.knee_tokens),
        "-" if a.knee_hit_ratio is None else f"{a.knee_hit_ratio:.1%}",
        a.describe(a.infinite_capacity_tokens),
    ]


def capacity_lines(w: WorkloadResult) -> list[str]:
    """Per backend with a working set found: what the table's capacity gives against what
    the reuse needs."""
    out = []
    hits = {b.labels["backend"]: b.part(KLiveHits) for b in w.backends}
    for a in w.anchors:
        run = hits.get(a.backend)
        if a.working_set_tokens is None or run is None:
            continue
        text = (
            f"{a.backend}: {w.capacity_tokens:,} tokens give {run.hit_ratio:.1%} of prompt "
            f"tokens from the cache; all the reuse ({a.infinite_hit_ratio:.1%}) needs "
            f"{a.describe(a.working_set_tokens)}"
        )
        if a.knee_tokens is not None and a.knee_hit_ratio is not None:
            text += f", its knee ({a.knee_hit_ratio:.1%}) {a.describe(a.knee_tokens)}"
        out.append(text)
    return out


def workload_title(w: WorkloadResult) -> str:
    """``"few_shot: 200 requests, 117,023 prompt tokens, capacity 128,615 tokens, ..."``."""
    text = (
        f"{w.name}: {w.num_requests:,} requests, {w.prompt_tokens:,} prompt tokens, "
        f"capacity {w.capacity_tokens:,} tokens, concurrency {w.concurrency}"
    )
    return text + (" (interrupted: partial)" if w.partial else "")


def time_title(w: WorkloadResult) -> str:
    """``"arrival time: Poisson, 4 req/s (seed 0); ...; capacity ..."`` (``w`` ran at arrival
    time)."""
    t = w.arrival_at_table()[0].labels
    return (
        f"arrival time: {t['arrivals']}; max_num_seqs {t['max_num_seqs']}, "
        f"max_num_batched_tokens {t['max_num_batched_tokens']:,}; "
        f"profile {t['profile']}; capacity {w.capacity_tokens:,} tokens"
    )


def _capacity_grid(
    caps: Sequence[int], labels: Sequence[str], cells: Mapping[tuple[str, int], str], what: str
) -> str:
    """One row per capacity, one cell per backend (a missing point does not fit)."""
    rows = [[f"{cap:,}", *(cells.get((x, cap)) or "does not fit" for x in labels)] for cap in caps]
    headers = ["capacity (tokens)", *(f"{x}{what}" for x in labels)]
    return markdown_table(headers, rows, ">" * (1 + len(labels)))


def write_compare_tables(comparison: Comparison, out: Path, written: dict[str, str]) -> None:
    """Write ``requests.csv`` and ``runs.csv`` into ``out`` (and Parquet twins when pyarrow
    is installed); ``written`` gets each file's name (``{"requests_csv": "requests.csv"}``)
    as it is complete."""
    tables = {"requests": comparison.request_rows(), "runs": comparison.run_rows()}
    formats = ("csv", "parquet") if has_extra("parquet", ("pyarrow",)) else ("csv",)
    write_tables(tables, out, formats, written)


def results_document(comparison: Comparison, meta: Mapping[str, Any]) -> dict[str, Any]:
    """results.json's content: ``meta``, then ``workloads``, ``runs`` and ``anchors`` as
    lists of flat records."""
    return {
        "format": "prefixkv-compare/2",
        **meta,
        "workloads": [w.row() for w in comparison.workloads],
        "runs": comparison.run_rows(),
        "anchors": [a.row() for w in comparison.workloads for a in w.anchors],
    }


def _delta_line(w: WorkloadResult) -> list[str]:
    """The first SGLang-modelled backend's hits against the first vLLM-modelled one's."""
    by_engine: dict[str | None, RunRow] = {}
    for b in w.backends:
        by_engine.setdefault(describe_index(b.labels["index"]).models, b)
    hc_run, rx_run = by_engine.get("vllm"), by_engine.get("sglang")
    if hc_run is None or rx_run is None:
        return []
    hc, rx = hc_run.part(KLiveHits), rx_run.part(KLiveHits)
    hc_name, rx_name = hc_run.labels["backend"], rx_run.labels["backend"]
    gain = rx.hit_tokens - hc.hit_tokens
    return [
        f"{rx_name} served {gain:+,} prompt tokens from the cache relative to "
        f"{hc_name} ({gain / max(1, w.prompt_tokens):+.1%} of all prompt tokens). "
        f"Matched but recomputed: {hc_name} {hc.boundary_lost_tokens:,} at block "
        f"boundaries and {hc.cap_lost_tokens:,} in last blocks; {rx_name} "
        f"{rx.boundary_lost_tokens:,} and {rx.cap_lost_tokens:,}.",
        "",
    ]


_ENGINE_LABEL = {"vllm": "vLLM-style", "sglang": "SGLang-style", "natural": "natural"}


def _time_headline(runs: Sequence[RunRow]) -> list[str]:
    """One paragraph per axis that moved: the index under each scheduler (``natural``
    moves both and says so), then the scheduler per index."""
    out = []
    by_sched: dict[str, list[RunRow]] = {}
    for t in runs:
        by_sched.setdefault(t.labels["scheduler"], []).append(t)
    for sched, group in by_sched.items():
        if len(group) < 2:
            continue
        cells = ", ".join(
            f"{t.labels['backend']} {seconds(t.part(RunMetrics).ttft_p50_s)} "
            f"(hit {t.part(RunMetrics).hit_ratio:.1%})"
            for t in group
        )
        if sched == "natural":
            engines = ", ".join(_as_engine(t) for t in group)
            out.append(
                f"Index and scheduler moved together (each backend on its natural engine: "
                f"{engines}), so a TTFT difference is not the index's alone. TTFT p50: {cells}."
            )
        else:
            cfg = group[0].labels
            out.append(
                f"Index axis, scheduler held at {_ENGINE_LABEL[sched]} ({cfg['batching']} "
                f"batching, {cfg['policy']} queue): TTFT p50 {cells}."
            )
    scheds = [x for x in by_sched if x != "natural"]
    if len(scheds) > 1:
        for label in dict.fromkeys(t.labels["backend"] for t in runs):
            cells = ", ".join(
                f"{_ENGINE_LABEL[t.labels['scheduler']]} {seconds(t.part(RunMetrics).ttft_p50_s)}"
                for t in runs
                if t.labels["backend"] == label and t.labels["scheduler"] in scheds
            )
            out.append(f"Scheduler axis, index held at {label}: TTFT p50 {cells}.")
    return [x for line in out for x in (line, "")]


def _strips(w: WorkloadResult, plots: Mapping[str, str]) -> list[str]:
    """The selected requests' hit, boundary-lost and last-block-lost tokens."""
    link = image(f"per-request strips for {w.name}", plots.get(f"strips_{w.name}"))
    if not w.strip_requests:
        return link
    rows = []
    for i in w.strip_requests:
        seen = [b.requests[i] for b in w.backends]
        fates = (f"{p.hit_tokens} / {p.boundary_lost_tokens} / {p.cap_lost_tokens}" for p in seen)
        rows.append([seen[0].request_id, str(seen[0].prompt_tokens), *fates])
    names = [f"{b.labels['backend']} hit / bnd / last" for b in w.backends]
    grid = markdown_table(["request", "prompt", *names], rows, "<>" + ">" * len(names))
    return [
        "Selected requests (hit / boundary-lost / last-block-lost tokens):",
        "",
        grid,
        "",
        *link,
    ]


def _seed_paragraph(w: WorkloadResult) -> list[str]:
    lines = []
    for b in w.backends:
        by_id = {r.request_id: r for r in b.requests}
        bee, again = by_id.get("B"), by_id.get("A-again")
        if not describe_index(b.labels["index"]).caches or bee is None:
            continue
        line = (
            f"- {b.labels['backend']}: B hit {bee.hit_tokens} of {bee.prompt_tokens} tokens, "
            f"matched {bee.matched_tokens}, {bee.boundary_lost_tokens} lost to the "
            "block boundary"
        )
        if again is not None:
            line += f"; A again hit {again.hit_tokens}, recomputing {again.cap_lost_tokens}"
        lines.append(line + ".")
    if not lines:
        return []
    return [
        "The seed document's example: A has 80 tokens, B shares A's first 30 and then "
        "differs, then A comes again. In the document's setting (16-token blocks, page "
        "size 1) the hash chain hits 16 tokens of B, recomputing tokens 16..29 although they "
        "are cached, because they share block 1 with different tokens, and 64 of A again "
        "(the whole last block is recomputed for the last token's logits); the radix tree "
        "hits 30 and 79. This run:",
        "",
        *lines,
        "",
    ]


def _workload_sections(w: WorkloadResult, plots: Mapping[str, str]) -> list[str]:
    """One workload: a section per axis that moved (index, capacity, scheduler, rate)."""
    out = [f"## {w.name}", "", f"{workload_title(w)}. Source: {w.source}.", ""]
    for note in w.notes:
        out += [f"> Note: {note}", ""]
    out += [table(COLUMNS, table_rows(w.backends)), "", *_delta_line(w)]
    if w.name == "seed":
        out += _seed_paragraph(w)
    if w.sweep:
        labels = list(dict.fromkeys(p.labels["backend"] for p in w.sweep))
        ratio = {
            (p.labels["backend"], p.labels["capacity_tokens"]): f"{hit:.1%}"
            for p in w.sweep
            if (hit := p.part(SweepHit).hit_ratio) is not None
        }
        grid = _capacity_grid(w.sweep_capacities, labels, ratio, "")
        out += ["Hit ratio at each capacity of the sweep:", "", grid, ""]
    if w.anchors:
        a = w.anchors[0]
        gib = f" (GiB of KV for {a.model})" if a.model and a.kv_bytes_per_token else ""
        notes = [f"- **Capacity.** {line}." for line in capacity_lines(w)]
        out += titled_table(f"Capacity anchors{gib}:", ANCHOR_COLUMNS, anchor_rows(w), notes)
    out += _strips(w, plots)
    runs = w.arrival_at_table()
    return out + (_arrival_sections(w, runs, plots) if runs else [])


def _arrival_sections(
    w: WorkloadResult, runs: Sequence[RunRow], plots: Mapping[str, str]
) -> list[str]:
    """The arrival-time table (index and scheduler axes), the rate sweep, the capacities."""
    engines = "; ".join(
        f"{_as_engine(t)} ({t.labels['batching']} batching, {t.labels['policy']})" for t in runs
    )
    out = [
        f"### {w.name} at arrival time",
        "",
        f"{time_title(w)}. Varied: {runs[0].labels['varied']}. Engines: {engines}.",
        "",
        table(TIME_COLUMNS, time_rows(runs)),
        "",
        *_time_headline(runs),
        *(x for line in load_lines(w) for x in (f"**Load.** {line}.", "")),
        *image(f"TTFT CDF for {w.name}", plots.get(f"ttft_cdf_{w.name}")),
    ]
    swept = rate_runs(w)
    if swept:
        notes = [f"- {line}" for line in saturation_lines(w)]
        title = "Request-rate sweep at the table's capacity:"
        out += titled_table(title, RATE_COLUMNS, rate_rows(swept), notes)
    by_cap = [t for t in w.arrival_runs if t.labels["role"] != "rate"]
    caps = sorted({t.labels["capacity_tokens"] for t in by_cap})
    if len(caps) >= 2:
        labels = list(dict.fromkeys(t.labels["backend"] for t in by_cap))
        cells = {}
        for t in by_cap:
            r = t.part(RunMetrics)
            key = (t.labels["backend"], t.labels["capacity_tokens"])
            cells[key] = f"{r.hit_ratio:.1%} / {seconds(r.ttft_p90_s)}"
        grid = _capacity_grid(caps, labels, cells, " hit / TTFT p90")
        out += ["Hit ratio and TTFT p90 at each capacity:", "", grid, ""]
    alt = f"hit ratio and TTFT p90 vs capacity for {w.name}"
    return out + image(alt, plots.get(f"time_capacity_{w.name}"))


def _configuration(doc: Mapping[str, Any]) -> list[str]:
    """The run's settings, the machine and the versions."""
    cfg = doc["config"]
    out = [
        "## Configuration",
        "",
        f"- command: `{cfg['command']}`",
        f"- backends: {', '.join(cfg['backends_described'])}",
        f"- concurrency (most live requests): {cfg['concurrency']}",
        f"- capacity: {cfg['capacity_rule']}",
        *([f"- model and GPU: {cfg['capacity_model']}"] if cfg.get("capacity_model") else []),
        *([f"- admission: {cfg['admission']}"] if cfg.get("admission") else []),
        f"- capacity sweep: {'yes' if cfg['capacity_sweep'] else 'no'}",
        f"- seed: {cfg['seed']}",
        f"- run time: {doc['elapsed_seconds']:.1f} s",
        f"- timings: {cfg['timing']}",
    ]
    if cfg.get("arrivals"):
        out += [
            f"- arrivals: {cfg['arrivals']}",
            f"- engines: {'; '.join(cfg['engines'])}",
            f"- scheduler: max_num_seqs {cfg['max_num_seqs']}, max_num_batched_tokens "
            f"{cfg['max_num_batched_tokens']:,}, chunked prefill",
            f"- cost profile: {cfg['profile']} ({cfg['profile_model']} on "
            f"{cfg['profile_device']}); source: {cfg['profile_source']}",
        ]
    return out + [
        f"- tables: {', '.join(doc.get('tables', {}).values()) or 'none written'}",
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in doc["machine"].items()),
        *(f"- {k}: {v}" for k, v in doc["versions"].items() if v is not None),
        "",
    ]


_INTRO = (
    "Every backend replays the same requests with its natural scheduler's call order, at "
    "the same KV capacity in tokens. Block-granular caching loses matched tokens that "
    "share a block with different ones; a token-granular radix tree does not."
)
_INTRO_TIME = (
    "Each backend also runs at arrival time: requests queue, are batched and "
    "prefilled in chunks, and every step costs what the cost profile says, giving "
    "TTFT, queueing and the GPU time prefix hits save. One thing varies at a time: "
    "all backends under the same scheduler unless the scheduler is swept, and the "
    "headline of each table says which axis moved."
)


def write_report(path: Path, workloads: Sequence[WorkloadResult], doc: Mapping[str, Any]) -> None:
    """Write report.md from the records and results.json's metadata ``doc`` (``config``,
    ``machine``, ``versions``, ``plots``, ``partial``, ``elapsed_seconds``)."""
    plots = doc.get("plots", {})
    has_arrival = any(w.arrival_runs for w in workloads)
    out = ["# prefixkv: prefix-cache backends head to head", ""]
    if doc.get("partial"):
        notice = partial_notice("the run was interrupted", "backends and workloads")
        out += [notice[0] + " Sweeps and plots may be missing.", ""]
    if doc.get("warnings"):
        out += ["**Warnings:**", "", *(f"- {line}" for line in doc["warnings"]), ""]
    out += [_INTRO, "", *([_INTRO_TIME, ""] if has_arrival else []), *_configuration(doc)]
    out += ["## Columns", "", *definitions(COLUMNS)]
    if has_arrival:
        out += ["Arrival-time columns:", "", *definitions(TIME_COLUMNS)]
    if plots.get("capacity"):
        alt = "hit ratio vs capacity"
        out += ["## Hit ratio vs cache capacity", "", *image(alt, plots["capacity"])]
    if plots.get("index_time"):
        alt = "index time vs prompt length"
        out += ["## Index time vs prompt length", "", *image(alt, plots["index_time"])]
    for w in workloads:
        out += _workload_sections(w, plots)
    write_text(path, "\n".join(out))
