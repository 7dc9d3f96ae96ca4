"""A router's view of one replica's sequenced KV-event stream, without sockets.

The same protocol as vLLM's ``ZmqEventPublisher`` and the subscriber in
:mod:`prefixkv.adapters.events.transport`, carried by function calls (in-process) or
Ray actor calls instead of ZeroMQ frames, so a virtual-time run can drop, delay and
reorder batches and still recover exactly as a real router does. The replica numbers
each batch from 0 per process (a restart starts again at 0) and keeps the last ones
for event replay (vLLM's ``replay_endpoint``); the lab's simulated replicas do it with
``EventPublisher``.

:class:`StreamTracker` delivers one replica's batches in sequence order, once: a
gap -> replay from the first missing ``seq``; the sequence going backwards while the
replica's buffer no longer holds the last batch delivered (whatever the late batch's
bytes: a new run may repeat the old one's first batches) -> a restart (drop what was
learned, take the new run from 0); a router joining mid-stream -> replay from 0; a
replay that no longer holds the missing batches (the replay window was exceeded), or
a batch that does not decode -> a resync from the replica's dump of its cache
(Dynamo's tree dump), never a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from prefixkv.adapters.events.codec import EventDecodeError
from prefixkv.adapters.events.sequence import SequencedStream
from prefixkv.adapters.events.wire import KVEventBatch

__all__ = ["Dump", "SeqBatch", "StreamTracker"]


class SeqBatch(NamedTuple):
    """A published batch: sequence number, timestamp, payload bytes."""

    seq: int
    ts: float
    payload: bytes


class Dump(NamedTuple):
    """A replica's cache as batches of ``BlockStored`` (parents first), and the ``seq``
    its live stream continues from."""

    next_seq: int
    payloads: list[bytes]


Replay = Callable[[int], "list[SeqBatch] | None"]
"""Asks the replica for its buffered batches from a ``seq`` (None: unreachable)."""


class StreamTracker(SequencedStream):
    """One replica's stream as a router receives it: in order, once, or resynced.

    Args:
        on_batch: ``(seq, batch)`` for each batch delivered, in order.
        replay: fetches buffered batches from a ``seq``.
        dump: fetches the replica's cache as a :class:`Dump` (None: unreachable).
        on_restart: the replica restarted: forget what was learned from it.
        on_resync: the stream is being rebuilt from a dump: forget, then apply.
        remember: delivered batches whose digests are kept (duplicate detection).
    """

    def __init__(
        self,
        on_batch: Callable[[int, KVEventBatch], None],
        replay: Replay,
        dump: Callable[[], Dump | None],
        on_restart: Callable[[], None],
        on_resync: Callable[[], None],
        *,
        remember: int = 100_000,
    ) -> None:
        super().__init__(remember)
        self._on_batch = on_batch
        self._replay = replay
        self._dump = dump
        self._on_restart = on_restart
        self._on_resync = on_resync

    # ------------------------------------------------------------ live

    def receive(self, seq: int, payload: bytes) -> None:
        """A live batch arrived (possibly late, twice, or after a restart)."""
        if self.next_seq is None:
            self.next_seq = 0
        elif seq < self.next_seq:
            # Late, twice, skipped over by a resync, or a new run (whose first batches
            # may repeat the old run's bytes): the replica's buffer tells, not the bytes.
            if self._is_stale():
                self.stats["duplicates"] += 1
                return
            self._restarted()
        if seq > self.next_seq:
            self.stats["gaps"] += 1
            self._catch_up()
        if seq == self.next_seq:
            self._deliver(seq, payload)
        else:
            self.stats["duplicates"] += 1

    def sync(self) -> None:
        """Ask for everything from :attr:`next_seq` (from 0 when nothing was seen): a
        joining router, or a check after the replica's connection came back."""
        if self.next_seq is None:
            self.next_seq = 0
        self._catch_up()

    def resync(self) -> None:
        """Rebuild from the replica's dump (router warm-up by dump)."""
        dump = self._dump()
        if dump is None:
            return
        self.stats["resyncs"] += 1
        self._on_resync()
        self._recent.clear()
        for payload in dump.payloads:
            self._apply(-1, payload)
        self.next_seq = dump.next_seq
        # Remember the last published batch as the anchor later checks compare with.
        got = self._replay(dump.next_seq - 1) if dump.next_seq else None
        if got and got[0].seq == dump.next_seq - 1:
            self._recent[got[0].seq] = hash(got[0].payload)

    # ------------------------------------------------------------ internals

    def _catch_up(self) -> None:
        start = self.next_seq or 0
        # Ask one batch early when its digest is known: a replica that no longer has
        # it, or has another one under its seq, has restarted.
        anchor = start - 1 if start > 0 and (start - 1) in self._recent else None
        self.stats["replays"] += 1
        batches = self._replay(start if anchor is None else anchor)
        if batches is None:
            self.resync()
            return
        if anchor is not None and (
            not batches
            or batches[0].seq != anchor
            or hash(batches[0].payload) != self._recent[anchor]
        ):
            if batches and batches[0].seq > anchor:
                # The buffer moved past the anchor: not a restart, the window was exceeded.
                self.resync()
                return
            self._restarted()
            self._catch_up()
            return
        for b in batches:
            if b.seq < start:
                continue
            if b.seq > start:  # no longer buffered: lost for good
                self.resync()
                return
            if not self._deliver(b.seq, b.payload):
                return  # resynced from a dump, which covers the rest
            start = b.seq + 1

    def _is_stale(self) -> bool:
        """Whether a batch behind the stream is a late copy from the run being followed
        (True) or the start of a new run (False): the replica's buffer is asked for
        the last batch delivered. When that batch is no longer buffered the question
        cannot be answered, and the stream is rebuilt from a dump (True)."""
        anchor = (self.next_seq or 0) - 1
        digest = self._recent.get(anchor)
        self.stats["replays"] += 1
        got = None if digest is None else self._replay(anchor)
        if digest is not None and got is not None and got and got[0].seq == anchor:
            return hash(got[0].payload) == digest
        if digest is not None and got is not None and not got:
            return False  # the replica's run is shorter than ours: it restarted
        self.resync()
        return True

    def _deliver(self, seq: int, payload: bytes) -> bool:
        """Deliver one batch; False when it did not decode and the stream was rebuilt
        from a dump instead (its events are lost otherwise)."""
        self._passed(seq, payload)
        if self._apply(seq, payload):
            self.stats["delivered"] += 1
            return True
        self.resync()
        return False

    def _apply(self, seq: int, payload: bytes) -> bool:
        try:
            batch = self._decoder.decode(payload)
        except EventDecodeError:
            self.stats["bad"] += 1
            return False
        self._on_batch(seq, batch)
        return True

    def _restarted(self) -> None:
        self._new_run()
        self._on_restart()
