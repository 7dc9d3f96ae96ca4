"""Error messages on one line: what the ``prefixkv`` command prints never spans lines."""

from __future__ import annotations


def one_line(text: str, limit: int = 120) -> str:
    """``text`` with white space runs as one space, cut to ``limit`` characters with ``...``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
