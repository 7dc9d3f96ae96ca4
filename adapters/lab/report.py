"""The comparison's tables and files: aligned text, report.md, results.json, tidy tables.

Everything here reads the typed records :mod:`prefixkv.adapters.lab.compare` returns;
one column list per table serves the terminal and Markdown, so the two never drift.
The analysable outputs are flat: ``requests.csv`` (one row per request x backend x
configuration), ``runs.csv`` (one row per run), Parquet twins when pyarrow is
installed, and ``results.json``, whose ``runs`` and ``workloads`` are lists of flat
records (``pandas.json_normalize`` gives one column per field).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from prefixkv.adapters.outputs import atomic_writer
from prefixkv.indexes.buildinfo import installed_version
from prefixkv.indexes.registry import describe_index

from .compare.arrival import ArrivalRun
from .compare.k_live import BackendRun
from .compare.rates import saturation
from .compare.run import WorkloadResult
from .compare.spec import Scalar
from .extras import has_extra
from .sim import write_rows
from .sim.load import LoadSummary

__all__ = [
    "ANCHOR_COLUMNS",
    "COLUMNS",
    "RATE_COLUMNS",
    "RESULTS_FORMAT",
    "TIME_COLUMNS",
    "anchor_rows",
    "capacity_lines",
    "human_bytes",
    "load_lines",
    "machine_info",
    "markdown_table",
    "package_versions",
    "rate_rows",
    "rate_runs",
    "request_rows",
    "results_document",
    "run_rows",
    "saturation_lines",
    "sweep_table",
    "table_rows",
    "text_table",
    "time_headline",
    "time_rows",
    "time_sweep_table",
    "workload_title",
    "write_report",
    "write_results",
    "write_tables",
]

RESULTS_FORMAT = "prefixkv-compare/2"
"""The ``format`` of results.json: version 2 holds flat ``runs`` and ``workloads``."""

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("backend", "<", "the index, as NAME or NAME:granularity"),
    ("driver", "<", "the scheduler it is driven like: vllm, sglang or the generic manager"),
    ("unit", ">", "tokens per block (hash chain, none) or page (radix): the hit granularity"),
    ("hit ratio", ">", "prompt tokens served from the cache / all prompt tokens"),
    ("hit tok", ">", "prompt tokens served from the cache"),
    (
        "boundary lost",
        ">",
        "tokens equal to content the cache held (or computed in a partial last block it "
        "could not keep) but recomputed because they share a block with different "
        "tokens (SPEC BB-2, BB-8)",
    ),
    (
        "last blk lost",
        ">",
        "cached tokens recomputed because a hit stops at len - 1: the whole "
        "last block at block granularity, one token at page size 1 (BB-1, BB-3)",
    ),
    ("evicted blk/tok", ">", "blocks evicted from the index, and the tokens they held"),
    (
        "admit µs p50/p99",
        ">",
        "index time to admit a request: lookup (hashing included), prefill allocation and "
        "registering the prompt; median / 99th percentile over requests",
    ),
    (
        "request µs p50/p99",
        ">",
        "index time of all a request's cache calls: admission, one allocation per decode "
        "step, release; median / 99th percentile over requests",
    ),
    ("peak blk", ">", "most blocks (pages) the index held at once"),
    ("index mem", ">", "estimated bytes of the index structures at the peak (not the KV)"),
)
"""Table columns: (header, alignment, meaning) — the meaning goes in report.md."""

TIME_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("backend", "<", "the index, as NAME or NAME:granularity"),
    (
        "engine",
        "<",
        "the scheduler it runs as: vllm (prefill chunks and decode rows mixed in a step) "
        "or sglang (a prefill step whenever one fits, else a decode step), and its queue order",
    ),
    ("hit ratio", ">", "prompt tokens served from the cache at first admission / all"),
    ("TTFT p50/p90/p99", ">", "time to first token: arrival to the end of its first step"),
    ("queue mean/p90", ">", "arrival to the first step that computed any of the request"),
    ("E2E p50", ">", "arrival to the last output token"),
    ("req/s", ">", "finished requests per second, first arrival to last finish"),
    (
        "offered/achieved",
        ">",
        "requests per second offered (over the arrival window) and achieved (finished, "
        "first arrival to last finish, as vllm bench serve's request throughput)",
    ),
    (
        "goodput",
        ">",
        "requests per second that met every SLO bound (--slo-ttft, --slo-tpot, --slo-e2el), "
        "as vllm bench serve --goodput; - without an SLO",
    ),
    (
        "load",
        "<",
        "overloaded when the achieved rate falls over 10% short of the sent rate and the "
        "queueing delay grows by over 0.1 s per second of run (a least-squares trend); "
        "closed loop when sessions held the sent rate below the offered one",
    ),
    (
        "prefill GPU-s",
        ">",
        "GPU-seconds of prefill computed / saved by prefix hits, by the cost profile's "
        "prefill terms; both count every admission, so a preempted request's recompute "
        "and its re-hit on its own blocks are in them",
    ),
    ("evicted blk", ">", "blocks (pages) evicted from the index"),
    ("preempt", ">", "preemptions (vLLM) or retractions (SGLang): requests recomputed"),
)
"""Columns of the arrival-time table, as :data:`COLUMNS`."""


_T = TypeVar("_T")


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover - the loop always returns


def _us(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def table_rows(backends: Sequence[BackendRun]) -> list[list[str]]:
    """One row of :data:`COLUMNS` cells per backend result."""
    return [
        [
            b.backend,
            b.driver,
            str(b.block_size),
            f"{b.hit_ratio:.1%}",
            f"{b.hit_tokens:,}",
            f"{b.boundary_lost_tokens:,}",
            f"{b.cap_lost_tokens:,}",
            f"{b.evicted_blocks:,} / {b.evicted_tokens:,}",
            f"{_us(b.admit_us_p50)} / {_us(b.admit_us_p99)}",
            f"{_us(b.index_us_p50)} / {_us(b.index_us_p99)}",
            f"{b.peak_cached_blocks:,}",
            human_bytes(b.index_memory_bytes),
        ]
        for b in backends
    ]


def seconds(value: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``, ``4.5`` -> ``"4.50 s"``, ``1234.5`` -> ``"1,234 s"``."""
    if math.isnan(value):
        return "-"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s" if value < 1000 else f"{value:,.0f} s"


