"""KV-event batches over ZeroMQ, frame for frame like vLLM 0.33's ``ZmqEventPublisher``.

Publisher: a PUB socket sends ``[topic, seq, payload]`` (``seq`` 8-byte big-endian,
from 0 per publisher process, so a restarted engine starts again at 0); an optional
ROUTER socket answers a replay request (the 8-byte start ``seq``) with every buffered
batch from there, ``[topic, seq, payload]`` each, then the end marker
``[b"", END_SEQ, b""]``. The last ``buffer_steps`` batches are kept for replay.

Subscriber: delivers batches in sequence order, exactly once, and says when it
cannot (the llm-d and Dynamo subscribers' cases, each handled explicitly):

* a gap (a batch lost: slow joiner, high-water mark, network) -> replay from the
  first missing ``seq``;
* the sequence going backwards with different content, or a replay (asked after
  every reconnection) that no longer holds the last batch delivered or holds another
  one under its ``seq`` -> an engine restart:
  ``on_restart`` (drop that replica's state), then replay the new run from 0;
* the replay window exceeded (the batches needed are no longer buffered), no replay
  socket or no answer -> ``on_resync(first_seq_available)``: the consumer's state
  misses events and needs a full resync; delivery continues from what is available.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import count
from typing import Any

import msgspec
import zmq

from prefixkv.indexes.errors import PrefixKVError

from .codec import EventDecodeError
from .sequence import SequencedStream
from .wire import EventBatch, KVEventBatch

__all__ = [
    "END_SEQ",
    "TransportError",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
    "offset_endpoint_port",
]

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay answer's end marker (vLLM's ``ZmqEventPublisher.END_SEQ``)."""


class TransportError(PrefixKVError):
    """A bad endpoint or option, or a closed publisher."""


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """vLLM's per-rank endpoint: tcp port + rank, ``inproc`` name + ``_dp<rank>``.

    Raises:
        TransportError: an endpoint that is neither tcp nor inproc (with a rank > 0).
    """
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit() or int(port) == 0:
            return endpoint
        return f"{base}:{int(port) + data_parallel_rank}"
    raise TransportError(f"endpoint {endpoint!r} must be tcp:// or inproc:// to offset by rank")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard hosts and ipc/inproc addresses, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _bind(sock: zmq.Socket[Any], endpoint: str) -> str:
    sock.bind(endpoint)
    # A wildcard port ("tcp://127.0.0.1:*") resolves to the one the OS picked.
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


