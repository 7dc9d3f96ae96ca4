"""Progress bars: tqdm on stderr when installed and wanted (shown after a second), else none."""

from __future__ import annotations

import sys
from typing import Protocol

from .extras import has_extra


class Progress(Protocol):
    """What the CLI needs of a bar: tqdm's ``update(n)`` and ``close()``."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


class _NoProgress:
    def update(self, n: int = 1) -> object:
        return None

    def close(self) -> None:
        return None


def progress(total: int | None, desc: str, *, quiet: bool = False, unit: str = "req") -> Progress:
    """A bar of ``total`` steps (``None``: no ETA); silent when ``quiet`` or without tqdm."""
    if quiet or not has_extra("report", ("tqdm",)):
        return _NoProgress()
    from tqdm import tqdm

    # smoothing 0: the whole run's rate, so the ETA does not jump per request
    bar: Progress = tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit not in ("req", "plot"),
        file=sys.stderr,
        delay=1.0,
        leave=False,
        smoothing=0.0,
        dynamic_ncols=True,
    )
    return bar