def _gpu_s(value: float) -> str:
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def time_rows(runs: Sequence[ArrivalRun]) -> list[list[str]]:
    """One row of :data:`TIME_COLUMNS` cells per arrival-time run."""
    rows = []
    for t in runs:
        r = t.result.run
        load = t.load_summary
        rows.append(
            [
                t.backend,
                f"{t.engine}, {t.config.queue_order}",
                f"{r.hit_ratio:.1%}",
                f"{seconds(r.ttft_p50_s)} / {seconds(r.ttft_p90_s)} / {seconds(r.ttft_p99_s)}",
                f"{seconds(r.queueing_mean_s)} / {seconds(r.queueing_p90_s)}",
                seconds(r.e2e_p50_s),
                f"{r.request_throughput:.3g}",
                f"{_rate(load.offered_rate)} / {_rate(load.achieved_rate)}",
                "-" if load.goodput is None else _rate(load.goodput),
                _load_word(load),
                f"{_gpu_s(r.prefill_gpu_s)} / {_gpu_s(r.saved_gpu_s)}",
                f"{r.evicted_blocks:,}",
                f"{r.num_preemptions:,}",
            ]
        )
    return rows


def _rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3g}"


def _load_word(load: LoadSummary) -> str:
    if load.overloaded:
        return "OVERLOADED"
    if load.held_back:
        return "closed loop"
    return "ok"


def load_lines(w: WorkloadResult) -> list[str]:
    """One line per arrival-time run at the table's capacity and rate that is
    overloaded or held back by closed-loop sessions (empty: all in a steady state)."""
    out = []
    for t in w.arrival_at_table():
        load = t.load_summary
        if load.overloaded or load.held_back:
            out.append(f"{w.name}, {t.backend} as {t.engine}: {load.verdict()}")
    return out