class ZmqEventPublisher:
    """Publishes event batches on a PUB socket, with a replay buffer on a ROUTER socket.

    A background thread encodes and sends, as in vLLM, so ``publish`` never blocks on
    the network; the thread also answers replay requests.

    Args:
        endpoint: PUB address; bound when it has a wildcard or is ipc/inproc,
            connected otherwise (a central subscriber then binds).
        replay_endpoint: ROUTER address for replay requests (always bound), or None.
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's send high-water mark (batches queued per subscriber
            before ZeroMQ drops).
        max_queue_size: batches waiting for the sending thread before ``publish`` blocks.
        topic: the first frame of every message.
        data_parallel_rank: stamped on batches without one; offsets the ports.
        context: the ZeroMQ context (default: the process-wide instance).

    Raises:
        TransportError: bad options.
    """

    def __init__(
        self,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        *,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        data_parallel_rank: int = 0,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        for name, value in (("buffer_steps", buffer_steps), ("hwm", hwm)):
            if type(value) is not int or value < 0:
                raise TransportError(f"{name} must be a non-negative int, got {value!r}")
        self.data_parallel_rank = data_parallel_rank
        self._topic = topic.encode()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[EventBatch | None] = queue.Queue(maxsize=max_queue_size)
        self._seq = count()
        ctx = context or zmq.Context.instance()
        endpoint = offset_endpoint_port(endpoint, data_parallel_rank) or endpoint
        self._pub = ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self.endpoint = endpoint
        """The PUB address (the resolved one when a wildcard port was bound)."""
        self._replay: zmq.Socket[Any] | None = None
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, data_parallel_rank)
        """The ROUTER address (resolved), or None."""
        try:
            if is_bind_endpoint(endpoint):
                self.endpoint = _bind(self._pub, endpoint)
            else:
                self._pub.connect(endpoint)
            if self.replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                # a whole replay plus its end marker must fit (vLLM: 2 * (buffer_steps + 1))
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self.replay_endpoint = _bind(self._replay, self.replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise TransportError(f"cannot open {endpoint!r} / {replay_endpoint!r}: {e}") from e
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)
        self._thread.start()

    def publish(self, batch: EventBatch) -> None:
        """Queue a batch for sending (stamping ``data_parallel_rank`` if unset).

        Raises:
            TransportError: the publisher was shut down.
        """
        if not self._running:
            raise TransportError("publisher is shut down")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.data_parallel_rank
        self._queue.put(batch)

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (up to ``timeout`` seconds), then close the sockets."""
        if not self._running:
            return
        self._running = False
        self._queue.put(None)
        self._thread.join(timeout)  # the thread closes the sockets on its way out

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _close_sockets(self) -> None:
        self._pub.close(linger=100)
        if self._replay is not None:
            self._replay.close(linger=100)

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._close_sockets()

    def _loop(self) -> None:
        pack = msgspec.msgpack.Encoder()
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=0.005)
            except queue.Empty:
                continue
            if batch is None:
                return
            seq = next(self._seq)
            payload = pack.encode(batch)
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            return  # not a replay request: [client, b"", start seq]
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        topic = self._topic
        for seq, payload in self._buffer:
            if seq >= start:
                self._replay.send_multipart((client, b"", topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))


BatchCallback = Callable[[int, KVEventBatch], None]


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
        remember: how many delivered batches' digests to keep for restart detection.
        hwm: the SUB socket's receive high-water mark.
        bind: bind ``endpoint`` instead of connecting.
        context: the ZeroMQ context (default: the process-wide instance).
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
        remember: int = 100_000,
        hwm: int = 100_000,
        bind: bool = False,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        super().__init__(remember)
        self._ctx = context or zmq.Context.instance()
        self._on_batch = on_batch
        self._on_restart = on_restart
        self._on_resync = on_resync
        self._replay_endpoint = replay_endpoint
        self._replay_timeout = replay_timeout
        self._dealer: zmq.Socket[Any] | None = None
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.set_hwm(hwm)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        # A new connection may be a restarted publisher whose run already passed our
        # position: its next frame would look like a continuation. Watch handshakes
        # and check continuity by replay before trusting the stream again.
        self._monitor = self._sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._verify = False
        self._last_live = -1  # seq of the last live frame (restart detection)
        try:
            (self._sub.bind if bind else self._sub.connect)(endpoint)
        except zmq.ZMQError as e:
            self.close()
            raise TransportError(f"cannot open {endpoint!r}: {e}") from e

    def poll(self, timeout: float = 0.0, max_messages: int = 10_000) -> int:
        """Receive what has arrived (waiting up to ``timeout`` s for the first message).

        Returns:
            The number of batches delivered to ``on_batch``.
        """
        before = self.stats["delivered"]
        if self._sub.poll(int(timeout * 1000)):
            for _ in range(max_messages):
                self._check_connections()
                try:
                    frames = self._sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(frames) == 3 and len(frames[1]) == 8:
                    self._on_live(int.from_bytes(frames[1], "big"), frames[2])
                else:
                    self.stats["bad"] += 1
        return self.stats["delivered"] - before

    def sync(self) -> int:
        """Ask the publisher for everything from :attr:`next_seq` on (or from 0).

        Closes the gaps a live stream cannot reveal: batches lost before the first
        one received (slow joiner) and at the tail. Returns the batches delivered.
        """
        before = self.stats["delivered"]
        if self.next_seq is None:
            self.next_seq = 0
        if not self._catch_up():
            self._resync(None)
        return self.stats["delivered"] - before

    def close(self) -> None:
        """Close the sockets."""
        self._sub.disable_monitor()
        self._monitor.close(linger=0)
        self._sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    def __enter__(self) -> ZmqEventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _check_connections(self) -> None:
        while self._monitor.poll(0):
            self._monitor.recv_multipart()  # [event id + value, endpoint]
            self._verify = self.next_seq is not None

    def _on_live(self, seq: int, payload: bytes) -> None:
        if self._verify:
            self._verify = False
            if not self._catch_up():
                self._resync(None)
        last_live, self._last_live = self._last_live, seq
        if self.next_seq is None:
            self.next_seq = 0
        elif seq < self.next_seq:
            if self._recent.get(seq) == hash(payload) or seq > last_live:
                # delivered by a replay already, or skipped by a resync: one run's live
                # frames only go forward, so a frame after the last live one is stale
                self.stats["duplicates"] += 1
                return
            self._restarted()  # the live sequence went backwards: a new publisher run
            self._last_live = seq
        if seq > self.next_seq:
            self.stats["gaps"] += 1
            if not self._catch_up() or seq > self.next_seq:
                self._resync(seq)  # the replay could not bridge the gap
        if seq == self.next_seq:
            self._deliver(seq, payload)
        else:
            self.stats["duplicates"] += 1

    def _catch_up(self) -> bool:
        """Replay from :attr:`next_seq` and deliver in order; False without an answer."""
        start = self.next_seq or 0
        # Ask one batch early when we still know its digest: a publisher that no
        # longer has it (a new run, behind us) or has another one under its seq (a new
        # run, past us) has restarted.
        anchor = start - 1 if start > 0 and (start - 1) in self._recent else None
        frames = self._request_replay(start if anchor is None else anchor)
        if frames is None:
            return False
        if anchor is not None and (
            not frames or (frames[0][0] == anchor and hash(frames[0][1]) != self._recent[anchor])
        ):
            self._restarted()
            return self._catch_up()
        for seq, payload in frames:
            if seq < start:
                continue
            if seq > start:
                self._resync(seq)  # no longer buffered: lost for good
            self._deliver(seq, payload)
            start = seq + 1
        return True

    def _request_replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """``[(seq, payload)]`` buffered from ``start``; None without an answer."""
        if self._replay_endpoint is None:
            return None
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.connect(self._replay_endpoint)
        self.stats["replays"] += 1
        dealer = self._dealer
        dealer.send_multipart((b"", start.to_bytes(8, "big")))
        frames: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + self._replay_timeout
        while True:
            wait = deadline - time.monotonic()
            if wait <= 0 or not dealer.poll(max(1, int(wait * 1000))):
                # drop the socket so a late answer cannot be read as the next one's
                dealer.close(linger=0)
                self._dealer = None
                return None
            parts = dealer.recv_multipart()
            if len(parts) < 3:
                continue  # not a replay answer
            # [b"", topic, seq, payload]; older vLLM sent no topic frame
            seq_bytes, payload = parts[-2], parts[-1]
            if seq_bytes == END_SEQ:
                return frames
            frames.append((int.from_bytes(seq_bytes, "big"), payload))

    def _deliver(self, seq: int, payload: bytes) -> None:
        self._passed(seq, payload)
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
        self._last_live = -1
        if self._on_restart is not None:
            self._on_restart()

    def _resync(self, first_available: int | None) -> None:
        self.stats["resyncs"] += 1
        if first_available is not None:
            self.next_seq = first_available
        if self._on_resync is not None:
            self._on_resync(first_available)
