"""The indexes' KV events, byte for byte those of the real engines on the recorded trace.

``tests/data/events`` holds what vLLM 0.33's ``KVCacheManager`` (sha256_cbor and sha256,
``PYTHONHASHSEED=0``) and SGLang 0.5.23's ``RadixCache`` (page sizes 1 and 4) published
for one trace in the K-live schedule (``tests/engines/recorders/record_kv_event_fixtures.py``).
Here prefixkv's hash chain behind its vLLM KVCacheManager, and its radix tree behind the
SGLang prefix cache, replay the same trace in the same schedule with a recorder attached to
the index; every batch must encode to the engine's payload. The steps line up too, so
even the timestamps (a virtual clock, 1 ms per step) agree.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import pytest
from helpers import TEST_DATA
from kv_event_drivers import SGLangDriver, VllmDriver, attach_recorder, run_k_live

from prefixkv.adapters.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecoder,
    EventsUnsupportedError,
    SGLangEventRecorder,
    VllmEventRecorder,
    attach_event_recorder,
    encode,
    from_sglang,
    make_event_recorder,
)
from prefixkv.adapters.events.sglang_recorder import SGLangEventRecorder as _Recorder
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.vllm import KVCacheManager
from prefixkv.indexes import (
    HashChainIndex,
    IndexWrapper,
    NoPrefixIndex,
    RadixIndex,
    SynchronizedIndex,
    TokenKey,
    make_index,
)
from prefixkv.indexes.registry import pool_owned_options
from prefixkv.indexes.vllm_hashing import to_external_block_hash

DATA = TEST_DATA / "events"
SETTINGS: dict[str, Any] = json.loads((DATA / "settings.json").read_text())
TRACE = [json.loads(line) for line in (DATA / "trace.jsonl").read_text().splitlines()]
T0 = 1_700_000_000.0


def recorded(name: str) -> tuple[dict[str, Any], list[bytes]]:
    """The fixture's header and its payloads, in publication order."""
    lines = (DATA / name).read_text().splitlines()
    return json.loads(lines[0])["header"], [
        base64.b64decode(json.loads(line)["msgpack"]) for line in lines[1:]
    ]


def published(driver: Any, cache: Any, take_batch: Callable[[float, int], Any]) -> list[Any]:
    """The fixture trace through ``cache``, driven and reset as the recorders did; the
    batches ``take_batch`` gave at the end of each step (at ``T0 + step / 1000``, with
    the settings' rank)."""
    batches: list[Any] = []
    step = 0

    def end_step() -> None:
        nonlocal step
        batch = take_batch(T0 + step / 1000, SETTINGS["data_parallel_rank"])
        if batch is not None:
            batches.append(batch)
        step += 1

    d = driver(cache, end_step)
    run_k_live(d, TRACE, SETTINGS["concurrency"])
    assert d.reset()
    return batches


def first_difference(ours: list[bytes], theirs: list[bytes]) -> str:
    dec = EventDecoder()
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return f"batch {i}: ours {dec.decode(a)!r:.400} theirs {dec.decode(b)!r:.400}"
    return f"{len(ours)} batches, the engine published {len(theirs)}"


@pytest.mark.parametrize("algo", ["sha256_cbor", "sha256"])
def test_hash_chain_publishes_vllms_batches(algo: str) -> None:
    header, theirs = recorded(f"vllm_{algo}.jsonl")
    bs = SETTINGS["block_size"]
    seed = header["none_hash_seed"]  # PYTHONHASHSEED
    index = make_index("hash_chain", block_size=bs, hash_algorithm=algo, seed=seed)
    cache = KVCacheManager(  # vLLM's num_gpu_blocks, the null block 0 included
        index, SETTINGS["vllm_num_blocks"], enable_kv_cache_events=True
    )
    recorder = attach_recorder(cache)
    ours = [encode(b) for b in published(VllmDriver, cache, recorder.take_batch)]
    assert ours == theirs, first_difference(ours, theirs)


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_tree_publishes_sglangs_batches(page_size: int) -> None:
    _, theirs = recorded(f"sglang_page{page_size}.jsonl")
    index = make_index("radix", block_size=page_size, **pool_owned_options("radix"))
    recorder = make_event_recorder(index)
    assert isinstance(recorder, SGLangEventRecorder)
    index.set_event_sink(recorder)  # type: ignore[attr-defined]
    cache = PrefixCache.create_simulated(index, SETTINGS["capacity_tokens"])
    batches = published(SGLangDriver, cache, recorder.take_sglang_batch)
    ours = [encode(b) for b in batches]
    assert ours == theirs, first_difference(ours, theirs)
    # take_events gives the same events as vLLM structs, as a router's decoder reads them
    dec = EventDecoder()
    assert [from_sglang(b) for b in batches] == [dec.decode(p) for p in theirs]


def test_sglang_recorder_take_events_reads_as_the_decoder_does() -> None:
    index = RadixIndex(2)
    recorder = attach_event_recorder(index)
    index.insert(TokenKey([1, 2, 3, 4], (("cache_salt", "s"),)), [0, 1])
    events = recorder.take_events()
    assert [type(e) for e in events] == [AllBlocksCleared, BlockStored]
    stored = events[1]
    assert isinstance(stored, BlockStored)
    assert stored.token_ids == [1, 2, 3, 4] and stored.block_size == 2
    assert all(-(2**63) <= h < 2**63 for h in stored.block_hashes)  # type: ignore[operator]
    assert recorder.take_events() == []


