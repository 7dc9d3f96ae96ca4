"""The ZeroMQ event stream against peers that misbehave, and an offline publisher's
start and end.

A hostile or broken publisher (malformed payloads and frames, oversized frames, a
replay socket answering nonsense) never makes ``poll()``/``sync()`` raise: each batch
is counted and resynced. A restarted publisher whose first burst is lost and which
then goes quiet is still noticed. The publisher refuses at the call what it cannot
send, reports a failure of its sending thread, never blocks forever, waits for its
subscribers on request and answers replays for a grace period after the last batch.
Loopback endpoints only (ipc, inproc); every test is bounded in time.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from prefixkv.adapters.events.codec import encode
from prefixkv.adapters.events.transport import (
    END_SEQ,
    TransportError,
    ZmqEventPublisher,
    ZmqEventSubscriber,
)
from prefixkv.adapters.events.wire import AllBlocksCleared, BlockStored, KVEventBatch


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def batch(ts: float, n_hashes: int = 1) -> KVEventBatch:
    hashes = list(range(int(ts) * 1000, int(ts) * 1000 + n_hashes))
    return KVEventBatch(ts, [BlockStored(hashes, None, [1] * n_hashes, 1, None, "GPU", None)])


HANG_S = 120.0
"""A bound against hangs only: far above any wait here (milliseconds on an idle
machine, a few seconds at load 25), it never decides what a test checks."""
HANG_MS = int(HANG_S * 1000)


def wait_until(done: Callable[[], bool], step: Callable[[], object], limit: float = HANG_S) -> None:
    """Step until ``done()``: the count a test waits for, not a time."""
    end = time.monotonic() + limit
    while not done():
        assert time.monotonic() < end, "hung"
        step()


class Recorder:
    """The callbacks of a subscriber, recorded."""

    def __init__(self) -> None:
        self.got: list[tuple[int, float]] = []
        self.resyncs: list[int | None] = []
        self.restarts = 0

    def subscribe(self, ctx: zmq.Context[Any], endpoint: str, **options: Any) -> ZmqEventSubscriber:
        def on_restart() -> None:
            self.restarts += 1

        return ZmqEventSubscriber(
            endpoint,
            lambda seq, b: self.got.append((seq, b.ts)),
            on_restart=on_restart,
            on_resync=self.resyncs.append,
            context=ctx,
            **options,
        )


def raw_publisher(ctx: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    """An XPUB socket the test drives frame by frame (XPUB: it sees the subscription)."""
    sock = ctx.socket(zmq.XPUB)
    sock.bind(endpoint)
    return sock


def seq8(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


# ------------------------------------------------------------------ hostile peers

HOSTILE_PAYLOADS = [
    msgspec.msgpack.encode([1.0, [{"type": [1], "block_hashes": [1]}]]),  # TypeError before
    msgspec.msgpack.encode([1.0, [{"type": {"a": 1}, "block_hashes": [1]}]]),
    b"\x92\xcb" + b"\x00" * 8 + b"\x91" * 5000 + b"\xc0",  # RecursionError before
    msgspec.msgpack.encode([math.nan, []]),
    msgspec.msgpack.encode([1.0, [], -3]),
    b"\xc1",
]


def test_hostile_payloads_and_frames_never_escape_poll(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/pub"
    rec = Recorder()
    pub = raw_publisher(ctx, endpoint)
    sub = rec.subscribe(ctx, endpoint, probe_interval=None)
    try:
        assert pub.poll(HANG_MS)
        pub.recv()  # the subscription: the link is up
        for seq, payload in enumerate(HOSTILE_PAYLOADS):
            pub.send_multipart([b"", seq8(seq), payload])
        bad_frames = (
            [
                [b"", payload]  # two parts
                for payload in HOSTILE_PAYLOADS[:1]
            ]
            + [
                [b"", b"\x00" * 7, encode(batch(1.0))],  # a 7-byte sequence frame
                [b"", END_SEQ, encode(batch(1.0))],  # the end marker as a live frame
                [b"", seq8(2**63), encode(batch(1.0))],  # beyond any count
            ]
        )
        for frames in bad_frames:
            pub.send_multipart(frames)
        good = len(HOSTILE_PAYLOADS)
        pub.send_multipart([b"", seq8(good), encode(batch(9.0))])
        wait_until(lambda: rec.got != [], lambda: sub.poll(0.05))
        assert rec.got == [(good, 9.0)]
        assert sub.stats["bad"] == len(HOSTILE_PAYLOADS) + len(bad_frames)
        # each undecodable batch: its events are lost, the consumer told to resync
        assert rec.resyncs == list(range(1, good + 1))
        assert sub.next_seq == good + 1 and sub.stats["delivered"] == 1
    finally:
        sub.close()
        pub.close(linger=0)


def test_a_replay_answer_out_of_order_or_malformed_is_counted_not_trusted(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    replay_ep = f"ipc://{tmp_path}/replay"
    router = ctx.socket(zmq.ROUTER)
    router.bind(replay_ep)
    answers = [
        [seq8(1), seq8(0)],  # going backwards
        [b"\x01\x02", seq8(3)],  # a 2-byte sequence frame
    ]

    def serve() -> None:
        for seqs in answers:
            if not router.poll(HANG_MS):
                return
            client, _, _start = router.recv_multipart()
            for s in seqs:
                router.send_multipart([client, b"", b"", s, encode(batch(float(len(s))))])
            router.send_multipart([client, b"", b"", END_SEQ, b""])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    rec = Recorder()
    sub = rec.subscribe(
        ctx,
        f"ipc://{tmp_path}/pub",
        replay_endpoint=replay_ep,
        probe_interval=None,
        replay_timeout=HANG_S,  # both answers come: waited for, never timed out
    )
    try:
        for _ in answers:
            assert sub.sync() == 0
        server.join(HANG_S)
        assert rec.got == [] and sub.stats["bad"] == 2 and rec.resyncs == [None, None]
    finally:
        sub.close()
        router.close(linger=0)


def test_an_oversized_payload_is_counted_and_the_stream_goes_on(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/pub"
    rec = Recorder()
    sub = rec.subscribe(ctx, endpoint, max_payload_bytes=2000, probe_interval=None)
    try:
        with ZmqEventPublisher(endpoint, context=ctx) as pub:
            assert pub.wait_for_subscribers(1, HANG_S) == 1
            pub.publish(batch(0.0))
            pub.publish(batch(1.0, n_hashes=1000))  # ~9 KB
            pub.publish(batch(2.0))
            wait_until(lambda: len(rec.got) == 2, lambda: sub.poll(0.05))
        assert rec.got == [(0, 0.0), (2, 2.0)]
        assert sub.stats["bad"] == 1 and rec.resyncs == [2]
    finally:
        sub.close()


def test_a_peer_that_breaks_the_protocol_does_not_deafen_the_subscriber(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    # Something else answers at the publisher's address first and fails the ZMTP
    # handshake: libzmq drops that connection and would never connect again.
    path = tmp_path / "pub"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(5)
    rec = Recorder()
    sub = rec.subscribe(ctx, f"ipc://{path}", probe_interval=None)
    try:
        conn, _ = server.accept()
        # ZMTP 3.0's signature and version, then a mechanism nobody knows
        conn.sendall(b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"BOGUS".ljust(20, b"\0") + bytes(32))
        time.sleep(0.2)
        sub.poll(0.05)  # sees the failed connection
        conn.close()
        server.close()
        path.unlink()
        with ZmqEventPublisher(f"ipc://{path}", context=ctx) as pub:

            def step() -> None:
                pub.publish(batch(1.0))
                sub.poll(0.05)

            wait_until(lambda: rec.got != [], step)
    finally:
        sub.close()
        server.close()


# ------------------------------------------------------------------ restarts


def test_a_restart_whose_burst_was_lost_is_noticed_in_silence(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    # The subscriber hears the publisher through a relay that stays up (as a proxy or
    # a load balancer would): the restart makes no reconnection it could see, the new
    # run's burst is lost on the way, and then nothing more is published.
    pub_ep, replay_ep, relay_ep = (f"ipc://{tmp_path}/{n}" for n in ("pub", "replay", "relay"))
    relay_in = ctx.socket(zmq.SUB)
    relay_in.setsockopt(zmq.SUBSCRIBE, b"")
    relay_out = raw_publisher(ctx, relay_ep)
    rec = Recorder()
    sub = rec.subscribe(ctx, relay_ep, replay_endpoint=replay_ep)  # default probe
    try:
        assert relay_out.poll(HANG_MS)
        relay_out.recv()
        with ZmqEventPublisher(pub_ep, replay_ep, context=ctx) as pub:
            relay_in.connect(pub_ep)  # once bound: no retry timer, no teardown to meet
            assert pub.wait_for_subscribers(1, HANG_S) == 1
            for i in range(5):
                pub.publish(batch(float(i)))
            for _ in range(5):
                assert relay_in.poll(HANG_MS)
                relay_out.send_multipart(relay_in.recv_multipart())
            wait_until(lambda: len(rec.got) == 5, lambda: sub.poll(0.05))
        with ZmqEventPublisher(pub_ep, replay_ep, context=ctx) as pub:
            for i in range(3):
                pub.publish(batch(100.0 + i))  # the relay forwards none of these
            wait_until(lambda: rec.restarts == 1 and len(rec.got) == 8, lambda: sub.poll(0.05))
            assert rec.got[5:] == [(0, 100.0), (1, 101.0), (2, 102.0)]
    finally:
        sub.close()
        relay_in.close(linger=0)
        relay_out.close(linger=0)


# ------------------------------------------------------------------ the publisher


class Wrapped:
    """A publisher's socket, with its sends replaced (faults of the sending thread)."""

    def __init__(self, sock: zmq.Socket[Any], send: Callable[[Any], None]) -> None:
        self._sock = sock
        self.send_multipart = send

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (KVEventBatch(1.0, [object()]), "cannot be encoded"),  # type: ignore[list-item]
        (KVEventBatch(math.nan, [AllBlocksCleared()]), "would not decode"),
        (KVEventBatch(1.0, [BlockStored(["x"], None, [], 1, None, "GPU", None)]), "would not"),  # type: ignore[list-item]
        (KVEventBatch(1.0, [AllBlocksCleared()], -1), "would not decode"),
        ({"ts": 1.0, "events": []}, "EventBatch"),
    ],
)
def test_publish_refuses_what_it_cannot_send_at_the_call(
    bad: Any, message: str, ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    with ZmqEventPublisher(f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay", context=ctx) as pub:
        with pytest.raises(TransportError, match=message):
            pub.publish(bad)
        pub.publish(batch(1.0))  # the publisher still works, and no seq was used
        rec = Recorder()
        sub = rec.subscribe(ctx, f"ipc://{tmp_path}/x", replay_endpoint=pub.replay_endpoint)
        try:
            wait_until(lambda: rec.got != [], sub.sync)
            assert rec.got == [(0, 1.0)]
        finally:
            sub.close()


def test_a_failed_sending_thread_is_raised_by_publish_and_shutdown(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    pub = ZmqEventPublisher(f"ipc://{tmp_path}/pub", context=ctx)

    def broken(frames: Any) -> None:
        raise zmq.ZMQError(zmq.EFSM)

    pub._pub = Wrapped(pub._pub, broken)  # type: ignore[assignment]
    pub.publish(batch(0.0))
    with pytest.raises(TransportError, match="sending thread failed") as raised:
        wait_until(lambda: False, lambda: (pub.publish(batch(1.0)), time.sleep(0.01)))
    assert isinstance(raised.value.__cause__, zmq.ZMQError)
    with pytest.raises(TransportError, match="sending thread failed"):
        pub.shutdown()


def test_publish_never_blocks_forever_on_a_full_queue(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    release = threading.Event()
    pub = ZmqEventPublisher(
        f"ipc://{tmp_path}/pub",
        f"ipc://{tmp_path}/replay",
        max_queue_size=2,
        publish_timeout=0.1,
        context=ctx,
    )
    sent: list[Any] = []
    real = pub._pub

    def stuck(frames: Any) -> None:
        release.wait(HANG_S)
        sent.append(frames)
        real.send_multipart(frames)

    pub._pub = Wrapped(real, stuck)  # type: ignore[assignment]
    try:
        for i in range(6):  # one in the stuck send, two queued, three dropped
            pub.publish(batch(float(i)))
        # every publish returned while the first send was still stuck: none waited on it
        assert sent == [] and not release.is_set()
        assert pub.num_dropped == 3
    finally:
        release.set()
        pub.shutdown()
    # the dropped batches' seqs were left unused: a subscriber sees the gap
    assert [int.from_bytes(f[1], "big") for f in sent] == [0, 1, 2]


def test_a_subscriber_started_first_gets_every_batch_live(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    endpoint = f"ipc://{tmp_path}/pub"
    rec, other = Recorder(), Recorder()
    sub = rec.subscribe(ctx, endpoint, topic="kv", probe_interval=None)
    elsewhere = other.subscribe(ctx, endpoint, topic="metrics", probe_interval=None)
    try:
        with ZmqEventPublisher(endpoint, topic="kv", context=ctx) as pub:
            assert pub.wait_for_subscribers(1, HANG_S) == 1
            assert pub.wait_for_subscribers(2, 0.3) == 1  # the other topic's does not count
            for i in range(300):
                pub.publish(batch(float(i)))
            wait_until(lambda: len(rec.got) == 300, lambda: sub.poll(0.05))
        assert rec.got == [(i, float(i)) for i in range(300)]
        assert sub.stats["gaps"] == 0 and rec.resyncs == [] and other.got == []
    finally:
        sub.close()
        elsewhere.close()


def test_a_late_subscriber_recovers_everything_during_the_grace(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    pub_ep, replay_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    # The grace is the one time here: the late subscriber's sync (milliseconds) must
    # fall inside it, so it is long; what follows it waits for the thread, not a timer.
    pub = ZmqEventPublisher(pub_ep, replay_ep, replay_grace=5.0, context=ctx)
    for i in range(50):
        pub.publish(batch(float(i)))
    closing = threading.Thread(target=pub.shutdown, kwargs={"timeout": HANG_S})
    closing.start()  # blocks for the grace, like a process that is about to exit
    rec, too_late = Recorder(), Recorder()
    sub = rec.subscribe(ctx, pub_ep, replay_endpoint=replay_ep, probe_interval=None)
    try:
        wait_until(lambda: len(rec.got) == 50, sub.sync)  # the sending thread may lag
        assert rec.got == [(i, float(i)) for i in range(50)]
        closing.join(HANG_S)
        pub._thread.join(HANG_S)  # the grace is over when the sending thread has ended
        assert not closing.is_alive() and not pub._thread.is_alive()
        # after the grace the replay socket is closed: no answer, a resync
        late = too_late.subscribe(
            ctx, pub_ep, replay_endpoint=replay_ep, replay_timeout=0.2, probe_interval=None
        )
        try:
            assert late.sync() == 0 and too_late.resyncs == [None]
        finally:
            late.close()
    finally:
        sub.close()
        closing.join(HANG_S)


def test_bad_options_are_named_errors(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    ep = f"ipc://{tmp_path}/pub"
    for options in (
        {"publish_timeout": math.nan},
        {"replay_grace": -1},
        {"replay_grace": math.inf},
        {"max_queue_size": 0},
        {"heartbeat": 0},
        {"hwm": True},
        {"topic": 5},
        {"data_parallel_rank": -1},
    ):
        with pytest.raises(TransportError):
            ZmqEventPublisher(ep, context=ctx, **options)
    for options in (
        {"probe_interval": math.nan},
        {"probe_interval": 0},
        {"replay_timeout": -1},
        {"max_payload_bytes": 0},
        {"remember": 0},
        {"heartbeat": math.inf},
        {"replay_endpoint": 3},
    ):
        with pytest.raises(TransportError):
            ZmqEventSubscriber(ep, lambda s, b: None, context=ctx, **options)
    with ZmqEventSubscriber(ep, lambda s, b: None, context=ctx) as sub:
        for timeout in (math.nan, -1.0, "1"):
            with pytest.raises(TransportError):
                sub.poll(timeout)  # type: ignore[arg-type]
    with ZmqEventPublisher(ep, context=ctx) as pub:
        with pytest.raises(TransportError):
            pub.wait_for_subscribers(-1)
        with pytest.raises(TransportError):
            pub.wait_for_subscribers(1, math.inf)
