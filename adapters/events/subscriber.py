"""A ZeroMQ subscriber of one KV-event publisher: in order, exactly once, or resynced.

It reads what vLLM 0.33's ``ZmqEventPublisher`` sends (``[topic, seq, payload]``)
and asks its replay socket for what it missed, handling each case the llm-d and
Dynamo subscribers handle, explicitly:

* a gap (a batch lost: slow joiner, high-water mark, network) -> replay from the
  first missing ``seq``, checked against the live stream: the answer must hold the
  live batch that revealed the gap, byte for byte, and only the batches before it
  are taken from the answer (the live stream brings the rest);
* the live sequence going backwards (one run's live frames only go forward), or a
  replay that no longer holds the last batch delivered or holds another one under
  its ``seq`` -> an engine restart: ``on_restart`` (drop that replica's state), then
  replay the new run from 0. A restarted engine whose first batches are byte for
  byte the old run's is still a new run;
* a live batch behind :attr:`next_seq` (a replay answer delivered it first) is a
  duplicate only if its bytes are the ones delivered under its ``seq``; otherwise
  the replay answer was not the live stream's, and the consumer forgets
  (``on_resync``) and follows the live stream from there;
* the replay window exceeded, no replay socket, no answer, an answer that does not
  hold the live batch, or an end marker whose next ``seq`` (prefixkv's publisher
  carries it) is past what was received (a batch dropped at the tail of a burst) ->
  ``on_resync(first seq available)``: the consumer's state misses events and needs a
  full resync. At worst the consumer forgets the replica; it never keeps a block the
  engine no longer holds;
* a payload that does not decode (whatever its bytes: see
  :class:`~.codec.EventDecoder`) -> counted in ``stats["bad"]``, then
  ``on_resync``: that batch's events are lost;
* a frame that is no batch (another number of parts, a sequence frame that is not an
  8-byte count below 2**63) -> counted in ``stats["bad"]`` and skipped: a batch lost
  with it shows as a gap;
* a payload over ``max_payload_bytes`` -> refused before it is decoded: counted in
  ``stats["bad"]``, then ``on_resync``. (It is received whole first: ZeroMQ's own
  limit, ``ZMQ_MAXMSGSIZE``, drops the connection mid-message, and libzmq 4.3 then
  aborts the process in ``fq.cpp`` when the reader holds part of a multipart message);
* a peer that breaks the ZMTP protocol -> libzmq drops the connection and, unlike
  after a network error, never reconnects: the subscriber connects again itself.

Every wait is bounded: a replay answer by ``replay_timeout``, a poll by its timeout.
Both endpoints are checked and connected in the constructor: one ZeroMQ cannot use is
a :class:`~.sockets.TransportError` there, with nothing left open.

A restart is noticed without waiting for traffic: every :meth:`~ZmqEventSubscriber.poll`
checks for reconnections, and when the stream has been quiet for ``probe_interval``
seconds it asks the replay socket, in the background, for the batch it delivered
last (a new run no longer has it) and anything after it. So a restarted publisher's
first burst, lost before the subscriber reconnected and followed by silence, is
still found, and the consumer drops the dead run's blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import zmq
from zmq.utils.monitor import parse_monitor_message

from .codec import DEFAULT_MAX_PAYLOAD_BYTES, EventDecodeError, EventDecoder
from .sequence import SequencedStream
from .sockets import (
    END_SEQ,
    TransportError,
    bound_connection,
    check_addresses,
    check_count,
    check_seconds,
    read_seq,
)
from .unseen import SKIPPED, UnseenSeqs
from .wire import KVEventBatch

__all__ = ["BatchCallback", "ZmqEventSubscriber"]

BatchCallback = Callable[[int, KVEventBatch], None]


class _Answer:
    """A replay answer as it arrives: the batches from the ``seq`` asked for, then the
    end marker, with the publisher's next ``seq`` when it says it (prefixkv's does, in
    the marker's topic frame; vLLM's leaves that frame empty)."""

    __slots__ = ("asked", "frames", "next_seq")

    def __init__(self, asked: int) -> None:
        self.asked = asked
        self.frames: list[tuple[int, bytes]] = []
        self.next_seq: int | None = None


class _Probe(NamedTuple):
    """A replay request in flight, answered while :meth:`ZmqEventSubscriber.poll` runs."""

    start: int  # the first seq wanted
    anchor: int | None  # the last seq delivered, asked again to check it
    expect: int | None  # next_seq when it was sent (a stale answer is dropped)
    deadline: float
    answer: _Answer


class ZmqEventSubscriber(SequencedStream):
    """Receives one publisher's batches in order, with gap replay and restart detection.

    Callbacks run inside :meth:`poll` / :meth:`sync`, in stream order.

    Args:
        endpoint: the publisher's PUB address (connected; ``bind=True`` to bind it,
            for publishers that connect to a central subscriber).
        on_batch: ``(seq, batch)`` for every batch, in order, once.
        replay_endpoint: the publisher's ROUTER address, or None (gaps then resync).
        on_restart: the publisher restarted (its engine's cache is empty): drop what
            was learned from it; batches from the new run follow.
        on_resync: ``(first_seq_available or None)``: events were lost for good.
        topic: topic prefix to subscribe to ("" = all).
        replay_timeout: seconds to wait for a replay answer.
        probe_interval: seconds of quiet after which ``poll`` asks the replay socket
            whether the publisher moved on or restarted (None: never).
        remember: how many delivered batches' digests to keep for restart detection.
        hwm: the SUB socket's receive high-water mark.
        max_payload_bytes: the largest payload decoded (larger: counted as bad, resync).
        heartbeat: seconds between ZMTP heartbeats; a publisher silent for three is
            disconnected, and reconnected when it comes back.
        bind: bind ``endpoint`` instead of connecting.
        context: the ZeroMQ context (default: the process-wide instance).

    Raises:
        TransportError: bad options, or an endpoint that cannot be opened.
    """

    def __init__(
        self,
        endpoint: str,
        on_batch: BatchCallback,
        *,
        replay_endpoint: str | None = None,
        on_restart: Callable[[], None] | None = None,
        on_resync: Callable[[int | None], None] | None = None,
        topic: str = "",
        replay_timeout: float = 1.0,
        probe_interval: float | None = 1.0,
        remember: int = 100_000,
        hwm: int = 100_000,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        heartbeat: float = 5.0,
        bind: bool = False,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        check_count("remember", remember, 1)
        super().__init__(remember)
        check_count("hwm", hwm)
        self._decoder = EventDecoder(
            max_payload_bytes=check_count("max_payload_bytes", max_payload_bytes, 1)
        )
        self._replay_timeout = check_seconds("replay_timeout", replay_timeout, positive=True)
        self._probe_interval = (
            None
            if probe_interval is None
            else check_seconds("probe_interval", probe_interval, positive=True)
        )
        self._heartbeat = check_seconds("heartbeat", heartbeat, positive=True)
        topic_frame = check_addresses(endpoint, replay_endpoint, topic)
        self._ctx = context or zmq.Context.instance()
        self._on_batch = on_batch
        self._on_restart = on_restart
        self._on_resync = on_resync
        self._replay_endpoint = replay_endpoint
        self._dealer: zmq.Socket[Any] | None = None
        self._dealer_error = ""  # why ZeroMQ refused the replay address
        self._probe: _Probe | None = None
        self._heard = time.monotonic()  # the last live frame or replay answer
        self._sub, self._monitor = self._live_socket(hwm, topic_frame)
        self._endpoint = None if bind else endpoint  # what to connect again after a drop
        self._verify = False
        self._unseen = UnseenSeqs(remember)  # passed without their live frame
        self.num_live_frames = 0
        """Messages read from the live socket (batches or not): what a caller waits on."""
        self._open(endpoint, bind)

    def _live_socket(self, hwm: int, topic_frame: bytes) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
        # The SUB socket, subscribed to the topic, and its monitor. A new connection may
        # be a restarted publisher whose run already passed our position: its next frame
        # would look like a continuation. Watch handshakes and check continuity by
        # replay before trusting the stream again.
        sub = self._ctx.socket(zmq.SUB)
        sub.set_hwm(hwm)
        bound_connection(sub, self._heartbeat)
        sub.setsockopt(zmq.SUBSCRIBE, topic_frame)
        return sub, sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)

    def _open(self, endpoint: str, bind: bool) -> None:
        # Bind or connect the live socket, and connect the replay socket; a refused
        # address closes everything this subscriber opened.
        try:
            (self._sub.bind if bind else self._sub.connect)(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise TransportError(f"cannot open endpoint {endpoint!r}: {e}") from e
        replay_endpoint = self._replay_endpoint
        if replay_endpoint is not None and self._dealer_socket() is None:
            # ZeroMQ refused the address: nothing of this subscriber stays open
            self.close()
            raise TransportError(
                f"cannot connect to replay_endpoint {replay_endpoint!r}: {self._dealer_error}"
            )

    def poll(self, timeout: float = 0.0, max_messages: int = 10_000) -> int:
        """Receive what has arrived, waiting up to ``timeout`` s for the first message;
        meanwhile notice reconnections and probe a quiet publisher (in the background:
        a probe's answer is taken by a later call when it is not there yet).

        Returns:
            The number of batches delivered to ``on_batch``.

        Raises:
            TransportError: bad arguments. Nothing a peer sends raises.
        """
        end = time.monotonic() + check_seconds("timeout", timeout)
        check_count("max_messages", max_messages, 1)
        before = self.stats["delivered"]
        while True:
            self._check_connections()
            self._read_probe()  # also times out one past its deadline
            self._start_probe()
            poller = zmq.Poller()
            poller.register(self._sub, zmq.POLLIN)
            poller.register(self._monitor, zmq.POLLIN)
            if self._probe is not None and self._dealer is not None:
                poller.register(self._dealer, zmq.POLLIN)
            wait = end - time.monotonic()
            if self._probe is not None:
                wait = min(wait, self._probe.deadline - time.monotonic())
            ready = dict(poller.poll(max(0, int(wait * 1000))))
            if self._dealer is not None and self._dealer in ready:
                self._read_probe()
            if self._sub in ready:
                self._drain(max_messages)
            if self.stats["delivered"] > before or self._sub in ready:
                break
            if time.monotonic() >= end:
                break
        return self.stats["delivered"] - before

    def sync(self) -> int:
        """Ask the publisher for everything from :attr:`next_seq` on (or from 0).

        Closes the gaps a live stream cannot reveal: batches lost before the first
        one received (slow joiner) and at the tail. Returns the batches delivered.
        """
        before = self.stats["delivered"]
        if self.next_seq is None:
            self.next_seq = 0
        if not self._catch_up(None):
            self._resync(None)
        return self.stats["delivered"] - before

    def close(self) -> None:
        """Close the sockets."""
        self._sub.disable_monitor()
        self._monitor.close(linger=0)
        self._sub.close(linger=0)
        self._drop_dealer()

    def __enter__(self) -> ZmqEventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ live frames

    def _drain(self, max_messages: int) -> None:
        for _ in range(max_messages):
            self._check_connections()
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._heard = time.monotonic()
            self.num_live_frames += 1
            seq = read_seq(frames[1]) if len(frames) == 3 else None
            if seq is None:
                self.stats["bad"] += 1  # no batch's frame; a batch lost with it is a gap
            else:
                self._on_live(seq, frames[2])

    def _check_connections(self) -> None:
        while self._monitor.poll(0):
            event = parse_monitor_message(self._monitor.recv_multipart())["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._verify = self.next_seq is not None
            elif self._endpoint is not None:
                # ZeroMQ reconnects after a network error but never after a protocol
                # error (a peer that broke ZMTP): connect again either way.
                self._sub.disconnect(self._endpoint)
                self._sub.connect(self._endpoint)

    def _on_live(self, seq: int, payload: bytes) -> None:
        if self._verify:
            self._verify = False
            if not self._catch_up(None):
                self._resync(None)
        if self.next_seq is None:
            self.next_seq = 0
        elif seq < self.next_seq:
            passed = self._unseen.take(seq)
            if passed is None:
                # Seen live already (no carrier repeats a frame): a new publisher run,
                # whatever its bytes.
                self._restarted()
            elif passed == SKIPPED or self._recent.get(seq) == hash(payload):
                # A late copy of a batch passed unseen, or a new run whose first
                # batches repeat the old run's bytes: the publisher's buffer tells.
                if self._same_run():
                    self.stats["duplicates"] += 1
                    return
                self._restarted()
            else:
                # A replay answer delivered other bytes under this seq than the live
                # stream carries: what it applied is not the engine's. Forget, and
                # follow the live stream from here.
                self._resync(seq)
        if seq > self.next_seq:
            self.stats["gaps"] += 1
            if not self._catch_up((seq, payload)) or seq > self.next_seq:
                self._resync(seq)  # the replay could not bridge the gap
        if seq == self.next_seq:
            self._deliver(seq, payload, live=True)
        else:
            self.stats["duplicates"] += 1

    # ------------------------------------------------------------ replay

    def _same_run(self) -> bool:
        """Whether the publisher still holds the last batch delivered, with its bytes
        (True), or runs anew (False). Without an answer (or a digest to compare) it
        cannot tell: the consumer forgets (``on_resync``) and True is returned."""
        anchor = (self.next_seq or 0) - 1
        digest = self._recent.get(anchor)
        answer = None if digest is None else self._request_replay(anchor)
        if answer is None:
            self._resync(None)
            return True
        frames = answer.frames
        if frames and frames[0][0] == anchor:
            return hash(frames[0][1]) == digest
        if not frames and (answer.next_seq is None or answer.next_seq <= anchor):
            return False  # its run is shorter than ours
        self._resync(None)  # moved past the window: cannot tell
        return True

    def _replay_from(self) -> tuple[int, int | None]:
        """(first seq wanted, anchor): ask one batch early when its digest is known: a
        publisher that no longer has it (a new run, behind us) or has another one under
        its seq (a new run, past us) has restarted."""
        start = self.next_seq or 0
        anchor = start - 1 if start > 0 and (start - 1) in self._recent else None
        return start, anchor

    def _catch_up(self, live: tuple[int, bytes] | None) -> bool:
        """Replay from :attr:`next_seq` and deliver in order; False without an answer.

        ``live``: the live batch that revealed a gap, which the answer must hold."""
        start, anchor = self._replay_from()
        answer = self._request_replay(start if anchor is None else anchor)
        return answer is not None and self._take_replay(start, anchor, answer, live)

    def _take_replay(
        self,
        start: int,
        anchor: int | None,
        answer: _Answer,
        live: tuple[int, bytes] | None,
    ) -> bool:
        frames, publisher_next = answer.frames, answer.next_seq
        if anchor is not None and (
            (not frames and (publisher_next is None or publisher_next <= anchor))
            or (
                frames and frames[0][0] == anchor and hash(frames[0][1]) != self._recent.get(anchor)
            )
        ):
            # the publisher no longer has our last batch, and has not moved past it
            # (its run is shorter than ours), or has another one under its seq
            self._restarted()
            return self._catch_up(live)
        if anchor is not None and (not frames or frames[0][0] != anchor):
            # It moved past our last batch without holding it (out of its window, or
            # another run that numbered past it): nothing vouches for what we hold.
            self._resync(None)
        if live is not None:
            seq, payload = live
            if (seq, payload) not in frames:
                # The answer lacks the batch the live stream carries (another run's,
                # or not this publisher's): none of it can be trusted.
                self._resync(seq)
                return True
            frames = frames[: frames.index((seq, payload))]  # the live stream brings the rest
        for seq, payload in frames:
            if seq < start:
                continue
            if seq > start:
                self._resync(seq)  # no longer buffered: lost for good
            self._deliver(seq, payload, live=False)
            start = seq + 1
        if live is None and publisher_next is not None and start < publisher_next:
            # batches the publisher numbered but no longer holds (dropped at the tail
            # of a burst, or out of its window): lost for good
            self._resync(publisher_next)
        return True

    def _dealer_socket(self) -> zmq.Socket[Any] | None:
        """The replay socket, connected (None when ZeroMQ refuses the address: nothing
        half-made is kept)."""
        if self._dealer is None:
            assert self._replay_endpoint is not None
            dealer = self._ctx.socket(zmq.DEALER)
            try:
                bound_connection(dealer, self._heartbeat)
                dealer.connect(self._replay_endpoint)
            except zmq.ZMQError as e:
                dealer.close(linger=0)
                self._dealer_error = str(e)
                return None
            self._dealer = dealer
        return self._dealer

    def _drop_dealer(self) -> None:
        # a new socket for the next request, so a late answer cannot be read as its own
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
        self._probe = None

    def _send_request(self, start: int) -> zmq.Socket[Any] | None:
        """Ask the replay socket for the batches from ``start``; None when it cannot be
        asked (no socket; a full send queue: the publisher is not reading)."""
        dealer = self._dealer_socket()
        if dealer is None:
            return None
        self.stats["replays"] += 1
        try:
            dealer.send_multipart((b"", start.to_bytes(8, "big")), zmq.NOBLOCK)
        except zmq.ZMQError:
            self._drop_dealer()
            return None
        return dealer

    def _request_replay(self, start: int) -> _Answer | None:
        """The batches buffered from ``start``; None without a (valid) answer."""
        if self._replay_endpoint is None:
            return None
        if self._probe is not None:
            self._drop_dealer()  # this request supersedes the probe in flight
        dealer = self._send_request(start)
        if dealer is None:
            return None
        answer = _Answer(start)
        deadline = time.monotonic() + self._replay_timeout
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0 or not dealer.poll(max(1, int(wait * 1000))):
                self._drop_dealer()
                return None
            done = self._read_answer(dealer.recv_multipart(), answer)
            if done is not None:
                if not done:
                    self._drop_dealer()
                    return None
                self._heard = time.monotonic()
                return answer

    def _read_answer(self, parts: list[bytes], answer: _Answer) -> bool | None:
        """Take one message of a replay answer: None while it goes on, True at its end
        marker, False when it is malformed (counted as bad)."""
        if len(parts) < 3:
            return None  # not a replay answer
        # [b"", topic, seq, payload]; older vLLM sent no topic frame. The end marker's
        # topic frame holds the publisher's next seq (prefixkv) or nothing (vLLM).
        seq_bytes, payload = parts[-2], parts[-1]
        frames = answer.frames
        if seq_bytes == END_SEQ:
            publisher_next = read_seq(parts[-3]) if len(parts) >= 4 else None
            if publisher_next is not None and frames and frames[-1][0] >= publisher_next:
                self.stats["bad"] += 1  # it sent batches past its own next seq
                return False
            answer.next_seq = publisher_next
            return True
        seq = read_seq(seq_bytes)
        if seq is None or seq < answer.asked or (frames and seq <= frames[-1][0]):
            # not a count, before what was asked, or out of order: trust none of it
            self.stats["bad"] += 1
            return False
        frames.append((seq, payload))
        return None

    def _start_probe(self) -> None:
        """Ask the replay socket, without waiting, what follows the last batch delivered,
        when a reconnection must be verified or the stream has been quiet."""
        if self._probe is not None or self._replay_endpoint is None:
            return
        now = time.monotonic()
        quiet = self._probe_interval is not None and now - self._heard >= self._probe_interval
        if not (quiet or self._verify):
            return
        self._heard = now  # a dead publisher is probed once per interval, not in a loop
        start, anchor = self._replay_from()
        asked = start if anchor is None else anchor
        if self._send_request(asked) is not None:
            deadline = now + self._replay_timeout
            self._probe = _Probe(start, anchor, self.next_seq, deadline, _Answer(asked))

    def _read_probe(self) -> None:
        """Take what has arrived of the probe's answer; act on it once complete."""
        probe, dealer = self._probe, self._dealer
        if probe is None or dealer is None:
            return
        done: bool | None = None
        while done is None and dealer.poll(0):
            done = self._read_answer(dealer.recv_multipart(), probe.answer)
        if done is None:
            if time.monotonic() >= probe.deadline:
                self._drop_dealer()  # no answer: the publisher may be gone; ask again later
            return
        self._probe = None
        if not done:
            self._drop_dealer()
            return
        self._heard = time.monotonic()
        if probe.expect != self.next_seq:
            return  # the stream moved meanwhile: this answer is stale
        self._verify = False
        self._take_replay(probe.start, probe.anchor, probe.answer, None)

    # ------------------------------------------------------------ outcomes

    def _deliver(self, seq: int, payload: bytes, *, live: bool) -> None:
        self._passed(seq, payload)
        if not live:
            self._unseen.replayed(seq)
        try:
            batch = self._decoder.decode(payload)
        except EventDecodeError:
            self.stats["bad"] += 1
            self._resync(seq + 1)  # this batch's events are lost
            return
        self.stats["delivered"] += 1
        self._on_batch(seq, batch)

    def _restarted(self) -> None:
        self._new_run()
        self._unseen.clear()
        if self._on_restart is not None:
            self._on_restart()

    def _resync(self, first_available: int | None) -> None:
        self.stats["resyncs"] += 1
        if first_available is not None:
            passed = self.next_seq or 0
            if first_available > passed:
                self._unseen.skipped(passed, first_available)
            else:
                self._unseen.drop_from(first_available)
            self.next_seq = first_available
        if self._on_resync is not None:
            self._on_resync(first_available)
