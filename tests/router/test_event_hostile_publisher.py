"""A hostile publisher against the subscriber and the router's index: never a phantom.

The publisher is played by the test over loopback ZeroMQ sockets (an XPUB for the live
stream, a ROUTER answering replays from a thread), driven by hypothesis: live batches
storing and removing blocks, batches it drops (their seq used, never sent or
buffered, the tail of a burst included), restarts (a new socket at the same address,
the new run's first batches optionally byte for byte the old run's), syncs, and replay
answers that lie: numbered ahead or behind, cut short, with batches past the end
marker's next seq, or malformed. The engine model holds what the current run's
batches leave cached. The invariant, checked after every batch the subscriber
received and after every sync: the index holds no block the engine does not hold.

Waits are bounded by event counts (frames received, subscriptions seen), never by a
deadline the test depends on.
"""

from __future__ import annotations

import itertools
import threading
from array import array
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixkv.adapters.events import BlockRemoved, BlockStored, KVEventBatch, encode
from prefixkv.adapters.events.sockets import END_SEQ
from prefixkv.adapters.router import (
    POLICIES,
    ChainedHashIndex,
    HashScheme,
    RadixBlockIndex,
    Router,
    Worker,
    make_policy,
    parse_policy,
    subscribe,
)

BS = 4
SCHEME = HashScheme.prefixkv(BS, 3)
LIES = ("honest", "vllm", "ahead", "behind", "short", "past_end", "vllm_past_end", "malformed")
"""How a replay answer may lie: ``vllm``: honest, with vLLM's empty end marker (no next
seq); ``ahead``/``behind``: numbered k too high (its next seq too) or too low;
``short``: its last k batches missing; ``past_end``: k batches it never published
after the real ones, past its own next seq; ``vllm_past_end``: the same with vLLM's
marker, so nothing but the live stream contradicts them; ``malformed``: a sequence
frame that is no count."""


class _Cost:
    step_s = 0.0

    def prefill_s(self, num_tokens: int, num_cached: int = 0) -> float:
        return 1e-4 * num_tokens


def _hash(block: int) -> int:
    return SCHEME.block_hashes(array("I", [block] * BS))[0]


def _stored(block: int) -> BlockStored:
    return BlockStored([_hash(block)], None, [block] * BS, BS, None, "GPU", None)


class Pub(NamedTuple):
    """Publish a batch storing ``block`` (or removing it when held and ``remove``);
    ``dropped``: the publisher drops it (seq used, nothing sent or buffered)."""

    block: int
    remove: bool
    dropped: bool


class Restart(NamedTuple):
    """A new run; its first ``identical`` batches repeat the old run's bytes. ``relay``:
    the subscriber's connection stays up (a relay or proxy between them), so it sees
    no reconnection; the new run's first batch then reaches it (a run whose first
    batches are all lost on such a link is found by the quiet probe, not here)."""

    identical: int
    relay: bool = False


class Sync(NamedTuple):
    """The subscriber asks for everything. Answered honestly, the invariant is checked
    after it; otherwise the answer may lie (nothing but a later live batch can
    contradict a lie about batches the live stream never carried), and the next live
    batch received is the check."""

    honest: bool = True


ops = st.lists(
    st.one_of(
        st.builds(Pub, st.integers(1, 4), st.booleans(), st.sampled_from([False] * 4 + [True])),
        st.builds(Restart, st.integers(0, 3), st.booleans()),
        st.builds(Sync, st.booleans()),
    ),
    min_size=1,
    max_size=25,
)
lies = st.lists(st.tuples(st.sampled_from(LIES), st.integers(1, 3)), max_size=12)


