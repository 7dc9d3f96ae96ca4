"""What every follower of one publisher's numbered batches keeps: the ``seq`` it expects
next, the digests of the batches it delivered last, and its counters.

vLLM's ``ZmqEventPublisher`` numbers batches from 0 per process, so a batch behind the
expected ``seq`` is either a late copy (its digest is remembered) or the start of a new
publisher run. The ZeroMQ subscriber (:mod:`.transport`) and the socketless tracker of
the cluster lab follow the same protocol over different carriers; this is their part
in common.
"""

from __future__ import annotations

from .codec import EventDecoder

__all__ = ["STREAM_COUNTERS", "SequencedStream"]

STREAM_COUNTERS = ("delivered", "duplicates", "gaps", "replays", "restarts", "resyncs", "bad")
"""The counters of :attr:`SequencedStream.stats`."""


class SequencedStream:
    """The state of following one publisher's batches in ``seq`` order, once.

    Args:
        remember: how many delivered batches' digests to keep (duplicate and restart
            detection).
    """

    def __init__(self, remember: int) -> None:
        self._remember = remember
        self._decoder = EventDecoder()
        self._recent: dict[int, int] = {}  # seq -> hash(payload) of delivered batches
        self.next_seq: int | None = None
        """The sequence number expected next (None before the first batch)."""
        self.stats: dict[str, int] = dict.fromkeys(STREAM_COUNTERS, 0)
        """Counters: delivered, duplicates, gaps, replays, restarts, resyncs, bad payloads."""

    def _passed(self, seq: int, payload: bytes) -> None:
        """``seq`` is done: expect the next one, and remember its digest. O(1)."""
        self.next_seq = seq + 1
        recent = self._recent
        recent[seq] = hash(payload)
        if len(recent) > self._remember:
            del recent[next(iter(recent))]

    def _new_run(self) -> None:
        """The publisher restarted: its new run is followed from ``seq`` 0. O(remembered)."""
        self.stats["restarts"] += 1
        self._recent.clear()
        self.next_seq = 0
