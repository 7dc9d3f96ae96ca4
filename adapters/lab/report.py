"""The comparison's tables and files: aligned text for the terminal, report.md, results.json.

Everything here reads the plain dicts :mod:`prefixkv.adapters.lab.compare` returns; one
column list serves the terminal table and the Markdown one, so the two never drift.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .traces import atomic_writer

__all__ = [
    "COLUMNS",
    "human_bytes",
    "machine_info",
    "markdown_table",
    "package_versions",
    "sweep_table",
    "table_rows",
    "text_table",
    "workload_title",
    "write_hits",
    "write_report",
    "write_results",
]

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


def table_rows(backends: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row of :data:`COLUMNS` cells per backend result."""
    return [
        [
            b["backend"],
            b["driver"],
            str(b["block_size"]),
            f"{b['hit_ratio']:.1%}",
            f"{b['hit_tokens']:,}",
            f"{b['boundary_lost_tokens']:,}",
            f"{b['cap_lost_tokens']:,}",
            f"{b['evicted_blocks']:,} / {b['evicted_tokens']:,}",
            f"{_us(b['admit_us_p50'])} / {_us(b['admit_us_p99'])}",
            f"{_us(b['index_us_p50'])} / {_us(b['index_us_p99'])}",
            f"{b['peak_cached_blocks']:,}",
            human_bytes(b["index_memory_bytes"]),
        ]
        for b in backends
    ]


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """The rows under :data:`COLUMNS` headers as aligned plain text."""
    headers = [c[0] for c in COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if col[1] == "<" else c.rjust(w)
            for c, w, col in zip(cells, widths, COLUMNS, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table; ``align`` holds one ``<`` or ``>`` per column (default: left)."""
    align = align or "<" * len(headers)
    rule = ["---:" if a == ">" else ":---" for a in align]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return "\n".join(out)


def workload_title(w: Mapping[str, Any]) -> str:
    """``"few_shot: 200 requests, 117,023 prompt tokens, capacity 128,615 tokens, K=1"``."""
    text = (
        f"{w['name']}: {w['num_requests']:,} requests, {w['prompt_tokens']:,} prompt tokens, "
        f"capacity {w['capacity_tokens']:,} tokens, concurrency {w['concurrency']}"
    )
    return text + (" (interrupted: partial)" if w.get("partial") else "")


def sweep_table(w: Mapping[str, Any]) -> str | None:
    """Hit ratio per backend at each sweep capacity, as Markdown (``None``: no sweep)."""
    sweep = w.get("sweep")
    if not sweep:
        return None
    labels = list(sweep["hit_ratio"])
    rows = []
    for k, cap in enumerate(sweep["capacity_tokens"]):
        cells = []
        for label in labels:
            ratio = sweep["hit_ratio"][label][k]
            cells.append("does not fit" if ratio is None else f"{ratio:.1%}")
        rows.append([f"{cap:,}", *cells])
    return markdown_table(["capacity (tokens)", *labels], rows, ">" * (1 + len(labels)))


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
    out: dict[str, str | None] = {}
    for name in ("prefixkv", "matplotlib", "tqdm", "xxhash", "sortedcontainers"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def write_hits(path: Path, hits: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> None:
    """Write a replay's hit file, the reference oracles' format, atomically.

    One ``{"id", "prompt_len", "hit_tokens"}`` line per request in admission order,
    then one ``{"summary": {...}}`` line; missing folders are created.
    """
    with atomic_writer(path) as f:
        for hit in hits:
            f.write((json.dumps(hit, separators=(",", ":")) + "\n").encode())
        f.write((json.dumps({"summary": summary}, separators=(",", ":")) + "\n").encode())


def write_results(path: Path, doc: Mapping[str, Any]) -> None:
    """Write every number of the comparison as JSON, atomically."""
    data = (json.dumps(doc, indent=1, ensure_ascii=False) + "\n").encode()
    with atomic_writer(path) as f:
        f.write(data)


def _delta_line(w: Mapping[str, Any]) -> str | None:
    by_index = {b["index"]: b for b in w["backends"]}
    hc, rx = by_index.get("hash_chain"), by_index.get("radix")
    if hc is None or rx is None:
        return None
    gain = rx["hit_tokens"] - hc["hit_tokens"]
    return (
        f"{rx['backend']} served {gain:+,} prompt tokens from the cache relative to "
        f"{hc['backend']} ({gain / max(1, w['prompt_tokens']):+.1%} of all prompt tokens). "
        f"Matched but recomputed: {hc['backend']} {hc['boundary_lost_tokens']:,} at block "
        f"boundaries and {hc['cap_lost_tokens']:,} in last blocks; {rx['backend']} "
        f"{rx['boundary_lost_tokens']:,} and {rx['cap_lost_tokens']:,}."
    )


def _strip_table(w: Mapping[str, Any]) -> str:
    backends = w["backends"]
    headers = ["request", "prompt", *(f"{b['backend']} hit / bnd / last" for b in backends)]
    rows = []
    for i in w["strip_requests"]:
        first = backends[0]["per_request"]
        row = [first["id"][i], str(first["prompt_len"][i])]
        for b in backends:
            p = b["per_request"]
            row.append(
                f"{p['hit_tokens'][i]} / {p['boundary_lost_tokens'][i]} / {p['cap_lost_tokens'][i]}"
            )
        rows.append(row)
    return markdown_table(headers, rows, "<>" + ">" * len(backends))


def _seed_paragraph(w: Mapping[str, Any]) -> list[str]:
    lines = []
    for b in w["backends"]:
        p = b["per_request"]
        if b["index"] == "none" or "B" not in p["id"]:
            continue
        i = p["id"].index("B")
        line = (
            f"- {b['backend']}: B hit {p['hit_tokens'][i]} of {p['prompt_len'][i]} tokens, "
            f"matched {p['matched_tokens'][i]}, {p['boundary_lost_tokens'][i]} lost to the "
            "block boundary"
        )
        if "A-again" in p["id"]:
            j = p["id"].index("A-again")
            line += f"; A again hit {p['hit_tokens'][j]}, recomputing {p['cap_lost_tokens'][j]}"
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


def write_report(path: Path, doc: Mapping[str, Any]) -> None:
    """Write report.md: configuration, machine, the tables, and the plots (relative links)."""
    cfg, plots = doc["config"], doc.get("plots", {})
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
    out += [
        "Every backend replays the same requests with its natural scheduler's call order, at "
        "the same KV capacity in tokens. Block-granular caching loses matched tokens that "
        "share a block with different ones; a token-granular radix tree does not.",
        "",
        "## Configuration",
        "",
        f"- command: `{cfg['command']}`",
        f"- backends: {', '.join(cfg['backends_described'])}",
        f"- concurrency (most live requests): {cfg['concurrency']}",
        f"- capacity: {cfg['capacity_rule']}",
        f"- capacity sweep: {'yes' if cfg['capacity_sweep'] else 'no'}",
        f"- seed: {cfg['seed']}",
        f"- run time: {doc['elapsed_seconds']:.1f} s",
        f"- timings: {cfg['timing']}",
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
    for w in doc["workloads"]:
        out += [f"## {w['name']}", "", f"{workload_title(w)}. Source: {w['source']}.", ""]
        for note in w.get("notes", ()):
            out += [f"> Note: {note}", ""]
        out += [
            markdown_table(
                [c[0] for c in COLUMNS], table_rows(w["backends"]), "".join(c[1] for c in COLUMNS)
            ),
            "",
        ]
        delta = _delta_line(w)
        if delta:
            out += [delta, ""]
        if w["name"] == "seed":
            out += _seed_paragraph(w)
        swept = sweep_table(w)
        if swept:
            out += ["Hit ratio at each capacity of the sweep:", "", swept, ""]
        strip = plots.get("strips", {}).get(w["name"])
        if w["strip_requests"]:
            out += ["Selected requests (hit / boundary-lost / last-block-lost tokens):", ""]
            out += [_strip_table(w), ""]
        if strip:
            out += [f"![per-request strips for {w['name']}]({strip})", ""]
    with atomic_writer(path) as f:
        f.write("\n".join(out).encode())
