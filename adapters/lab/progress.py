"""Progress bars for the command line: tqdm on stderr when installed and wanted, else nothing.

One bar per phase (loading a trace, each replay, the plots), each counting what the
phase's cost grows with — input bytes while loading, prompt tokens while replaying —
so its ETA stays stable when request sizes vary a thousandfold. A bar appears only
after a second, so quick runs print nothing extra; tqdm is an optional dependency
(the ``report`` extra) and is imported only when a bar is made.
"""

from __future__ import annotations

import sys
from typing import Protocol

from .extras import has_extra

__all__ = ["Progress", "progress"]


class Progress(Protocol):
    """What the CLI needs of a bar (tqdm's own methods)."""

    def update(self, n: int = 1) -> object:
        """Advance by ``n`` steps."""
        ...

    def close(self) -> None:
        """Remove the bar."""
        ...


class _NoProgress:
    def update(self, n: int = 1) -> object:
        return None

    def close(self) -> None:
        return None


def progress(total: int | None, desc: str, *, quiet: bool = False, unit: str = "req") -> Progress:
    """A bar of ``total`` steps (``None``: unknown, no ETA); silent when ``quiet`` or
    without tqdm. Units other than requests and plots are shown scaled (``1.2M tok``)."""
    if quiet or not has_extra("report", ("tqdm",)):
        return _NoProgress()
    from tqdm import tqdm

    bar: Progress = tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit not in ("req", "plot"),
        file=sys.stderr,
        delay=1.0,
        leave=False,
        smoothing=0.0,  # the whole run's average rate: the ETA does not jump per request
        dynamic_ncols=True,
    )
    return bar
