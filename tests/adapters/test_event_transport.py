"""ZMQ publisher and subscriber on loopback: frames, replay, faults, restarts, resync.

A fault-injecting proxy sits between the publisher's PUB socket and the subscriber
(dropping, delaying and reordering batches); the subscriber replays from the
publisher's ROUTER socket directly. The subscriber's EventIndex must end equal to one
fed straight from the published batches, across a publisher restart.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from prefixkv.adapters.events.codec import EventDecoder, encode
from prefixkv.adapters.events.index import EventIndex, Source
from prefixkv.adapters.events.transport import (
    END_SEQ,
    TransportError,
    ZmqEventPublisher,
    ZmqEventSubscriber,
    offset_endpoint_port,
)
from prefixkv.adapters.events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def make_batches(rng: random.Random, n: int, ts0: float) -> list[KVEventBatch]:
    """A plausible stream: stores of chains, removals of held hashes, a rare reset."""
    held: Counter[int] = Counter()
    out = []
    for i in range(n):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.6 or not held:
                hs = [rng.randrange(40) for _ in range(rng.randint(1, 4))]
                events.append(
                    BlockStored(hs, None, [1] * len(hs), 1, None, "GPU", None, group_idx=0)
                )
                held.update(hs)
            elif r < 0.97:
                h = rng.choice(sorted(held))
                events.append(BlockRemoved([h], "GPU", group_idx=0))
                held[h] -= 1
                held += Counter()
            else:
                events.append(AllBlocksCleared())
                held.clear()
        out.append(KVEventBatch(ts=ts0 + i, events=events))
    return out


HANG_S = 120.0
"""A bound against hangs only: far above any wait here (milliseconds on an idle
machine, a few seconds at load 25), it never decides what a test checks."""
HANG_MS = int(HANG_S * 1000)


def snapshot(index: EventIndex) -> dict[Source, dict[int | bytes, int]]:
    return {s: index.blocks(s) for s in index.sources()}


class Proxy:
    """Forwards PUB frames, applying a fault to each: pass, drop, or hold for k frames.

    Both links are made in an order that loses nothing, at any load: the downstream
    XPUB is bound at once (create the proxy before the subscriber that connects to it,
    and :meth:`wait_subscribed` for it), the upstream SUB connects in :meth:`link`,
    once the publisher is bound (a SUB that connects first joins whenever its retry
    timer fires, and libzmq does not always come back to a restarted publisher's ipc
    path by itself).
    """

    def __init__(self, ctx: zmq.Context[Any], upstream: str, downstream: str) -> None:
        self.ctx, self.upstream = ctx, upstream
        self.sub: zmq.Socket[Any] | None = None
        self.pub = ctx.socket(zmq.XPUB)  # XPUB: it sees the subscriber's subscription
        self.pub.bind(downstream)
        self.held: list[tuple[int, list[bytes]]] = []
        self.faults: Counter[str] = Counter()

    def link(self) -> zmq.Socket[Any]:
        """A fresh upstream SUB (closing the last one): call it once the publisher is
        bound, then wait for the publisher to count it."""
        if self.sub is not None:
            self.sub.close(linger=0)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.upstream)
        return self.sub

    def wait_subscribed(self) -> None:
        """Wait until the downstream subscriber's subscription arrived: from then on
        every frame forwarded reaches it."""
        assert self.pub.poll(HANG_MS), "the subscriber never subscribed"
        assert self.pub.recv()[:1] == b"\x01"

    def pump(self, fault: Callable[[], int], sub: ZmqEventSubscriber, count: int) -> None:
        """Forward ``count`` frames (the publisher waited for this proxy's subscription,
        so none is lost before it); ``fault()``: -1 drop, 0 pass, k hold for k frames."""
        end = time.monotonic() + HANG_S
        for _ in range(count):
            assert self.sub is not None, "link() first"
            while not self.sub.poll(10):
                assert time.monotonic() < end, "hung"
                sub.poll(0)
            frames = self.sub.recv_multipart()
            k = fault()
            self.faults["drop" if k < 0 else "pass" if k == 0 else "delay"] += 1
            if k == 0:
                self.pub.send_multipart(frames)
            elif k > 0:
                self.held.append((k, frames))
            self._release(1)
            sub.poll(0)
        self._release(10**9)
        while sub.poll(0.05):  # what is in flight now; a test syncs for the rest
            pass

    def _release(self, step: int) -> None:
        keep = []
        for k, frames in self.held:
            if k - step <= 0:
                self.pub.send_multipart(frames)
            else:
                keep.append((k - step, frames))
        self.held = keep


def test_offset_endpoint_port() -> None:
    assert offset_endpoint_port("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint_port("tcp://*:0", 2) == "tcp://*:0"
    assert offset_endpoint_port("inproc://kv", 1) == "inproc://kv_dp1"
    assert offset_endpoint_port("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"
    with pytest.raises(TransportError):
        offset_endpoint_port("ipc:///tmp/kv", 1)


def test_frames_and_replay_answer_are_vllms(ctx: zmq.Context[Any]) -> None:
    pub = ZmqEventPublisher(
        "tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv", data_parallel_rank=0, context=ctx
    )
    try:
        batches = make_batches(random.Random(1), 3, 10.0)
        for b in batches:
            pub.publish(b)
        dealer = ctx.socket(zmq.DEALER)
        dealer.connect(pub.replay_endpoint or "")
        answer: list[list[bytes]] = []
        for _ in range(100):  # until the sending thread has sent all three
            dealer.send_multipart([b"", (1).to_bytes(8, "big")])
            answer = []
            while True:
                assert dealer.poll(HANG_MS)
                answer.append(dealer.recv_multipart())
                if answer[-1][2] == END_SEQ:
                    break
            if len(answer) == 3:
                break
            time.sleep(0.01)
        # [b"", topic, 8-byte big-endian seq, msgpack(batch)] from seq 1, then the marker
        assert answer == [
            [b"", b"kv", (1).to_bytes(8, "big"), encode(batches[1])],
            [b"", b"kv", (2).to_bytes(8, "big"), encode(batches[2])],
            # vLLM's end marker; its topic frame (empty in vLLM) holds the next seq
            [b"", (3).to_bytes(8, "big"), b"\xff" * 8, b""],
        ]
        assert batches[0].data_parallel_rank == 0  # stamped by publish
    finally:
        pub.shutdown()
    with pytest.raises(TransportError):
        pub.publish(batches[0])


def test_converges_through_drops_delays_reorders_and_a_restart(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    pub_ep, replay_ep, proxy_ep = (f"ipc://{tmp_path}/{n}" for n in ("pub", "replay", "proxy"))
    rng = random.Random(14)
    truth, mine = EventIndex(), EventIndex()
    restarts: list[int] = []
    resyncs: list[int | None] = []
    proxy = Proxy(ctx, pub_ep, proxy_ep)
    sub = ZmqEventSubscriber(
        proxy_ep,
        lambda seq, b: mine.apply(b, "r"),
        replay_endpoint=replay_ep,
        on_restart=lambda: (restarts.append(1), mine.clear("r")),
        on_resync=lambda start: (resyncs.append(start), mine.clear("r")),
        context=ctx,
    )

    def fault() -> int:
        r = rng.random()
        return -1 if r < 0.15 else rng.randint(1, 3) if r < 0.35 else 0

    try:
        for run, n in ((1, 60), (2, 30)):
            pub = ZmqEventPublisher(pub_ep, replay_ep, buffer_steps=1000, context=ctx)
            proxy.link()
            assert pub.wait_for_subscribers(1, HANG_S) == 1  # the proxy's SUB
            if run == 1:
                proxy.wait_subscribed()
            if run == 2:
                truth.clear("r")  # the engine restarted with an empty cache
            for b in make_batches(rng, n, ts0=1000.0 * run):
                pub.publish(b)
                truth.apply(b, "r")
            proxy.pump(fault, sub, n)
            sub.sync()  # the tail a live stream cannot reveal
            assert snapshot(mine) == snapshot(truth), (run, sub.stats, restarts, resyncs)
            assert sub.next_seq == n
            pub.shutdown()
        assert proxy.faults["drop"] > 0 and proxy.faults["delay"] > 0
        assert sub.stats["gaps"] > 0 and sub.stats["replays"] > 0
        # The new run is noticed once: as a restart, or (when the faults drop its
        # first live batches) as a full resync from its seq 0. Either way the
        # old run's blocks are forgotten (the snapshots above).
        assert (restarts, resyncs) in (([1], []), ([], [0])), (sub.stats, restarts, resyncs)
        assert sub.stats["restarts"] == len(restarts)
    finally:
        sub.close()


def test_restart_past_our_position_is_detected(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    # The new run publishes beyond the old position before the subscriber reconnects:
    # its next live frame looks like a continuation, but the batch under the last
    # seq delivered differs, so it is a restart (checked by replay on reconnection).
    pub_ep, replay_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/replay"
    got: list[tuple[int, float]] = []
    restarts: list[int] = []
    sub = ZmqEventSubscriber(
        pub_ep,
        lambda seq, b: got.append((seq, b.ts)),
        replay_endpoint=replay_ep,
        on_restart=lambda: restarts.append(1),
        context=ctx,
    )
    expected: list[tuple[int, float]] = []
    try:
        for run, n in ((1, 4), (2, 7)):
            with ZmqEventPublisher(pub_ep, replay_ep, context=ctx) as pub:
                for b in make_batches(random.Random(run), n, ts0=100.0 * run):
                    pub.publish(b)
                expected += [(i, 100.0 * run + i) for i in range(n)]
                _wait(
                    lambda want=list(expected): (sub.poll(0.01), sub.sync(), got == want)[-1], sub
                )
        assert restarts == [1]
    finally:
        sub.close()


def test_replay_window_exceeded_asks_for_a_resync(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    pub_ep, replay_ep, proxy_ep = (f"ipc://{tmp_path}/{n}" for n in ("pub", "replay", "proxy"))
    got: list[int] = []
    resyncs: list[int | None] = []
    proxy = Proxy(ctx, pub_ep, proxy_ep)  # bound before the subscriber connects
    sub = ZmqEventSubscriber(
        proxy_ep,
        lambda seq, b: got.append(seq),
        replay_endpoint=replay_ep,
        on_resync=resyncs.append,
        context=ctx,
    )
    try:
        with ZmqEventPublisher(pub_ep, replay_ep, buffer_steps=5, context=ctx) as pub:
            proxy.link()
            assert pub.wait_for_subscribers(1, HANG_S) == 1  # the proxy's SUB
            proxy.wait_subscribed()
            batches = make_batches(random.Random(3), 20, ts0=0.0)
            for b in batches:
                pub.publish(b)
            # deliver 0..2, lose 3..18, deliver 19: only 15..19 are still buffered
            seen = iter(range(100))
            proxy.pump(lambda: -1 if 3 <= next(seen) <= 18 else 0, sub, 20)
            sub.sync()  # frame 19 reveals the gap; the sync waits for its replay
        assert resyncs and resyncs[-1] == 15
        assert got[-5:] == [15, 16, 17, 18, 19] and got == sorted(set(got))
    finally:
        sub.close()


def test_no_replay_socket_means_resync_on_a_gap(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    pub_ep, proxy_ep = f"ipc://{tmp_path}/pub", f"ipc://{tmp_path}/proxy"
    got: list[int] = []
    resyncs: list[int | None] = []
    proxy = Proxy(ctx, pub_ep, proxy_ep)
    sub = ZmqEventSubscriber(
        proxy_ep, lambda seq, b: got.append(seq), on_resync=resyncs.append, context=ctx
    )
    dropped = -1
    try:
        with ZmqEventPublisher(pub_ep, context=ctx) as pub:
            upstream = proxy.link()
            # publish until the links are up and the third frame the proxy sees is lost
            for b in make_batches(random.Random(4), 400, ts0=0.0):
                pub.publish(b)
                if upstream.poll(20):
                    frames = upstream.recv_multipart()
                    seq = int.from_bytes(frames[1], "big")
                    if dropped < 0 and proxy.faults["pass"] >= 2:
                        dropped = seq
                    else:
                        proxy.faults["pass"] += 1
                        proxy.pub.send_multipart(frames)
                sub.poll(0.01)
                if dropped >= 0 and any(s > dropped for s in got):
                    break
        assert dropped >= 0 and dropped not in got and got == sorted(set(got))
        first_after = min(s for s in got if s > dropped)
        assert first_after in resyncs  # the gap could not be replayed
    finally:
        sub.close()


def test_a_replay_window_past_the_live_frame_follows_the_live_stream(
    ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    # Live frame 2 arrives first, when the replay only holds 4..5: the answer cannot
    # vouch for frame 2, so the consumer forgets and follows the live stream from 2.
    # A late copy of a seq skipped so (1) is stale; a seq seen live twice (3) is a
    # new publisher run.
    pub_ep, replay_ep, proxy_ep = (f"ipc://{tmp_path}/{n}" for n in ("pub", "replay", "proxy"))
    downstream = ctx.socket(zmq.XPUB)  # XPUB: we see the subscriber's subscription
    downstream.bind(proxy_ep)
    got: list[int] = []
    resyncs: list[int | None] = []
    restarts: list[int] = []
    sub = ZmqEventSubscriber(
        proxy_ep,
        lambda seq, b: got.append(seq),
        replay_endpoint=replay_ep,
        on_resync=resyncs.append,
        on_restart=lambda: restarts.append(1),
        probe_interval=None,
        context=ctx,
    )
    try:
        assert downstream.poll(HANG_MS)
        downstream.recv()  # the subscription: the link is up
        with ZmqEventPublisher(pub_ep, replay_ep, buffer_steps=2, context=ctx) as pub:
            batches = make_batches(random.Random(6), 6, ts0=0.0)
            for b in batches:
                pub.publish(b)
            live = [[b"", k.to_bytes(8, "big"), encode(b)] for k, b in enumerate(batches)]
            end = time.monotonic() + HANG_S
            while _buffered(ctx, replay_ep) != [4, 5]:  # the publisher thread is done
                assert time.monotonic() < end
                time.sleep(0.01)
            downstream.send_multipart(live[2])
            _wait(lambda: got == [2], sub)
            assert resyncs == [2]
            for k in (1, 3, 4, 5):  # 1: skipped by the resync, a late copy
                downstream.send_multipart(live[k])
            _wait(lambda: got == [2, 3, 4, 5], sub)
            assert restarts == [] and sub.next_seq == 6 and sub.stats["duplicates"] == 1
            downstream.send_multipart(live[3])  # seen live already: a new run
            _wait(lambda: restarts == [1], sub)
    finally:
        sub.close()
        downstream.close(linger=0)


def test_replay_answers_without_a_topic_frame(ctx: zmq.Context[Any], tmp_path: Path) -> None:
    # Older vLLM answered [b"", seq, payload] per batch: no topic frame.
    replay_ep = f"ipc://{tmp_path}/replay"
    router = ctx.socket(zmq.ROUTER)
    router.bind(replay_ep)
    batches = make_batches(random.Random(5), 3, ts0=0.0)

    def answer() -> None:
        client, _, start = router.recv_multipart()
        assert start == (0).to_bytes(8, "big")
        for seq, b in enumerate(batches):
            router.send_multipart([client, b"", seq.to_bytes(8, "big"), encode(b)])
        router.send_multipart([client, b"", END_SEQ, b""])

    server = threading.Thread(target=answer)
    server.start()
    got: list[KVEventBatch] = []
    sub = ZmqEventSubscriber(
        f"ipc://{tmp_path}/pub",
        lambda seq, b: got.append(b),
        replay_endpoint=replay_ep,
        context=ctx,
    )
    try:
        assert sub.sync() == 3
        server.join(HANG_S)
        assert [b.ts for b in got] == [0.0, 1.0, 2.0] and sub.next_seq == 3
    finally:
        sub.close()
        router.close(linger=0)


def test_subscriber_decodes_with_the_lenient_decoder(ctx: zmq.Context[Any]) -> None:
    # An SGLang-shaped payload (no lora_name, cache_salt) arrives as vLLM structs.
    import msgspec

    from prefixkv.adapters.events.sglang_wire import SGLangBlockStored, SGLangEventBatch

    payload = msgspec.msgpack.encode(
        SGLangEventBatch(1.0, [SGLangBlockStored([-5], None, [1], 1, None, "GPU", "s")], 0)
    )
    got = EventDecoder().decode(payload)
    # the salt becomes block 0's extra key, where vLLM publishes one
    assert got.events[0] == BlockStored([-5], None, [1], 1, None, "GPU", None, [("s",)])


def test_bad_options(ctx: zmq.Context[Any]) -> None:
    with pytest.raises(TransportError):
        ZmqEventPublisher("tcp://127.0.0.1:*", buffer_steps=-1, context=ctx)
    with pytest.raises(TransportError):
        ZmqEventPublisher("bogus://x", context=ctx)
    with pytest.raises(TransportError):
        ZmqEventSubscriber("bogus://x", lambda s, b: None, context=ctx)


def _wait(done: Callable[[], bool], sub: ZmqEventSubscriber, limit: float = HANG_S) -> None:
    """Poll until ``done()`` (the publisher thread sends asynchronously)."""
    end = time.monotonic() + limit
    while not done():
        assert time.monotonic() < end, "hung"
        sub.poll(0.01)
        time.sleep(0.01)


def _buffered(ctx: zmq.Context[Any], replay_endpoint: str) -> list[int]:
    """The seqs a publisher's replay socket holds (asked from 0)."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    seqs = []
    while dealer.poll(HANG_MS):  # until the end marker
        parts = dealer.recv_multipart()
        if parts[2] == END_SEQ:
            break
        seqs.append(int.from_bytes(parts[2], "big"))
    dealer.close(linger=0)
    return seqs
