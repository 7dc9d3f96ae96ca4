"""One table writer for every report: Markdown and aligned text over column specs, so the
terminal, report.md and the column definitions read one list; and the shared number formats.
"""

from __future__ import annotations

import math
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import atomic_writer
from prefixkv.indexes.buildinfo import installed_version

from ..sim.server_calibration import cpu_model

__all__ = [
    "Column",
    "definitions",
    "fixed",
    "human_bytes",
    "image",
    "machine_info",
    "markdown_table",
    "package_versions",
    "partial_notice",
    "rate",
    "seconds",
    "table",
    "text_table",
    "titled_table",
    "tokens",
    "write_text",
]

Column = tuple[str, str, str]
"""``(header, alignment, meaning)``; alignment ``<``, ``>`` or ``-`` (none)."""


def human_bytes(n: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def seconds(value: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``, ``4.5`` -> ``"4.5 s"``, ``1234.5`` -> ``"1,234 s"``."""
    if math.isnan(value):
        return "-"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s" if value < 1000 else f"{value:,.0f} s"


def fixed(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals; NaN is ``"-"``."""
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def rate(value: float | None) -> str:
    """Three significant digits; ``None`` or NaN is ``"-"``."""
    return "-" if value is None or math.isnan(value) else f"{value:.3g}"


def tokens(value: float) -> str:
    """``8000`` -> ``"8k"`` (decimal, as capacities are given)."""
    for unit, size in (("M", 10**6), ("k", 10**3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.0f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A Markdown table; ``align`` holds one ``<``, ``>`` or ``-`` per column (default left)."""
    align = align or "<" * len(headers)
    if set(align) == {"-"}:
        rule = "|---" * len(headers) + "|"
    else:
        rule = "| " + " | ".join(":---" if a == "<" else "---:" for a in align) + " |"
    out = ["| " + " | ".join(headers) + " |", rule]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in r) + " |" for r in rows]
    return "\n".join(out)


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """The rows under ``columns``' headers, as Markdown."""
    return markdown_table([c[0] for c in columns], rows, "".join(c[1] for c in columns))


def text_table(rows: Sequence[Sequence[str]], columns: Sequence[Column]) -> str:
    """The rows under ``columns``' headers as aligned plain text (the terminal's)."""
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


def titled_table(
    title: str, columns: Sequence[Column], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()
) -> list[str]:
    """A report section's lines: ``title``, the table, then one paragraph per note."""
    return [title, "", table(columns, rows), "", *(x for note in notes for x in (note, ""))]


def definitions(columns: Iterable[Column]) -> list[str]:
    """What each column means, as a two-column Markdown table."""
    rows = [(c[0], c[2]) for c in columns]
    return [*markdown_table(["column", "meaning"], rows, "--").splitlines(), ""]


def image(alt: str, name: str | None) -> list[str]:
    """A plot's relative link and a blank line (nothing when it was not drawn)."""
    return [f"![{alt}]({name})", ""] if name else []


def partial_notice(reason: str, what: str) -> list[str]:
    """The partial-results paragraph."""
    return [f"**Partial results**: {reason}; only the {what} below finished.", ""]


def machine_info() -> dict[str, Any]:
    """Platform, Python and CPU."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model() or "unknown",
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
    }


def package_versions() -> dict[str, str | None]:
    """Installed versions of prefixkv and of what the reports use."""
    names = ("prefixkv", "matplotlib", "tqdm", "xxhash", "sortedcontainers", "pandas", "pyarrow")
    return {name: installed_version(name) for name in names}


def write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8), whole or not at all."""
    with atomic_writer(path) as f:
        f.write(text.encode("utf-8"))
    return path
