"""EventIndex: block hashes per source rebuilt from KV events.

The strongest check replays the recorded engine streams (``tests/data/events``): after
every batch, the index fed only by the events equals what vLLM's prefix cache /
SGLang's radix tree actually held at that moment (hash and copy count).
"""

from __future__ import annotations

import base64
import json
from collections import Counter

import pytest
from helpers import ROOT, TEST_DATA
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.events.codec import EventDecoder
from prefixkv.adapters.events.index import EventIndex, Source
from prefixkv.adapters.events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)

DATA = TEST_DATA / "events"


def stored(hashes: list[int], parent: int | None = None, group: int = 0) -> BlockStored:
    return BlockStored(hashes, parent, [0] * 2 * len(hashes), 2, None, "GPU", None, group_idx=group)


def removed(hashes: list[int], group: int = 0) -> BlockRemoved:
    return BlockRemoved(hashes, "GPU", group_idx=group)


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared, rank: int = 0) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events), data_parallel_rank=rank)


A = Source("a", 0, 0, "GPU")
B = Source("b", 0, 0, "GPU")


@pytest.mark.parametrize(
    "name",
    ["vllm_sha256_cbor.jsonl", "vllm_sha256.jsonl", "sglang_page1.jsonl", "sglang_page4.jsonl"],
)
def test_index_follows_the_engines_cache_after_every_batch(name: str) -> None:
    lines = [json.loads(x) for x in (DATA / name).read_text().splitlines()[1:]]
    index, dec = EventIndex(), EventDecoder()
    for line in lines:
        b = dec.decode(base64.b64decode(line["msgpack"]))
        index.apply(b, "replica-0")
        held: Counter[int | bytes] = Counter()
        for source in index.sources():
            held.update(index.blocks(source))
        assert dict(held) == {h: n for h, n in line["cached"]}, f"after seq {line['seq']}"
    assert len(index) == 0  # the streams end with AllBlocksCleared
    if name.startswith("vllm"):
        # vLLM caches duplicate blocks: one hash held twice, removed once at a time
        assert any(n > 1 for line in lines for _, n in line["cached"])


def test_longest_prefix_per_source() -> None:
    index = EventIndex()
    index.apply(batch(stored([1, 2, 3, 4])), "a")
    index.apply(batch(stored([1, 2]), stored([9], parent=2)), "b")
    assert index.match([1, 2, 3, 4, 5]) == {A: 4, B: 2}
    assert index.match([1, 2, 9]) == {A: 2, B: 3}
    assert index.match([7, 1]) == {}
    assert index.match([]) == {}
    index.apply(batch(removed([3])), "a")  # a hole ends a's run
    assert index.match([1, 2, 3, 4]) == {A: 2, B: 2}


def test_copies_are_counted() -> None:
    index = EventIndex()
    index.apply(batch(stored([1, 2]), stored([1, 2])), "a")
    index.apply(batch(removed([2])), "a")
    assert index.blocks(A) == {1: 2, 2: 1}
    assert index.match([1, 2]) == {A: 2}
    index.apply(batch(removed([2])), "a")
    assert index.match([1, 2]) == {A: 1}
    once = EventIndex(count_copies=False)
    once.apply(batch(stored([1]), stored([1]), removed([1])), "a")
    assert once.match([1]) == {}


def test_unknown_removals_are_counted_not_fatal() -> None:
    index = EventIndex()
    index.apply(batch(removed([5, 6]), stored([1]), removed([1, 1])), "a")
    assert index.num_unknown_removals == 3
    assert len(index) == 0 and index.sources() == []


def test_all_blocks_cleared_is_per_replica_and_rank() -> None:
    index = EventIndex()
    index.apply(batch(stored([1]), stored([7], group=1)), "a")
    index.apply(batch(stored([1]), rank=1), "a")
    index.apply(batch(stored([1])), "b")
    index.apply(batch(AllBlocksCleared()), "a")  # rank 0 of a: both groups
    assert set(index.match([1])) == {Source("a", 1, 0, "GPU"), B}
    assert index.match([7]) == {}
    index.clear("a")  # an engine restart: every rank
    assert set(index.match([1])) == {B}


def test_mediums_and_groups_are_separate_sources() -> None:
    index = EventIndex()
    cpu = BlockStored([1, 2], None, [0] * 4, 2, None, "CPU", None, group_idx=0)
    index.apply(batch(stored([1, 2]), cpu, removed([2])), "a")
    assert index.match([1, 2]) == {A: 1, Source("a", 0, 0, "CPU"): 2}


ops = st.lists(
    st.tuples(
        st.sampled_from(["store", "remove", "clear"]),
        st.sampled_from(["a", "b"]),
        st.lists(st.integers(0, 6), max_size=5),
    ),
    max_size=40,
)


@given(ops, st.lists(st.integers(0, 6), max_size=6))
def test_matches_a_reference_model(
    steps: list[tuple[str, str, list[int]]], query: list[int]
) -> None:
    index = EventIndex()
    ref: dict[str, Counter[int]] = {"a": Counter(), "b": Counter()}
    for op, replica, hashes in steps:
        if op == "store":
            index.apply(batch(stored(hashes)), replica)
            ref[replica].update(hashes)
        elif op == "remove":
            index.apply(batch(removed(hashes)), replica)
            for h in hashes:
                if ref[replica][h] > 0:
                    ref[replica][h] -= 1
        else:
            index.apply(batch(AllBlocksCleared()), replica)
            ref[replica].clear()
    expected = {}
    for replica, held in ref.items():
        n = 0
        while n < len(query) and held[query[n]] > 0:
            n += 1
        if n:
            expected[Source(replica, 0, 0, "GPU")] = n
    assert index.match(query) == expected
    for replica, held in ref.items():
        assert index.blocks(Source(replica, 0, 0, "GPU")) == +held


def test_benchmark_script_runs() -> None:
    import subprocess
    import sys

    cmd = [sys.executable, "benchmarks/event_index.py", "--block-events", "3000", "--repeat", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["block_events"] >= 3000
