"""Error messages on one line: what the ``prefixkv`` command prints never spans lines."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(text: str, limit: int = 120) -> str:
    """``text`` on one line (runs of white space become one space), cut to ``limit``
    characters with ``...`` when longer."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
