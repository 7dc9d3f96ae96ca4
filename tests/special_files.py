"""Special files for the input tests: a FIFO that cannot hang a test."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def fifo_valve(path: Path, every_s: float = 5.0) -> Iterator[None]:
    """Should a reader block opening the FIFO ``path`` (no writer), a writer comes
    every ``every_s`` seconds and closes at once, so a reader that should have refused
    the FIFO fails on its EOF instead of hanging the test. No assertion reads a clock."""
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(every_s):
            with contextlib.suppress(OSError):  # OSError: no reader waiting
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)