def test_recorders_follow_the_dialect_the_index_declares() -> None:
    assert isinstance(make_event_recorder(HashChainIndex(4)), VllmEventRecorder)
    assert isinstance(make_event_recorder(NoPrefixIndex(4)), VllmEventRecorder)
    assert isinstance(make_event_recorder(RadixIndex(4)), _Recorder)

    class Mute:
        block_size = 4

    with pytest.raises(EventsUnsupportedError, match="Mute reports no KV events"):
        make_event_recorder(Mute())

    class Klingon(IndexWrapper):  # a wrapper: the compiled build's classes are final
        kv_event_dialect = "klingon"

    with pytest.raises(EventsUnsupportedError, match="'klingon'"):
        make_event_recorder(Klingon(HashChainIndex(4)))


def wire_blocks(index: HashChainIndex) -> list[int]:
    return sorted(to_external_block_hash(d) for d in index.cached_block_hashes())


def test_hash_chain_events_follow_its_entries() -> None:
    index = HashChainIndex(2, seed=0)
    recorder = attach_event_recorder(index)
    a = TokenKey([1, 2, 3, 4, 5])
    r = index.insert(a, [10, 11, 12])  # two full blocks; the partial third is not cached
    (stored,) = recorder.take_events()
    hashes = a.block_hashes(index.hasher)
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == [to_external_block_hash(h) for h in hashes]
    assert stored.parent_block_hash is None and stored.token_ids == [1, 2, 3, 4]
    # a decode step registers one block, chained to the last one
    index.lock(r.handle)
    a.append([6])
    r2 = index.insert(a, [10, 11, 12], prefix=r.handle)
    index.relock(r.handle, r2.handle)
    (more,) = recorder.take_events()
    assert isinstance(more, BlockStored)
    assert more.parent_block_hash == to_external_block_hash(hashes[1])
    assert more.token_ids == [5, 6]
    # evict_blocks drops a locked block's entry: one BlockRemoved; its unlock says nothing
    index.evict_blocks([11])
    assert recorder.take_events() == [
        BlockRemoved([to_external_block_hash(hashes[1])], "GPU", group_idx=0)
    ]
    assert index.unlock(r2.handle) == [11]
    assert recorder.take_events() == []
    # eviction: one BlockRemoved per block, LRU first (the tail of a release first)
    assert sorted(index.evict(5)) == [10, 12]
    removed = recorder.take_events()
    assert [e.block_hashes for e in removed] == [  # type: ignore[union-attr]
        [to_external_block_hash(hashes[2])],
        [to_external_block_hash(hashes[0])],
    ]
    index.reset()
    assert recorder.take_events() == [AllBlocksCleared()]
    assert wire_blocks(index) == []


def test_hash_chain_announces_duplicates_and_each_run() -> None:
    index = HashChainIndex(2, seed=0)
    recorder = attach_event_recorder(index)
    index.insert(TokenKey([1, 2, 3, 4]), [0, 1])
    index.insert(TokenKey([1, 2, 3, 4]), [2, 3])  # computed twice: vLLM caches both
    first, second = recorder.take_events()
    assert first.block_hashes == second.block_hashes  # type: ignore[union-attr]
    assert len(wire_blocks(index)) == 4
    # registering only blocks the index holds already announces nothing
    index.insert(TokenKey([1, 2, 3, 4]), [0, 1])
    assert recorder.take_events() == []
    # a block in the middle already cached under this hash: two runs, each chained
    key = TokenKey([1, 2, 3, 4, 5, 6, 7, 8])
    index.insert(key, [4, 1, 5, 6])
    runs = recorder.take_events()
    h = [to_external_block_hash(d) for d in key.block_hashes(index.hasher)]
    assert [(e.block_hashes, e.parent_block_hash) for e in runs] == [  # type: ignore[union-attr]
        ([h[0]], None),
        ([h[2], h[3]], h[1]),
    ]


def test_without_a_sink_nothing_is_reported_and_detaching_stops_reports() -> None:
    for index in (HashChainIndex(2, seed=0), RadixIndex(2)):
        recorder = (
            make_event_recorder(index, announce_start=False)
            if isinstance(index, RadixIndex)
            else make_event_recorder(index)
        )
        index.insert(TokenKey([1, 2, 3, 4]), [0, 1])  # no sink yet
        index.set_event_sink(recorder)
        index.set_event_sink(None)
        index.evict(10)
        index.reset()
        assert recorder.take_events() == []


def test_radix_computes_page_hashes_for_nodes_cached_before_the_sink() -> None:
    # Nodes inserted (and split) without a sink get SGLang's digests when first needed.
    late, early = RadixIndex(2), RadixIndex(2)
    early_rec = attach_event_recorder(early, announce_start=False)
    for tree in (late, early):
        tree.insert(TokenKey([1, 2, 3, 4, 5, 6]), [0, 1, 2])
        tree.insert(TokenKey([1, 2, 3, 4, 7, 8]), [3, 4, 5])  # splits the first node
    late_rec = attach_event_recorder(late, announce_start=False)
    early_rec.take_events()
    assert sorted(late.cached_block_hashes()) == sorted(early.cached_block_hashes())
    late.evict(10)
    early.evict(10)
    assert late_rec.take_events() == early_rec.take_events()


def test_no_prefix_index_reports_resets_only() -> None:
    index = NoPrefixIndex(4)
    recorder = attach_event_recorder(index)
    index.insert(TokenKey([1, 2, 3, 4]), [0])
    index.reset()
    assert recorder.take_events() == [AllBlocksCleared()]


def test_wrapped_indexes_report_through_their_wrapper() -> None:
    for inner in (HashChainIndex(2, seed=0), RadixIndex(2)):
        wrapped = SynchronizedIndex(inner)
        recorder = attach_event_recorder(wrapped)
        assert type(recorder) is type(make_event_recorder(inner))
        wrapped.insert(TokenKey([1, 2, 3, 4]), [0, 1])
        assert isinstance(recorder.take_events()[-1], BlockStored)
