"""Every signal that stops a ``prefixkv`` command: stop once, then finish writing.

The first stopping signal (:data:`HANDLED`) raises ``KeyboardInterrupt`` where the command
is; later ones raise nothing, so partial results being written cannot be torn. Once a
command holds its results (:attr:`Interrupts.held`) even the first is only recorded; it
exits 128 + the signal. Standard library only: the handler goes in before any heavy import.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

_NAMES = [
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
]
HANDLED: tuple[signal.Signals, ...] = tuple(
    getattr(signal, n) for n in _NAMES if hasattr(signal, n)
)
"""The signals handled: each one that ends the process by default and a user can send."""


class Interrupts:
    """The command's handler of every signal in :data:`HANDLED`: the first raises
    ``KeyboardInterrupt`` (unless ``held``: the command is writing what it has), later ones
    only wake a held wait (:meth:`calling`); ``signum`` is the first. ``with
    interrupts.deferral:`` a first signal inside is raised as the block ends, so a step is
    never cut in two."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.held = False
        self._previous: dict[int, Any] = {}
        self._callbacks: list[Callable[[], None]] = []
        self._deferring = False
        self._owed = False
        self.deferral = _Deferral(self)

    def handle_signals(self) -> None:
        """Handle :data:`HANDLED` until :meth:`restore`; call it inside the ``try`` that
        catches ``KeyboardInterrupt``. Outside the main thread nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            return
        with self.deferral:
            for signum in HANDLED:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self, *, ignore: bool = False) -> None:
        """Put back the handlers :meth:`handle_signals` replaced; with ``ignore`` (the process
        is exiting) ignore the signals, as a Python handler reset to the default action
        during shutdown would let a signal kill it."""
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if ignore else previous)
        self._previous.clear()

    @contextlib.contextmanager
    def calling(self, callback: Callable[[], None]) -> Iterator[None]:
        """Call ``callback`` (from the handler: it only sets a flag) on every signal while
        the block runs, at once if one came already, so a held wait can be cut short."""
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
        """128 + the first signal's number (130, Ctrl-C's, when none was received)."""
        return 128 + (self.signum or signal.SIGINT)

    def name(self) -> str:
        """What stopped the command, for its one-line message."""
        if self.signum is None or self.signum == signal.SIGINT:
            return "interrupted"
        if self.signum == signal.SIGTERM:
            return "terminated (SIGTERM)"
        return f"stopped by {signal.Signals(self.signum).name}"

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        for callback in self._callbacks:
            callback()
        if self.signum is not None:
            return  # the command is already stopping: let it finish writing
        self.signum = signum
        if self._deferring:
            self._owed = True  # raised as the block ends, unless held by then
        elif not self.held:
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
