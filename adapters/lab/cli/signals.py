"""Ctrl-C and SIGTERM for the ``prefixkv`` commands: stop once, then finish writing.

:meth:`Interrupts.install` runs first thing in :func:`~.main.main`, before any heavy
import, so even the first instant of a command ends in one line and exit 130, never a
``KeyboardInterrupt`` traceback. The first SIGINT or SIGTERM raises
``KeyboardInterrupt`` where the command is (SIGTERM is treated as SIGINT); the
command keeps what finished and writes it. Every later signal is only counted, so
pressing Ctrl-C again while partial results are written cannot tear or delete them.
Once a command has its results it calls :meth:`Interrupts.hold`: from then on even a
first signal is only recorded, and the command exits 130 (143 for SIGTERM) after
writing. SIGQUIT (Ctrl-\\) still stops the process at once.

This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "Interrupts"]

EXIT_INTERRUPTED = 128 + signal.SIGINT
"""Exit status after Ctrl-C (SIGINT): 130, as a shell reports a process it interrupted."""
EXIT_TERMINATED = 128 + signal.SIGTERM
"""Exit status after SIGTERM: 143."""

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """The command's SIGINT/SIGTERM handler: the first signal raises
    ``KeyboardInterrupt`` (unless held), later ones are only counted.

    Attributes:
        signum: the first signal received (``None``: none yet).
        count: how many were received.
        held: signals no longer raise (the command is writing what it has).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self.held = False
        self._previous: dict[int, Any] = {}

    @classmethod
    def install(cls) -> Interrupts:
        """Handle SIGINT and SIGTERM in this process until :meth:`restore`.

        Outside the main thread (where Python cannot set handlers) nothing is
        installed and the default behaviour stays.
        """
        self = cls()
        if threading.current_thread() is threading.main_thread():
            for signum in _SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def ignore(self) -> None:
        """Ignore SIGINT and SIGTERM from now on (the process is about to exit).

        A Python handler would be reset to the default action while the interpreter
        shuts down, and a signal then would kill the process; an ignored one stays
        ignored.
        """
        if self._previous:
            for signum in _SIGNALS:
                signal.signal(signum, signal.SIG_IGN)

    def hold(self) -> None:
        """From now on a signal is only recorded: the command is writing its results."""
        self.held = True

    @property
    def received(self) -> bool:
        """Whether a signal arrived."""
        return self.signum is not None

    def status(self) -> int:
        """The exit status of an interrupted command: 143 after SIGTERM, else 130."""
        return EXIT_TERMINATED if self.signum == signal.SIGTERM else EXIT_INTERRUPTED

    def name(self) -> str:
        """What stopped the command, for its one-line message."""
        return "terminated (SIGTERM)" if self.signum == signal.SIGTERM else "interrupted"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.signum is not None:
            return  # the command is already stopping: let it finish writing
        self.signum = signum
        if not self.held:
            raise KeyboardInterrupt
