"""A ZeroMQ publisher of KV-event batches, frame for frame vLLM 0.33's ``ZmqEventPublisher``.

It sends ``[topic, seq, payload]`` (``seq`` 8-byte big-endian, from 0 per publisher,
so a restarted engine starts again at 0) and keeps the last ``buffer_steps``
batches for an optional ROUTER replay socket, which answers a replay request (the
8-byte start ``seq``) with every buffered batch from there, then the end marker
``[next_seq, END_SEQ, b""]``: vLLM's marker, whose topic frame (empty in vLLM) holds
the next ``seq`` the publisher will use, 8-byte big-endian, every earlier one sent
or dropped. A vLLM subscriber reads the marker by its ``seq`` frame or its empty
payload and never looks at that frame; a prefixkv subscriber learns from it that a
batch it never received was published (dropped at the tail of a burst) or that the
publisher is a shorter, new run.

Beyond vLLM's, for an offline producer (``prefixkv replay --kv-events``) and for
peers that misbehave:

* :meth:`~ZmqEventPublisher.wait_for_subscribers` blocks until N subscribers have
  subscribed (the socket is an XPUB, which sees subscriptions), so nothing is lost
  to ZeroMQ's slow-joiner problem: a subscription that reached the publisher gets
  every later frame;
* ``replay_grace`` keeps the replay socket answering for that long after
  :meth:`~ZmqEventPublisher.shutdown` sent the last batch, so a late subscriber can
  still catch up before the process exits; :meth:`~ZmqEventPublisher.end_grace` cuts
  it short (Ctrl-C);
* ``num_delivered``, ``max_subscribers`` and ``num_replays`` say whether anyone
  received the batches, live or by event replay;
* :meth:`~ZmqEventPublisher.publish` encodes and checks the batch at the call (what
  a subscriber could not decode is refused there) and never blocks for more than
  ``publish_timeout``: a batch that finds the queue still full is dropped, counted in
  ``num_dropped``, and its ``seq`` left unused, so subscribers see the gap (by the
  next batch, or by the end marker's next ``seq`` when it was the last);
* the sending thread never dies silently: its failure is raised, as
  :class:`TransportError`, by the next ``publish`` and by ``shutdown``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import Any

import msgspec
import zmq

from .codec import EventDecodeError, EventDecoder
from .sockets import (
    END_SEQ,
    TransportError,
    bind,
    bound_connection,
    check_addresses,
    check_count,
    check_seconds,
    is_bind_endpoint,
    offset_endpoint_port,
    read_seq,
)
from .wire import EventBatch

__all__ = ["ZmqEventPublisher"]


class ZmqEventPublisher:
    """Publishes event batches on an XPUB socket, with a replay buffer on a ROUTER socket.

    A background thread sends and answers replay requests, as in vLLM, so ``publish``
    never waits on the network.

    Args:
        endpoint: the publishing address; bound when it has a wildcard or is
            ipc/inproc, connected otherwise (a central subscriber then binds).
        replay_endpoint: ROUTER address for replay requests (always bound), or None.
        buffer_steps: batches kept for replay.
        hwm: the send high-water mark (batches queued per subscriber before ZeroMQ drops).
        max_queue_size: batches waiting for the sending thread.
        topic: the first frame of every message.
        data_parallel_rank: stamped on batches without one; offsets the ports.
        publish_timeout: seconds ``publish`` waits for room in a full queue before it
            drops the batch (counted in :attr:`num_dropped`).
        replay_grace: seconds the replay socket keeps answering after ``shutdown``
            has sent the last batch.
        heartbeat: seconds between ZMTP heartbeats; a peer silent for three is dropped.
        context: the ZeroMQ context (default: the process-wide instance).

    Attributes:
        num_dropped: batches dropped because the queue stayed full.

    Raises:
        TransportError: bad options, or an endpoint that cannot be opened.
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
        publish_timeout: float = 1.0,
        replay_grace: float = 0.0,
        heartbeat: float = 5.0,
        context: zmq.Context[Any] | None = None,
    ) -> None:
        check_count("buffer_steps", buffer_steps)
        check_count("hwm", hwm)
        check_count("max_queue_size", max_queue_size, 1)
        check_count("data_parallel_rank", data_parallel_rank)
        self._publish_timeout = check_seconds("publish_timeout", publish_timeout)
        self._grace = check_seconds("replay_grace", replay_grace)
        heartbeat = check_seconds("heartbeat", heartbeat, positive=True)
        self._topic = check_addresses(endpoint, replay_endpoint, topic)
        self.data_parallel_rank = data_parallel_rank
        self.num_dropped = 0
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[tuple[int, bytes]] = queue.Queue(maxsize=max_queue_size)
        self._lock = threading.Lock()  # publish: number, encode, queue, in order
        self._encoder = msgspec.msgpack.Encoder()
        self._checker = EventDecoder()
        self._next_seq = 0
        # The sending thread's view: every seq below _settled was sent or dropped;
        # _dropped holds the dropped seqs not yet passed, in order (appended by publish).
        self._settled = 0
        self._dropped: deque[int] = deque()
        self.num_delivered = 0
        """Batches sent while at least one subscriber received this topic."""
        self.max_subscribers = 0
        """The most subscribers that received one batch."""
        self.num_replays = 0
        """Replay requests answered (a late subscriber catching up)."""
        self._stop = threading.Event()
        self._end_grace = threading.Event()
        self._drained = threading.Event()  # the last batch was sent: the grace begins
        self._subscribed = threading.Condition()
        self._num_subscribers = 0
        self._failure: BaseException | None = None
        endpoint = offset_endpoint_port(endpoint, data_parallel_rank) or endpoint
        self.endpoint = endpoint
        """The publishing address (the resolved one when a wildcard port was bound)."""
        self._replay: zmq.Socket[Any] | None = None
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, data_parallel_rank)
        """The ROUTER address (resolved), or None."""
        self._open_sockets(context or zmq.Context.instance(), hwm, heartbeat, buffer_steps)
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)
        self._thread.start()

    def _open_sockets(
        self, ctx: zmq.Context[Any], hwm: int, heartbeat: float, buffer_steps: int
    ) -> None:
        # The XPUB socket at self.endpoint and the ROUTER at self.replay_endpoint, each
        # resolved once bound; a refused address closes both.
        self._pub = ctx.socket(zmq.XPUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, to count them
        bound_connection(self._pub, heartbeat, 1024)  # inbound: subscriptions only
        endpoint, replay_endpoint = self.endpoint, self.replay_endpoint
        try:
            if is_bind_endpoint(endpoint):
                self.endpoint = bind(self._pub, endpoint)
            else:
                self._pub.connect(endpoint)
            if replay_endpoint is not None:
                self._replay = ctx.socket(zmq.ROUTER)
                # a whole replay plus its end marker must fit (vLLM: 2 * (buffer_steps + 1))
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                bound_connection(self._replay, heartbeat)
                self.replay_endpoint = bind(self._replay, replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise TransportError(
                f"cannot open endpoint {endpoint!r} / replay_endpoint {replay_endpoint!r}: {e}"
            ) from e

    def publish(self, batch: EventBatch) -> None:
        """Check, number and queue a batch (stamping ``data_parallel_rank`` if unset).

        Waits at most ``publish_timeout`` s for room; a batch that still finds the queue
        full is dropped and counted in :attr:`num_dropped` (its ``seq`` stays unused,
        so subscribers see a gap and resync).

        Raises:
            TransportError: the batch cannot be encoded or would not decode as a
                KV-event batch (nothing is sent, no ``seq`` used); the publisher was
                shut down; or its sending thread failed (the failure is the cause).
        """
        self._raise_failure()
        if not self._running:
            raise TransportError("publisher is shut down")
        if not isinstance(batch, EventBatch):
            raise TransportError(f"publish takes an EventBatch, got {type(batch).__name__}")
        with self._lock:
            if batch.data_parallel_rank is None:
                batch.data_parallel_rank = self.data_parallel_rank
            payload = self._encode(batch)
            seq = self._next_seq
            self._next_seq += 1
            try:
                self._queue.put((seq, payload), timeout=self._publish_timeout)
            except queue.Full:
                self.num_dropped += 1
                self._dropped.append(seq)

    def wait_for_subscribers(self, n: int = 1, timeout: float = 30.0) -> int:
        """Wait until at least ``n`` subscribers receive this publisher's topic.

        Every frame published after this returns reaches those subscribers (up to the
        high-water mark): the start signal an offline producer needs against
        ZeroMQ's slow-joiner loss. Subscribers to another topic are not counted.

        Returns:
            The number subscribed now: below ``n`` only when ``timeout`` s passed.

        Raises:
            TransportError: bad arguments, or the sending thread failed.
        """
        check_count("n", n)
        limit = time.monotonic() + check_seconds("timeout", timeout)
        with self._subscribed:
            while self._num_subscribers < n and self._failure is None:
                wait = limit - time.monotonic()
                if wait <= 0 or not self._thread.is_alive():
                    break
                self._subscribed.wait(min(wait, 0.1))
            self._raise_failure()
            return self._num_subscribers

    @property
    def num_subscribers(self) -> int:
        """Subscribers currently receiving this publisher's topic."""
        return self._num_subscribers

    def shutdown(self, timeout: float = 1.0) -> None:
        """Send what is queued (up to ``timeout`` s), answer replays for ``replay_grace``
        s more, then close the sockets. Blocks until then.

        Raises:
            TransportError: the sending thread failed (the failure is the cause).
        """
        if self.finish_sending(timeout):
            self._thread.join(self._grace + 1.0)
        self._raise_failure()

    close = shutdown

    def finish_sending(self, timeout: float = 10.0) -> bool:
        """Take no more batches and send what is queued (up to ``timeout`` s); the
        replay grace begins once it is sent. Returns whether everything queued was
        sent (False at once when the sending thread has failed)."""
        timeout = check_seconds("timeout", timeout)
        self._running = False
        self._stop.set()
        return self._failure is None and self._drained.wait(timeout)

    def end_grace(self) -> None:
        """Stop answering replays now, however much of ``replay_grace`` is left (safe
        from a signal handler or another thread): a :meth:`shutdown` that waits for the
        grace returns."""
        self._end_grace.set()

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            self.shutdown()
        except TransportError:
            if exc_type is None:  # never hide the exception that ended the block
                raise

    # ------------------------------------------------------------ internals

    def _encode(self, batch: EventBatch) -> bytes:
        try:
            payload = self._encoder.encode(batch)
            self._checker.decode(payload)  # what a subscriber would refuse, refused here
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError) as e:
            # EventDecodeError is a ValueError; msgspec's encode errors are the others
            what = "would not decode" if isinstance(e, EventDecodeError) else "cannot be encoded"
            raise TransportError(f"batch {what}: {e}") from None
        return payload

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise TransportError(
                f"the publisher's sending thread failed: {self._failure!r}"
            ) from self._failure

    def _close_sockets(self) -> None:
        self._pub.close(linger=100)
        if self._replay is not None:
            self._replay.close(linger=100)

    def _run(self) -> None:
        try:
            self._loop()
            self._drained.set()
            end = time.monotonic() + self._grace
            while time.monotonic() < end and not self._end_grace.is_set():  # replays only
                self._serve(0.01)
        except BaseException as e:  # recorded, raised by the next publish() / shutdown()
            self._failure = e
            self._running = False
        finally:
            self._close_sockets()
            with self._subscribed:
                self._subscribed.notify_all()

    def _loop(self) -> None:
        topic = self._topic
        while True:
            self._serve(0)
            try:
                seq, payload = self._queue.get(timeout=0.005)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            self._pub.send_multipart((topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self._settled = seq + 1
            if self._num_subscribers > 0:
                self.num_delivered += 1
                self.max_subscribers = max(self.max_subscribers, self._num_subscribers)

    def _serve(self, wait: float) -> None:
        """Answer waiting replay requests and count (un)subscriptions."""
        if self._replay is not None and self._replay.poll(int(wait * 1000)):
            self._serve_replay()
        while self._pub.poll(0):
            self._count_subscription(self._pub.recv())

    def _count_subscription(self, message: bytes) -> None:
        # b"\x01" + prefix subscribes, b"\x00" + prefix unsubscribes; a prefix that does
        # not start our topic receives nothing from us.
        if not message or message[0] > 1 or not self._topic.startswith(message[1:]):
            return
        with self._subscribed:
            self._num_subscribers += 1 if message[0] == 1 else -1
            self._subscribed.notify_all()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        start = read_seq(frames[2]) if len(frames) == 3 else None
        if start is None:
            return  # not a replay request: [client, b"", start seq]
        client, topic = frames[0], self._topic
        for seq, payload in self._buffer:
            if seq >= start:
                self._replay.send_multipart((client, b"", topic, seq.to_bytes(8, "big"), payload))
        marker = self._next_settled().to_bytes(8, "big")
        self._replay.send_multipart((client, b"", marker, END_SEQ, b""))
        self.num_replays += 1

    def _next_settled(self) -> int:
        """The next seq after every one sent or dropped (batches still queued excluded:
        they are on their way). O(1) amortized: each dropped seq is passed once."""
        settled, dropped = self._settled, self._dropped
        while dropped and dropped[0] <= settled:
            if dropped.popleft() == settled:
                settled += 1
        self._settled = settled
        return settled