class HostilePublisher:
    """The publisher's sockets and runs; replays answered from a thread."""

    def __init__(self, ctx: zmq.Context[Any], folder: Path, lies: list[tuple[str, int]]) -> None:
        self.ctx = ctx
        self.pub_ep = f"ipc://{folder}/pub"
        self.replay_ep = f"ipc://{folder}/replay"
        self.lies: Iterator[tuple[str, int]] = iter(lies)
        self.honest = False  # a sync: answered honestly
        self.lock = threading.Lock()
        self.runs: list[list[tuple[int, bytes, KVEventBatch]]] = [[]]  # per run, published
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.ts = itertools.count()
        self.xpub = self._bind()
        self.replay = ctx.socket(zmq.ROUTER)
        self.replay.bind(self.replay_ep)
        self.stop = threading.Event()
        self.answered: Counter[str] = Counter()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _bind(self) -> zmq.Socket[Any]:
        xpub = self.ctx.socket(zmq.XPUB)
        xpub.bind(self.pub_ep)
        return xpub

    def wait_subscribed(self, sub: Any) -> None:
        """The subscriber's subscription reached this run's socket (the link is up);
        the subscriber polls meanwhile (it reconnects a dropped link itself)."""
        for _ in range(600):
            if self.xpub.poll(100):
                self.xpub.recv()
                return
            sub.poll(0)
        raise AssertionError("no subscriber connected")

    def restart(self, sub: Any, relay: bool) -> None:
        with self.lock:
            self.runs.append([])
            self.buffer = []
            self.next_seq = 0
        if not relay:
            self.xpub.close(linger=0)
            self.xpub = self._bind()
            self.wait_subscribed(sub)

    def publish(self, batch: KVEventBatch, payload: bytes | None, dropped: bool) -> bool:
        """Number ``batch`` (its bytes: ``payload`` or its encoding); send it unless
        ``dropped``. Returns whether it was sent."""
        data = encode(batch) if payload is None else payload
        with self.lock:
            seq = self.next_seq
            self.next_seq += 1
            self.runs[-1].append((seq, data, batch))
            if not dropped:
                self.buffer.append((seq, data))
        if not dropped:
            self.xpub.send_multipart([b"", seq.to_bytes(8, "big"), data])
        return not dropped

    def _answer(self, start: int) -> list[list[bytes]]:
        with self.lock:
            frames = [(s, p) for s, p in self.buffer if s >= start]
            marker = self.next_seq
        lie, k = ("honest", 0) if self.honest else next(self.lies, ("honest", 0))
        self.answered[lie] += 1
        if lie == "ahead":
            frames, marker = [(s + k, p) for s, p in frames], marker + k
        elif lie == "behind":
            frames = [(max(0, s - k), p) for s, p in frames]
        elif lie == "short":
            frames = frames[: max(0, len(frames) - k)]
        elif lie in ("past_end", "vllm_past_end"):  # batches it never published
            fakes = [encode(KVEventBatch(-1.0, [_stored(90 + i)], 0)) for i in range(k)]
            frames = frames + [(marker + i, fake) for i, fake in enumerate(fakes)]
        out = [[b"", b"", s.to_bytes(8, "big"), p] for s, p in frames]
        if lie == "malformed":
            out.insert(0, [b"", b"", b"\x01\x02", b"x"])
        vllm = lie in ("vllm", "vllm_past_end")
        out.append([b"", b"" if vllm else marker.to_bytes(8, "big"), END_SEQ, b""])
        return out

    def _serve(self) -> None:
        try:
            self._serve_until_stopped()
        except BaseException as e:  # raised by close(), in the test's thread
            self.failure = e

    def _serve_until_stopped(self) -> None:
        while not self.stop.is_set():
            if not self.replay.poll(20):
                continue
            parts = self.replay.recv_multipart()
            if len(parts) != 3 or len(parts[2]) != 8:
                continue
            client = parts[0]
            for message in self._answer(int.from_bytes(parts[2], "big")):
                self.replay.send_multipart([client, *message])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.xpub.close(linger=0)
        self.replay.close(linger=0)
        if self.failure is not None:
            raise self.failure


class Engine:
    """What the current run holds: block hash -> copies."""

    def __init__(self) -> None:
        self.held: Counter[int] = Counter()

    def apply(self, batch: KVEventBatch) -> None:
        for event in batch.events:
            if isinstance(event, BlockStored):
                self.held.update(event.block_hashes)
            else:
                assert isinstance(event, BlockRemoved)
                self.held.subtract(event.block_hashes)