RATE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("rate", ">", "the request rate asked for (req/s)"),
    ("backend", "<", "the index, and the engine it runs as"),
    ("offered/achieved", ">", "requests per second offered and achieved"),
    ("goodput", ">", "requests per second that met the SLO (- without one)"),
    ("TTFT p50/p90", ">", "time to first token"),
    ("TPOT p50", ">", "time per output token after the first"),
    ("hit ratio", ">", "prompt tokens served from the cache"),
    ("load", "<", "ok, closed loop, or OVERLOADED (queues grow without bound)"),
)
"""Columns of the request-rate sweep table."""


def rate_runs(w: WorkloadResult) -> list[ArrivalRun]:
    """The runs of a rate sweep at the table's capacity, by rate then backend
    (empty without a sweep)."""
    if not any(t.role == "rate" for t in w.arrival_runs):
        return []
    runs = [t for t in w.arrival_runs if t.role in ("table", "rate")]
    return sorted(runs, key=lambda t: (t.settings.request_rate or 0.0, t.backend, t.engine))


def rate_rows(runs: Sequence[ArrivalRun]) -> list[list[str]]:
    """One row of :data:`RATE_COLUMNS` cells per run."""
    rows = []
    for t in runs:
        r, load = t.result.run, t.load_summary
        rows.append(
            [
                f"{t.settings.request_rate or 0.0:g}",
                f"{t.backend} as {t.engine}",
                f"{_rate(load.offered_rate)} / {_rate(load.achieved_rate)}",
                "-" if load.goodput is None else _rate(load.goodput),
                f"{seconds(r.ttft_p50_s)} / {seconds(r.ttft_p90_s)}",
                seconds(r.tpot_p50_s),
                f"{r.hit_ratio:.1%}",
                _load_word(load),
            ]
        )
    return rows


def saturation_lines(w: WorkloadResult) -> list[str]:
    """Per backend, where the rate sweep saturates it (empty without a sweep)."""
    runs = rate_runs(w)
    return [s.describe() for s in saturation(runs)] if runs else []


ANCHOR_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("backend", "<", "the index, as NAME or NAME:granularity"),
    ("infinite-cache hit", ">", "hit ratio with nothing ever evicted: the most any capacity gives"),
    (
        "working set (capacity needed)",
        ">",
        "the smallest capacity that reaches the infinite-cache hit ratio (within 5%, by "
        "bisection over replays): the largest live plus reusable footprint, above which the "
        "hit ratio stops improving",
    ),
    (
        "knee",
        ">",
        "the smallest capacity reaching 98% of the infinite-cache hit ratio (by bisection); "
        "without --capacity-search, the sweep's point farthest above the line from its "
        "tightest to its roomiest point (log capacity)",
    ),
    ("hit at knee", ">", "hit ratio at the knee"),
    (
        "all requests' KV",
        ">",
        "every request's prompt and output at once (nothing evicted): the sum, not what is needed",
    ),
)
"""Columns of the capacity anchors table, as :data:`COLUMNS`."""


def anchor_rows(w: WorkloadResult) -> list[list[str]]:
    """One row of :data:`ANCHOR_COLUMNS` cells per backend."""
    return [
        [
            a.backend,
            f"{a.infinite_hit_ratio:.1%}",
            a.working_set_text,
            a.knee_text,
            "-" if a.knee_hit_ratio is None else f"{a.knee_hit_ratio:.1%}",
            a.describe(a.infinite_capacity_tokens),
        ]
        for a in w.anchors
    ]


def capacity_lines(w: WorkloadResult) -> list[str]:
    """Per backend with a working set found: what the table's capacity gives against
    what the reuse needs (``"hash_chain: 467,291 tokens give 25.0% of prompt tokens from
    the cache; all the reuse (38.8%) needs 11,499,473 tokens = ...; 98% of it ..."``)."""
    out = []
    table = {b.backend: b for b in w.backends}
    for a in w.anchors:
        run = table.get(a.backend)
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


