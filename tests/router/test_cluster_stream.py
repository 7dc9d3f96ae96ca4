"""Sequenced event streams over a lossy, reordering channel: the tracker converges.

A publisher's batches are dropped, duplicated, delayed and reordered; the replica
restarts (sequence back at 0, cache empty) and its replay window is exceeded; a router
joins mid-stream. After the channel drains and a final sync, the router's view built
from the tracker's deliveries equals the replica's truth.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.events.index import EventIndex, Source
from prefixkv.adapters.events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from prefixkv.adapters.lab.cluster.publisher import EventPublisher
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch, StreamTracker

SRC = Source(0, 0, 0, "GPU")


class FakeReplica:
    """A replica whose cache is a set of hashes; publishes one batch per change."""

    def __init__(self, buffer_steps: int) -> None:
        self.buffer_steps = buffer_steps
        self.restart()

    def restart(self) -> None:
        self.pub = EventPublisher(self.buffer_steps)
        self.held: set[int] = set()

    def step(self, rng: random.Random, t: float) -> SeqBatch:
        events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        if self.held and rng.random() < 0.4:
            h = rng.choice(sorted(self.held))
            self.held.discard(h)
            events.append(BlockRemoved([h], "GPU", group_idx=0))
        elif rng.random() < 0.05:
            self.held.clear()
            events.append(AllBlocksCleared())
        else:
            new = [rng.randrange(1, 1 << 30) for _ in range(rng.randint(1, 3))]
            self.held.update(new)
            events.append(BlockStored(new, None, [], 1, None, "GPU", None, group_idx=0))
        return self.pub.publish(KVEventBatch(ts=t, events=events, data_parallel_rank=0))

    def dump(self) -> Dump:
        stored = BlockStored(sorted(self.held), None, [], 1, None, "GPU", None, group_idx=0)
        payload = self.pub.encode(KVEventBatch(ts=0.0, events=[stored], data_parallel_rank=0))
        return Dump(self.pub.next_seq, [payload])


def make_tracker(replica: FakeReplica, now: list[float]) -> tuple[StreamTracker, EventIndex]:
    view = EventIndex()
    tracker = StreamTracker(
        on_batch=lambda seq, b: view.apply(b, 0),
        replay=lambda start: replica.pub.replay(start, now[0]),
        dump=replica.dump,
        on_restart=lambda: view.clear(0),
        on_resync=lambda: view.clear(0),
    )
    return tracker, view


def test_in_order_delivery_and_duplicates() -> None:
    rep = FakeReplica(100)
    now = [0.0]
    tracker, view = make_tracker(rep, now)
    rng = random.Random(0)
    batches = [rep.step(rng, float(i)) for i in range(5)]
    now[0] = 10.0
    for b in batches:
        tracker.receive(b.seq, b.payload)
    tracker.receive(batches[2].seq, batches[2].payload)
    assert tracker.stats["delivered"] == 5 and tracker.stats["duplicates"] == 1
    assert set(view.blocks(SRC)) == rep.held


def test_gap_is_replayed_and_window_exceeded_resyncs() -> None:
    rep = FakeReplica(4)
    now = [0.0]
    tracker, view = make_tracker(rep, now)
    rng = random.Random(1)
    first = rep.step(rng, 0.0)
    tracker.receive(first.seq, first.payload)
    lost = [rep.step(rng, 1.0) for _ in range(2)]
    last = rep.step(rng, 2.0)
    now[0] = 2.0
    tracker.receive(last.seq, last.payload)  # 2 lost: replayed from the buffer
    assert tracker.stats["gaps"] == 1 and tracker.stats["resyncs"] == 0
    assert tracker.next_seq == last.seq + 1 and lost
    assert set(view.blocks(SRC)) == rep.held
    for _ in range(10):  # 9 lost, buffer of 4: only a resync can help
        last = rep.step(rng, 3.0)
    now[0] = 3.0
    tracker.receive(last.seq, last.payload)
    assert tracker.stats["resyncs"] == 1
    assert set(view.blocks(SRC)) == rep.held


def test_an_undecodable_batch_is_counted_and_resynced_from_a_dump() -> None:
    # Live and in a replay: the batch's events are lost, so the view is rebuilt from
    # the replica's dump, and nothing after it is applied twice.
    rep = FakeReplica(100)
    now = [0.0]
    tracker, view = make_tracker(rep, now)
    rng = random.Random(2)
    batches = [rep.step(rng, float(i)) for i in range(6)]
    now[0] = 10.0
    tracker.receive(batches[0].seq, batches[0].payload)
    tracker.receive(batches[1].seq, b"\xc1")  # corrupted on the way
    assert tracker.stats["bad"] == 1 and tracker.stats["resyncs"] == 1
    assert set(view.blocks(SRC)) == rep.held and tracker.next_seq == 6
    more = [rep.step(rng, 20.0 + i) for i in range(4)]
    rep.pub._buffer[-3] = more[1]._replace(payload=b"\xc1")  # a replay holding a bad batch
    now[0] = 30.0
    tracker.receive(more[-1].seq, more[-1].payload)  # a gap: replayed, hits the bad one
    assert tracker.stats["bad"] == 2 and tracker.stats["resyncs"] == 2
    assert view.blocks(SRC) == dict.fromkeys(rep.held, 1) and tracker.next_seq == 10


def test_restart_is_detected_from_the_sequence() -> None:
    rep = FakeReplica(100)
    now = [0.0]
    tracker, view = make_tracker(rep, now)
    rng = random.Random(2)

    def steps(times: range) -> None:
        for i in times:  # each step's batch arrives at once
            b = rep.step(rng, float(i))
            now[0] = float(i)
            tracker.receive(b.seq, b.payload)

    steps(range(6))
    rep.restart()
    steps(range(6, 8))
    assert tracker.stats["restarts"] == 1
    assert set(view.blocks(SRC)) == rep.held


def test_a_restart_repeating_the_old_runs_first_batches_is_a_restart() -> None:
    # The new run's first batches are byte for byte the old run's (same seed, same
    # timestamps): still a new run, whose cache holds only what it published.
    rep = FakeReplica(100)
    now = [0.0]
    tracker, view = make_tracker(rep, now)
    for run_length in (6, 2):
        rng = random.Random(5)
        rep.restart()
        for i in range(run_length):
            b = rep.step(rng, float(i))
            tracker.receive(b.seq, b.payload)
        assert set(view.blocks(SRC)) == rep.held
    assert tracker.stats["restarts"] == 1


def join_late(
    buffer_steps: int, missed: int, seed: int
) -> tuple[FakeReplica, StreamTracker, EventIndex]:
    """A tracker that starts after ``missed`` batches and then receives the next one."""
    rep = FakeReplica(buffer_steps)
    now = [0.0]
    rng = random.Random(seed)
    for i in range(missed):
        rep.step(rng, float(i))
    tracker, view = make_tracker(rep, now)
    b = rep.step(rng, float(missed))
    now[0] = float(missed)
    tracker.receive(b.seq, b.payload)
    return rep, tracker, view


def test_late_joiner_replays_from_zero() -> None:
    rep, tracker, view = join_late(100, 5, seed=3)
    assert tracker.stats["gaps"] == 1 and tracker.stats["delivered"] == 6
    assert set(view.blocks(SRC)) == rep.held


def test_late_joiner_past_the_replay_window_resyncs() -> None:
    rep, tracker, view = join_late(2, 20, seed=4)
    assert tracker.stats["resyncs"] == 1
    assert set(view.blocks(SRC)) == rep.held


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    drop=st.floats(0, 0.5),
    jitter=st.floats(0, 5),
    buffer_steps=st.integers(2, 50),
    restart_at=st.one_of(st.none(), st.integers(1, 60)),
    join_at=st.integers(0, 40),
)
def test_lossy_reordering_channel_converges(
    seed: int,
    drop: float,
    jitter: float,
    buffer_steps: int,
    restart_at: int | None,
    join_at: int,
) -> None:
    rng = random.Random(seed)
    rep = FakeReplica(buffer_steps)
    now = [0.0]
    tracker, view = make_tracker(rep, now)
    in_flight: list[tuple[float, int, SeqBatch]] = []
    for i in range(80):
        t = float(i)
        if i == restart_at:
            rep.restart()
        b = rep.step(rng, t)
        if rng.random() >= drop:
            in_flight.append((t + rng.uniform(0, jitter), i, b))
            if rng.random() < 0.1:  # a duplicate frame
                in_flight.append((t + rng.uniform(0, jitter), i, b))
        in_flight.sort()
        now[0] = t
        while in_flight and in_flight[0][0] <= t:
            _, _, got = in_flight.pop(0)
            if i >= join_at:  # before that, nobody was listening
                tracker.receive(got.seq, got.payload)
    now[0] = 1e9
    for _, _, got in in_flight:
        tracker.receive(got.seq, got.payload)
    tracker.sync()  # the tail: batches lost after the last one received
    assert set(view.blocks(SRC)) == rep.held