def run_program(
    ctx: zmq.Context[Any], folder: Path, program: list[Any], lie_list: list[Any], radix: bool
) -> list[str]:
    """Drive one program; the violations of the invariant, one line each."""
    index = RadixBlockIndex(SCHEME) if radix else ChainedHashIndex(SCHEME)
    router = Router(make_policy(parse_policy("llmd", tuple(POLICIES))), index, SCHEME, _Cost())
    publisher = HostilePublisher(ctx, folder, lie_list)
    sub = subscribe(
        router,
        0,
        publisher.pub_ep,
        replay_endpoint=publisher.replay_ep,
        probe_interval=None,
        replay_timeout=30.0,  # an answer comes in microseconds; this only bounds a hang
        context=ctx,
    )
    engine = Engine()
    violations: list[str] = []
    sent = 0
    replaying: list[bytes] = []  # the old run's payloads a restart repeats
    must_send = False  # the new run's first batch over a relay reaches the subscriber

    def check(step: int, op: object) -> None:
        held = index.held(Worker(0))
        phantom = sorted(h for h, n in held.items() if n > 0 and engine.held[h] <= 0)
        if phantom:
            violations.append(
                f"step {step} {op}: index holds {len(phantom)} block(s) never/no longer held"
            )

    def received() -> bool:
        """Whether the frame just sent reached the subscriber. A frame sent while the
        subscriber's link was still coming back after a restart is lost on the way
        (ZeroMQ's slow joiner), as a dropped one is: the subscriber learns of it from a
        later gap or a sync, and the step is then not checked (an engine's removal the
        subscriber cannot have seen yet is no phantom of its making)."""
        for _ in range(100):  # each poll returns as soon as a frame arrives
            if sub.num_live_frames >= sent:
                return True
            sub.poll(0.05)
        return sub.num_live_frames >= sent

    try:
        publisher.wait_subscribed(sub)
        for step, op in enumerate(program):
            if isinstance(op, Restart):
                old = [p for _, p, _ in publisher.runs[-1]]
                replaying = old[: op.identical]
                publisher.restart(sub, op.relay)
                engine = Engine()
                must_send = op.relay
            elif isinstance(op, Sync):
                publisher.honest = op.honest
                sub.sync()
                publisher.honest = False
                if op.honest:
                    check(step, op)
            else:
                if replaying:
                    payload = replaying.pop(0)
                    batch = next(b for _, p, b in publisher.runs[-2] if p == payload)
                else:
                    payload = None
                    h = _hash(op.block)
                    if op.remove and engine.held[h] > 0:
                        event: Any = BlockRemoved([h], "GPU")
                    else:
                        event = _stored(op.block)
                    batch = KVEventBatch(float(next(publisher.ts)), [event], 0)
                engine.apply(batch)
                if publisher.publish(batch, payload, op.dropped and not must_send):
                    must_send = False
                    sent += 1
                    if received():
                        check(step, op)
                    else:
                        sent = sub.num_live_frames  # lost on the way: count from here
    finally:
        sub.close()
        publisher.close()
    return violations


_folders = itertools.count()


@pytest.fixture(scope="module")
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(program=ops, lie_list=lies, radix=st.booleans())
def test_the_index_never_holds_a_block_the_engine_does_not(
    ctx: zmq.Context[Any], tmp_path: Path, program: list[Any], lie_list: list[Any], radix: bool
) -> None:
    folder = tmp_path / str(next(_folders))
    folder.mkdir()
    assert run_program(ctx, folder, program, lie_list, radix) == []


@pytest.mark.parametrize(
    ("name", "program", "lie_list"),
    [
        # (a) an answer numbered ahead: its batches under the wrong seqs, then the live
        # batches it claimed dropped as duplicates
        ("ahead", [Pub(1, False, True), Pub(2, False, False), Pub(1, True, False)], [("ahead", 1)]),
        (
            "a sync answer past the live stream",
            [Pub(1, False, False), Sync(honest=False), Pub(1, True, False)],
            [("vllm_past_end", 1)],
        ),
        (
            "past the live stream",
            [Pub(1, False, False), Pub(2, False, True), Pub(3, False, False), Pub(4, False, False)],
            [("vllm_past_end", 2)],
        ),
        # (b) a restart whose first batches repeat the old run's bytes
        (
            "identical restart",
            [Pub(1, False, False), Pub(2, False, False), Restart(1), Pub(3, False, False)],
            [],
        ),
        (
            "identical restart behind a relay",
            [
                Pub(1, False, False),
                Pub(2, False, False),
                Restart(1, relay=True),
                Pub(3, False, False),
            ],
            [],
        ),
        # (c) a batch dropped at the tail of a burst: only the end marker tells
        ("tail drop", [Pub(1, False, False), Pub(1, True, True), Sync()], []),
        # a new run that dropped its first batch: its next seq passes our last one,
        # which it does not hold
        ("new run past us", [Pub(1, False, False), Restart(0), Pub(2, False, True), Sync()], []),
    ],
)
def test_the_three_defects(
    ctx: zmq.Context[Any], tmp_path: Path, name: str, program: list[Any], lie_list: list[Any]
) -> None:
    for radix in (False, True):
        folder = tmp_path / f"{radix}"
        folder.mkdir()
        assert run_program(ctx, folder, program, lie_list, radix) == [], name