def text_table(
    rows: Sequence[Sequence[str]], columns: Sequence[tuple[str, str, str]] = COLUMNS
) -> str:
    """The rows under ``columns``' headers (default :data:`COLUMNS`) as aligned plain text."""
    headers = [c[0] for c in columns]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if col[1] == "<" else c.rjust(w)
            for c, w, col in zip(cells, widths, columns, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def _table_section(
    title: str,
    columns: Sequence[tuple[str, str, str]],
    rows: Sequence[Sequence[str]],
    notes: Sequence[str],
) -> list[str]:
    """A titled markdown table of ``columns`` (header, alignment, ...) and its notes."""
    table = markdown_table([c[0] for c in columns], rows, "".join(c[1] for c in columns))
    return [title, "", table, "", *notes, ""]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table; ``align`` holds one ``<`` or ``>`` per column (default: left)."""
    align = align or "<" * len(headers)
    rule = ["---:" if a == ">" else ":---" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return "\n".join(out)


def workload_title(w: WorkloadResult) -> str:
    """``"few_shot: 200 requests, 117,023 prompt tokens, capacity 128,615 tokens, K=1"``."""
    text = (
        f"{w.name}: {w.num_requests:,} requests, {w.prompt_tokens:,} prompt tokens, "
        f"capacity {w.capacity_tokens:,} tokens, concurrency {w.concurrency}"
    )
    return text + (" (interrupted: partial)" if w.partial else "")


def time_title(w: WorkloadResult) -> str | None:
    """``"arrival time: Poisson, 4 req/s (seed 0); profile ...; capacity ..."``."""
    runs = w.arrival_at_table()
    if not runs:
        return None
    t = runs[0]
    cfg = t.config
    return (
        f"arrival time: {t.settings.describe_arrivals()}; max_num_seqs {cfg.max_num_seqs}, "
        f"max_num_batched_tokens {cfg.max_num_batched_tokens:,}; "
        f"profile {t.settings.profile.name}; capacity {w.capacity_tokens:,} tokens"
    )


def sweep_table(w: WorkloadResult) -> str | None:
    """Hit ratio per backend at each sweep capacity, as Markdown (``None``: no sweep)."""
    if not w.sweep:
        return None
    labels = list(dict.fromkeys(p.backend for p in w.sweep))
    ratio = {(p.backend, p.capacity_tokens): p.hit_ratio for p in w.sweep}
    rows = []
    for cap in w.sweep_capacities:
        cells = []
        for label in labels:
            r = ratio.get((label, cap))
            cells.append("does not fit" if r is None else f"{r:.1%}")
        rows.append([f"{cap:,}", *cells])
    return markdown_table(["capacity (tokens)", *labels], rows, ">" * (1 + len(labels)))


def time_sweep_table(w: WorkloadResult) -> str | None:
    """Hit ratio and TTFT p90 per backend at each capacity of the arrival-time runs,
    as Markdown (``None`` unless there are several capacities)."""
    runs = [t for t in w.arrival_runs if t.role != "rate"]
    caps = sorted({t.capacity_tokens for t in runs})
    if len(caps) < 2:
        return None
    labels = list(dict.fromkeys(t.backend for t in runs))
    by = {(t.backend, t.capacity_tokens): t.result.run for t in runs}
    rows = []
    for cap in caps:
        cells = []
        for label in labels:
            r = by.get((label, cap))
            cells.append(
                "does not fit" if r is None else f"{r.hit_ratio:.1%} / {seconds(r.ttft_p90_s)}"
            )
        rows.append([f"{cap:,}", *cells])
    headers = ["capacity (tokens)", *(f"{x} hit / TTFT p90" for x in labels)]
    return markdown_table(headers, rows, ">" * (1 + len(labels)))


def machine_info() -> dict[str, Any]:
    """Platform, Python and CPU, for the report's reproducibility section."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu or "unknown",
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def package_versions() -> dict[str, str | None]:
    """Installed versions of prefixkv and what the report uses."""
    names = ("prefixkv", "matplotlib", "tqdm", "xxhash", "sortedcontainers", "pandas", "pyarrow")
    return {name: installed_version(name) for name in names}


def run_rows(workloads: Sequence[WorkloadResult]) -> list[dict[str, Scalar]]:
    """One flat record per run of every workload (see :meth:`WorkloadResult.run_rows`)."""
    return [row for w in workloads for row in w.run_rows()]


def request_rows(workloads: Sequence[WorkloadResult]) -> list[dict[str, Scalar]]:
    """One flat record per request x backend x configuration of every workload."""
    return [row for w in workloads for row in w.request_rows()]


def write_tables(
    workloads: Sequence[WorkloadResult], out: Path, written: dict[str, str] | None = None
) -> dict[str, str]:
    """Write ``requests.csv`` and ``runs.csv`` into ``out`` (and ``.parquet`` twins when
    pyarrow is installed), each atomically.

    Args:
        workloads: what the comparison measured.
        out: the folder.
        written: filled in as each file is complete (so an interrupted caller
            knows which are this run's).

    Returns:
        ``{"requests_csv": "requests.csv", ...}``: the names written, relative to ``out``.
    """
    tables = {"requests": request_rows(workloads), "runs": run_rows(workloads)}
    formats = ["csv"]
    if has_extra("parquet", ("pyarrow",)):
        formats.append("parquet")
    written = {} if written is None else written
    for fmt in formats:
        for name, rows in tables.items():
            write_rows(out / f"{name}.{fmt}", rows)
            written[f"{name}_{fmt}"] = f"{name}.{fmt}"
    return written


def _json_safe(value: Any) -> Any:
    # NaN (a one-token output's TPOT) is null in JSON, not the non-standard NaN.
    return None if isinstance(value, float) and math.isnan(value) else value


def results_document(
    workloads: Sequence[WorkloadResult], meta: Mapping[str, Any]
) -> dict[str, Any]:
    """results.json's content: ``meta`` (config, machine, versions, plots, ...), then
    ``workloads`` and ``runs`` as lists of flat records (no list or dict inside)."""
    return {
        "format": RESULTS_FORMAT,
        **meta,
        "workloads": [w.row() for w in workloads],
        "runs": [{k: _json_safe(v) for k, v in row.items()} for row in run_rows(workloads)],
        "anchors": [a.row() for w in workloads for a in w.anchors],
    }


def write_results(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON, atomically."""
    data = (json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()
    with atomic_writer(path) as f:
        f.write(data)


def _by_engine(backends: Sequence[_T], index_of: Callable[[_T], str]) -> dict[str | None, _T]:
    # The first backend modelled on each engine (its IndexDescription.models).
    out: dict[str | None, _T] = {}
    for b in backends:
        out.setdefault(describe_index(index_of(b)).models, b)
    return out


def _delta_line(w: WorkloadResult) -> str | None:
    by_engine = _by_engine(w.backends, lambda b: b.index)
    hc, rx = by_engine.get("vllm"), by_engine.get("sglang")
    if hc is None or rx is None:
        return None
    gain = rx.hit_tokens - hc.hit_tokens
    return (
        f"{rx.backend} served {gain:+,} prompt tokens from the cache relative to "
        f"{hc.backend} ({gain / max(1, w.prompt_tokens):+.1%} of all prompt tokens). "
        f"Matched but recomputed: {hc.backend} {hc.boundary_lost_tokens:,} at block "
        f"boundaries and {hc.cap_lost_tokens:,} in last blocks; {rx.backend} "
        f"{rx.boundary_lost_tokens:,} and {rx.cap_lost_tokens:,}."
    )


def time_headline(w: WorkloadResult) -> list[str]:
    """The arrival-time headline: one sentence per axis that moved.

    Under one scheduler the backends differ only by their index; with several,
    each backend's runs differ only by the scheduler; ``natural`` moves both and
    says so.
    """
    runs = w.arrival_at_table()
    if not runs:
        return []
    out = []
    by_sched: dict[str, list[ArrivalRun]] = {}
    for t in runs:
        by_sched.setdefault(t.scheduler, []).append(t)
    for sched, group in by_sched.items():
        if len(group) < 2:
            continue
        cells = ", ".join(
            f"{t.backend} {seconds(t.result.run.ttft_p50_s)} (hit {t.result.run.hit_ratio:.1%})"
            for t in group
        )
        if sched == "natural":
            engines = ", ".join(f"{t.backend} as {t.engine}" for t in group)
            out.append(
                f"Index and scheduler moved together (each backend on its natural engine: "
                f"{engines}), so a TTFT difference is not the index's alone. TTFT p50: {cells}."
            )
        else:
            cfg = group[0].config
            out.append(
                f"Index axis, scheduler held at {_ENGINE_LABEL[sched]} ({cfg.batching} "
                f"batching, {cfg.queue_order} queue): TTFT p50 {cells}."
            )
    scheds = [x for x in by_sched if x != "natural"]
    if len(scheds) > 1:
        for label in dict.fromkeys(t.backend for t in runs):
            cells = ", ".join(
                f"{_ENGINE_LABEL[t.scheduler]} {seconds(t.result.run.ttft_p50_s)}"
                for t in runs
                if t.backend == label and t.scheduler in scheds
            )
            out.append(f"Scheduler axis, index held at {label}: TTFT p50 {cells}.")
    return out


_ENGINE_LABEL = {"vllm": "vLLM-style", "sglang": "SGLang-style", "natural": "natural"}


def _strip_table(w: WorkloadResult) -> str:
    backends = w.backends
    headers = ["request", "prompt", *(f"{b.backend} hit / bnd / last" for b in backends)]
    rows = []
    for i in w.strip_requests:
        first = backends[0].per_request
        row = [first.ids[i], str(first.prompt_tokens[i])]
        for b in backends:
            p = b.per_request
            row.append(f"{p.hit_tokens[i]} / {p.boundary_lost_tokens[i]} / {p.cap_lost_tokens[i]}")
        rows.append(row)
    return markdown_table(headers, rows, "<>" + ">" * len(backends))


def _seed_paragraph(w: WorkloadResult) -> list[str]:
    lines = []
    for b in w.backends:
        p = b.per_request
        if not describe_index(b.index).caches or "B" not in p.ids:
            continue
        i = p.ids.index("B")
        line = (
            f"- {b.backend}: B hit {p.hit_tokens[i]} of {p.prompt_tokens[i]} tokens, "
            f"matched {p.matched_tokens[i]}, {p.boundary_lost_tokens[i]} lost to the "
            "block boundary"
        )
        if "A-again" in p.ids:
            j = p.ids.index("A-again")
            line += f"; A again hit {p.hit_tokens[j]}, recomputing {p.cap_lost_tokens[j]}"
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


def _time_section(w: WorkloadResult, plots: Mapping[str, str]) -> list[str]:
    runs = w.arrival_at_table()
    if not runs:
        return []
    out = [
        f"### {w.name} at arrival time",
        "",
        f"{time_title(w)}. Varied: {runs[0].settings.axis}. Engines: "
        + "; ".join(
            f"{t.backend} as {t.engine} ({t.config.batching} batching, {t.config.queue_order})"
            for t in runs
        )
        + ".",
        "",
        markdown_table(
            [c[0] for c in TIME_COLUMNS], time_rows(runs), "".join(c[1] for c in TIME_COLUMNS)
        ),
        "",
    ]
    for line in time_headline(w):
        out += [line, ""]
    for line in load_lines(w):
        out += [f"**Load.** {line}.", ""]
    swept_rates = rate_runs(w)
    if swept_rates:
        out += _table_section(
            "Request-rate sweep at the table's capacity:",
            RATE_COLUMNS,
            rate_rows(swept_rates),
            [f"- {line}" for line in saturation_lines(w)],
        )
    cdf = plots.get(f"ttft_cdf_{w.name}")
    if cdf:
        out += [f"![TTFT CDF for {w.name}]({cdf})", ""]
    swept = time_sweep_table(w)
    if swept:
        out += ["Hit ratio and TTFT p90 at each capacity:", "", swept, ""]
    curve = plots.get(f"time_capacity_{w.name}")
    if curve:
        out += [f"![hit ratio and TTFT p90 vs capacity for {w.name}]({curve})", ""]
    return out


def write_report(path: Path, workloads: Sequence[WorkloadResult], doc: Mapping[str, Any]) -> None:
    """Write report.md: configuration, machine, the tables, and the plots (relative links).

    Args:
        path: the file.
        workloads: what the comparison measured.
        doc: results.json's metadata (``config``, ``machine``, ``versions``,
            ``plots``, ``partial``, ``elapsed_seconds``).
    """
    cfg, plots = doc["config"], doc.get("plots", {})
    has_arrival = any(w.arrival_runs for w in workloads)
    out = [
        "# prefixkv: prefix-cache backends head to head",
        "",
    ]
    if doc.get("partial"):
        out += [
            "**Partial results: the run was interrupted.** Only the backends and workloads "
            "below finished; sweeps and plots may be missing.",
            "",
        ]
    if doc.get("warnings"):
        out += ["**Warnings:**", "", *(f"- {line}" for line in doc["warnings"]), ""]
    out += [
        "Every backend replays the same requests with its natural scheduler's call order, at "
        "the same KV capacity in tokens. Block-granular caching loses matched tokens that "
        "share a block with different ones; a token-granular radix tree does not.",
        "",
    ]
    if has_arrival:
        out += [
            "Each backend also runs at arrival time: requests queue, are batched and "
            "prefilled in chunks, and every step costs what the cost profile says, giving "
            "TTFT, queueing and the GPU time prefix hits save. One thing varies at a time: "
            "all backends under the same scheduler unless the scheduler is swept, and the "
            "headline of each table says which axis moved.",
            "",
        ]
    out += [
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
    out += [
        f"- tables: {', '.join(doc.get('tables', {}).values()) or 'none written'}",
        "",
        "## Machine",
        "",
        *(f"- {k}: {v}" for k, v in doc["machine"].items()),
        *(f"- {k}: {v}" for k, v in doc["versions"].items() if v is not None),
        "",
        "## Columns",
        "",
        *(f"- **{name}**: {meaning}" for name, _, meaning in COLUMNS),
        "",
    ]
    if has_arrival:
        out += [
            "Arrival-time columns:",
            "",
            *(f"- **{name}**: {meaning}" for name, _, meaning in TIME_COLUMNS),
            "",
        ]
    if plots.get("capacity"):
        out += [
            "## Hit ratio vs cache capacity",
            "",
            f"![hit ratio vs capacity]({plots['capacity']})",
            "",
        ]
    if plots.get("index_time"):
        out += [
            "## Index time vs prompt length",
            "",
            f"![index time vs prompt length]({plots['index_time']})",
            "",
        ]
    for w in workloads:
        out += [f"## {w.name}", "", f"{workload_title(w)}. Source: {w.source}.", ""]
        for note in w.notes:
            out += [f"> Note: {note}", ""]
        out += [
            markdown_table(
                [c[0] for c in COLUMNS], table_rows(w.backends), "".join(c[1] for c in COLUMNS)
            ),
            "",
        ]
        delta = _delta_line(w)
        if delta:
            out += [delta, ""]
        if w.name == "seed":
            out += _seed_paragraph(w)
        swept = sweep_table(w)
        if swept:
            out += ["Hit ratio at each capacity of the sweep:", "", swept, ""]
        if w.anchors:
            model = w.anchors[0].model
            gib = f" (GiB of KV for {model})" if model and w.anchors[0].kv_bytes_per_token else ""
            out += _table_section(
                f"Capacity anchors{gib}:",
                ANCHOR_COLUMNS,
                anchor_rows(w),
                [f"- **Capacity.** {line}." for line in capacity_lines(w)],
            )
        strip = plots.get(f"strips_{w.name}")
        if w.strip_requests:
            out += ["Selected requests (hit / boundary-lost / last-block-lost tokens):", ""]
            out += [_strip_table(w), ""]
        if strip:
            out += [f"![per-request strips for {w.name}]({strip})", ""]
        out += _time_section(w, plots)
    with atomic_writer(path) as f:
        f.write("\n".join(out).encode())
