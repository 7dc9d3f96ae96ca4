"""Every signal that stops a ``prefixkv`` command: stop once, then finish writing.

:meth:`Interrupts.handle_signals` runs first thing in :func:`~.main.main`, before any heavy
import, so even the first instant of a command ends in one line and exit 128 + the
signal number, never a ``KeyboardInterrupt`` traceback. The signals handled are the ones
a user (or a terminal, ssh, a job scheduler) sends to end a process: SIGINT (Ctrl-C),
SIGTERM, SIGHUP (a closed terminal, a dropped ssh), SIGQUIT (Ctrl-\\), SIGUSR1,
SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGXCPU (a CPU-time limit), SIGIO and SIGPWR,
wherever the platform has them (:data:`HANDLED`). SIGPIPE and SIGXFSZ stay as Python
sets them, ignored: a closed pipe or a file-size limit is then an ``OSError``, which
the command reports. SIGKILL and SIGSTOP cannot be caught.

The first of them raises ``KeyboardInterrupt`` where the command is (each is treated
as SIGINT); the command keeps what finished and writes it, removing its temporary
files. Every later signal is only counted, so pressing Ctrl-C again while partial
results are written cannot tear or delete them. Once a command has its results it
calls :meth:`Interrupts.hold`: from then on even a first signal is only recorded, and
the command exits 128 + the signal number (130 for SIGINT, 143 for SIGTERM, 129 for
SIGHUP) after writing. :attr:`Interrupts.deferral` keeps a signal from splitting a step
in two (a replay row counted but not written), and :meth:`Interrupts.calling` lets a
held wait (``--kv-events-grace``) be cut short.

This module imports nothing beyond the standard library.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

__all__ = ["EXIT_INTERRUPTED", "HANDLED", "Interrupts"]

EXIT_INTERRUPTED = 128 + signal.SIGINT
"""Exit status after Ctrl-C (SIGINT): 130, as a shell reports a process it interrupted."""

_NAMES = (
    "SIGINT",
    "SIGTERM",
    "SIGHUP",
    "SIGQUIT",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGXCPU",
    "SIGIO",
    "SIGPWR",
)
HANDLED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in _NAMES if hasattr(signal, name)
)
"""The signals :meth:`Interrupts.handle_signals` handles: each one whose default action ends
the process and that a user can send, on this platform."""


class Interrupts:
    """The command's handler of every signal in :data:`HANDLED`: the first raises
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
        self._callbacks: list[Callable[[], None]] = []
        self._deferring = False
        self._owed = False
        self.deferral = _Deferral(self)
        """``with interrupts.deferral:`` a first signal inside the block only is recorded,
        and raises ``KeyboardInterrupt`` as the block ends: for a step that must not be
        cut in two (a replay's row counted, then written)."""

    def handle_signals(self) -> None:
        """Handle the signals in :data:`HANDLED` in this process until :meth:`restore`.

        A signal that lands while the handlers go in is recorded and raised as
        ``KeyboardInterrupt`` once they all are: call this inside the ``try`` that
        handles it. Outside the main thread (where Python cannot set handlers) nothing
        is installed and the default behaviour stays.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        with self.deferral:
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        """Put back the handlers :meth:`handle_signals` replaced."""
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()

    def ignore(self) -> None:
        """Ignore the handled signals from now on (the process is about to exit).

        A Python handler would be reset to the default action while the interpreter
        shuts down, and a signal then would kill the process; an ignored one stays
        ignored.
        """
        if self._previous:
            for signum in self._previous:
                signal.signal(signum, signal.SIG_IGN)

    def hold(self) -> None:
        """From now on a signal is only recorded: the command is writing its results."""
        self.held = True

    @contextlib.contextmanager
    def calling(self, callback: Callable[[], None]) -> Iterator[None]:
        """Call ``callback`` on every signal while the block runs (at once if one came
        already), so that a wait the command holds through can be cut short.

        ``callback`` runs inside the signal handler: it must only set a flag or an event.
        """
        self._callbacks.append(callback)
        try:
            if self.received:
                callback()
            yield
        finally:
            self._callbacks.remove(callback)

    @property
    def received(self) -> bool:
        """Whether a signal arrived."""
        return self.signum is not None

    def status(self) -> int:
        """The exit status of an interrupted command: 128 + the first signal's number
        (130 for Ctrl-C, and when no signal was received)."""
        return EXIT_INTERRUPTED if self.signum is None else 128 + self.signum

    def name(self) -> str:
        """What stopped the command, for its one-line message."""
        if self.signum is None or self.signum == signal.SIGINT:
            return "interrupted"
        if self.signum == signal.SIGTERM:
            return "terminated (SIGTERM)"
        return f"stopped by {signal.Signals(self.signum).name}"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        for callback in self._callbacks:
            callback()
        if self.signum is not None:
            return  # the command is already stopping: let it finish writing
        self.signum = signum
        if self.held:
            return
        if self._deferring:
            self._owed = True
            return
        raise KeyboardInterrupt


class _Deferral:
    """:attr:`Interrupts.deferral`: one reusable context, cheap enough for every request."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Interrupts) -> None:
        self._owner = owner

    def __enter__(self) -> None:
        self._owner._deferring = True

    def __exit__(self, exc_type: object, *exc: object) -> None:
        owner = self._owner
        owner._deferring = False
        if owner._owed:
            owner._owed = False
            if exc_type is None and not owner.held:
                raise KeyboardInterrupt
