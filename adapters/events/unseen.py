"""Which sequence numbers a follower passed without seeing them on the live stream.

A follower of one publisher run moves :attr:`~.sequence.SequencedStream.next_seq`
past batches it did not receive live: a replay answer delivered them first, or a
resync skipped them. Their live copies may still come (a slow socket, a relay that
delays or reorders); every other batch behind ``next_seq`` was seen live already,
and since no carrier repeats a frame, a second one under its ``seq`` is a new
publisher run. So the question "late copy, or new run?" is answered by content: a
late copy is a ``seq`` passed unseen, and when a replay delivered it, with the very
bytes the live stream now carries.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["REPLAYED", "SKIPPED", "UnseenSeqs"]

REPLAYED = "replayed"
"""Delivered from a replay answer: its live copy must carry the same bytes."""

SKIPPED = "skipped"
"""Passed by a resync: its events were given up, its live copy is dropped."""

MAX_SKIPPED_RANGES = 64
"""Skipped ranges kept (the oldest go first: a late copy from one then reads as a new
run, and the follower forgets the publisher, which is safe)."""


class UnseenSeqs:
    """The ``seq`` values passed without their live frame, each taken at most once.

    Args:
        remember: most replayed seqs kept (the follower's digest window).
    """

    __slots__ = ("_remember", "_replayed", "_skipped")

    def __init__(self, remember: int) -> None:
        self._remember = remember
        self._replayed: OrderedDict[int, None] = OrderedDict()
        self._skipped: list[tuple[int, int]] = []  # [start, end) ranges, oldest first

    def replayed(self, seq: int) -> None:
        """``seq`` was delivered from a replay answer. O(1)."""
        self._replayed[seq] = None
        if len(self._replayed) > self._remember:
            self._replayed.popitem(last=False)

    def skipped(self, start: int, end: int) -> None:
        """Seqs ``start .. end-1`` were passed by a resync. O(1)."""
        if start < end:
            self._skipped.append((start, end))
            if len(self._skipped) > MAX_SKIPPED_RANGES:
                del self._skipped[0]

    def take(self, seq: int) -> str | None:
        """How ``seq`` was passed (:data:`REPLAYED`, :data:`SKIPPED`), forgetting it; None
        when it was not passed unseen (its live frame came already, or it was forgotten).
        O(1) for a replayed seq, O(skipped ranges) otherwise."""
        if self._replayed.pop(seq, 0) is None:
            return REPLAYED
        for i, (start, end) in enumerate(self._skipped):
            if start <= seq < end:
                # split the range around seq
                self._skipped[i : i + 1] = [
                    r for r in ((start, seq), (seq + 1, end)) if r[0] < r[1]
                ]
                return SKIPPED
        return None

    def drop_from(self, seq: int) -> None:
        """Forget every seq from ``seq`` on (the follower went back to ``seq``)."""
        for s in [s for s in self._replayed if s >= seq]:
            del self._replayed[s]
        self._skipped = [(a, min(b, seq)) for a, b in self._skipped if a < seq]

    def clear(self) -> None:
        """Forget everything (a new publisher run)."""
        self._replayed.clear()
        self._skipped.clear()
