"""A simulated replica's KV-event publisher: vLLM's ``ZmqEventPublisher`` minus the sockets."""

from __future__ import annotations

from collections import deque

import msgspec

from prefixkv.adapters.events.wire import EventBatch
from prefixkv.adapters.router.stream_tracker import SeqBatch

from .config import DEFAULT_BUFFER_STEPS

__all__ = ["EventPublisher"]


class EventPublisher:
    """Numbers, encodes and keeps the last ``buffer_steps`` of one replica's batches, so a
    run can drop, delay and reorder them and the router recovers as from a real engine."""

    __slots__ = ("_buffer", "_encoder", "next_seq")

    def __init__(self, buffer_steps: int = DEFAULT_BUFFER_STEPS) -> None:
        self._buffer: deque[SeqBatch] = deque(maxlen=buffer_steps)
        self._encoder = msgspec.msgpack.Encoder()
        self.next_seq = 0

    def encode(self, batch: EventBatch) -> bytes:
        """A batch's msgpack payload (vLLM's bytes), unnumbered (dumps)."""
        return self._encoder.encode(batch)

    def publish(self, batch: EventBatch) -> SeqBatch:
        """Number, encode and buffer a batch."""
        out = SeqBatch(self.next_seq, batch.ts, self._encoder.encode(batch))
        self.next_seq += 1
        self._buffer.append(out)
        return out

    def replay(self, start: int, until: float) -> list[SeqBatch]:
        """Buffered batches from ``seq >= start`` published at or before ``until``."""
        return [b for b in self._buffer if b.seq >= start and b.ts <= until]
