"""A fault-injecting relay between one engine's KV-event stream and a router.

The engine's PUB socket connects to the relay's SUB (bound where the engine
publishes); the relay sends each frame on, untouched, from its own PUB (bound where
the router's subscriber connects), in a thread. While a fault is set it drops the
frames (a lost window: what a high-water mark or a network partition does) or holds
each one ``delay_s`` seconds (a slow link), keeping their order. The engine's replay
socket is not relayed: a router that notices a gap asks the engine itself, as it
would after a real loss.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import zmq

__all__ = ["FaultRelay"]


class FaultRelay:
    """Relays ``[topic, seq, payload]`` frames from ``in_endpoint`` to ``out_endpoint``.

    Args:
        in_endpoint: bound; the engine's PUB connects to it.
        out_endpoint: bound; the router's SUB connects to it.

    Attributes:
        stats: frames ``forwarded``, ``dropped``, ``delayed``.
    """

    def __init__(self, in_endpoint: str, out_endpoint: str) -> None:
        self._ctx: zmq.Context[Any] = zmq.Context()
        self._in = self._ctx.socket(zmq.SUB)
        self._in.setsockopt(zmq.SUBSCRIBE, b"")
        self._in.bind(in_endpoint)
        self._out = self._ctx.socket(zmq.PUB)
        self._out.bind(out_endpoint)
        self._lock = threading.Lock()
        self._mode = "pass"
        self._delay_s = 0.0
        self._held: deque[tuple[float, list[bytes]]] = deque()
        self.stats = dict.fromkeys(("forwarded", "dropped", "delayed"), 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fault-relay")
        self._thread.start()

    def set_fault(self, mode: str, delay_s: float = 0.0) -> None:
        """``"pass"``, ``"drop"`` (every frame until the next call) or ``"delay"``
        (each frame held ``delay_s`` seconds; held frames keep their times after the
        fault ends, and later frames wait behind them)."""
        if mode not in ("pass", "drop", "delay"):
            raise ValueError(f"unknown relay fault {mode!r}")
        with self._lock:
            self._mode, self._delay_s = mode, delay_s

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._in.poll(5):
                while True:
                    try:
                        frames = self._in.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._take(frames)
            self._release(time.monotonic())

    def _take(self, frames: list[bytes]) -> None:
        with self._lock:
            mode, delay = self._mode, self._delay_s
        now = time.monotonic()
        if mode == "drop":
            self.stats["dropped"] += 1
        elif mode == "delay" or self._held:
            # behind the frames still held, so the stream stays in order
            at = now + delay if mode == "delay" else now
            if self._held:
                at = max(at, self._held[-1][0])
            self._held.append((at, frames))
            self.stats["delayed"] += mode == "delay"
        else:
            self._send(frames)

    def _release(self, now: float) -> None:
        while self._held and self._held[0][0] <= now:
            self._send(self._held.popleft()[1])

    def _send(self, frames: list[bytes]) -> None:
        self._out.send_multipart(frames)
        self.stats["forwarded"] += 1

    def close(self) -> None:
        """Stop relaying (frames still held are dropped) and close the sockets."""
        self._stop.set()
        self._thread.join(5)
        self._in.close(0)
        self._out.close(0)
        self._ctx.term()
