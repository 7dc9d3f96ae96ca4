"""Cluster indexes fed by synthetic KV-event streams: exact scenarios and a property.

The property drives a model fleet (per worker, the chained hashes it holds, with
copies) through random stores of valid chains, removals of any held block, clears
and forgets, and checks after every step that both event-fed indexes answer every
query exactly as the model does (longest run of leading hashes held).
"""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from prefixkv.adapters.router.approx import ApproxIndex
from prefixkv.adapters.router.block_tree import RadixBlockIndex
from prefixkv.adapters.router.cluster_index import ChainedHashIndex, ClusterIndex
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.adapters.router.keys import HashScheme, RouteKeys, Worker

BS = 4
SCHEME = HashScheme.prefixkv(BS, seed=1)


def tokens_of(blocks: list[int]) -> array[int]:
    """A prompt whose block i is ``[blocks[i]] * BS`` (content ids repeat freely)."""
    out = array("I")
    for b in blocks:
        out.extend([b + 1] * BS)
    return out


def stored(
    blocks: list[int], start: int, end: int, scheme: HashScheme = SCHEME, block_size: int = BS
) -> BlockStored:
    """The BlockStored an engine emits for blocks ``start..end-1`` of a prompt."""
    toks = tokens_of(blocks)
    hashes = scheme.block_hashes(toks)
    return BlockStored(
        block_hashes=hashes[start:end],
        parent_block_hash=hashes[start - 1] if start else None,
        token_ids=toks[start * BS : end * BS].tolist(),
        block_size=block_size,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=0,
    )


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared, rank: int = 0) -> KVEventBatch:
    return KVEventBatch(ts=0.0, events=list(events), data_parallel_rank=rank)


def keys(blocks: list[int]) -> RouteKeys:
    return RouteKeys(tokens_of(blocks), SCHEME)


def removed(*hashes: int) -> BlockRemoved:
    return BlockRemoved(list(hashes), "GPU", group_idx=0)


EVENT_FED = [ChainedHashIndex, RadixBlockIndex]


@pytest.mark.parametrize("cls", EVENT_FED)
def test_longest_prefix_per_worker(cls: type) -> None:
    idx = cls(SCHEME)
    assert isinstance(idx, ClusterIndex)
    idx.apply(0, batch(stored([1, 2, 3], 0, 3)), 0.0)
    idx.apply(1, batch(stored([1, 2, 9], 0, 3)), 0.0)
    idx.apply(2, batch(stored([5], 0, 1)), 0.0)
    w0, w1 = Worker(0), Worker(1)
    assert idx.match(keys([1, 2, 3, 4]), 0.0) == {w0: 3, w1: 2}
    assert idx.match(keys([1, 7]), 0.0) == {w0: 1, w1: 1}
    assert idx.match(keys([7]), 0.0) == {}
    assert idx.match(keys([]), 0.0) == {}
    # a chain continued by a later event (parent = block 2's hash)
    idx.apply(1, batch(stored([1, 2, 9, 4], 3, 4)), 0.0)
    assert idx.match(keys([1, 2, 9, 4]), 0.0) == {w0: 2, w1: 4}
    assert idx.num_blocks(w1) == 4


@pytest.mark.parametrize("cls", EVENT_FED)
def test_removals_copies_and_clears(cls: type) -> None:
    idx = cls(SCHEME)
    h = SCHEME.block_hashes(tokens_of([1, 2]))
    # vLLM duplicates: the same block computed twice is stored (and removed) twice
    idx.apply(0, batch(stored([1, 2], 0, 2), stored([1, 2], 0, 2)), 0.0)
    idx.apply(0, batch(removed(h[1])), 0.0)
    assert idx.match(keys([1, 2]), 0.0) == {Worker(0): 2}
    idx.apply(0, batch(removed(h[1])), 0.0)
    assert idx.match(keys([1, 2]), 0.0) == {Worker(0): 1}
    idx.apply(0, batch(removed(h[1])), 0.0)  # not held any more: counted, ignored
    assert idx.stats()["unknown_removals"] == 1
    # rank 1 of the same replica is another worker; AllBlocksCleared clears one rank
    idx.apply(0, batch(stored([1], 0, 1), rank=1), 0.0)
    idx.apply(0, batch(AllBlocksCleared(), rank=0), 0.0)
    assert idx.match(keys([1, 2]), 0.0) == {Worker(0, 1): 1}
    assert idx.held(Worker(0, 1)) == {h[0]: 1}
    idx.forget(0)
    assert idx.match(keys([1]), 0.0) == {}
    assert idx.held(Worker(0, 1)) == {}


@pytest.mark.parametrize("cls", EVENT_FED)
def test_block_size_mismatch_is_refused_and_surfaced(cls: type) -> None:
    idx = cls(SCHEME)
    idx.apply(3, batch(stored([1, 2], 0, 2, block_size=8)), 0.0)
    assert "block_size 8" in idx.incompatible[3]
    assert idx.match(keys([1, 2]), 0.0) == {}
    # later events of that replica are refused too, until it is forgotten
    idx.apply(3, batch(stored([1, 2], 0, 2)), 0.0)
    assert idx.match(keys([1, 2]), 0.0) == {}
    assert idx.stats()["refused_block_events"] == 4
    idx.forget(3)
    idx.apply(3, batch(stored([1, 2], 0, 2)), 0.0)
    assert idx.match(keys([1, 2]), 0.0) == {Worker(3): 2}


def test_chained_index_detects_a_replica_hashing_differently() -> None:
    other = HashScheme.prefixkv(BS, seed=99)
    idx = ChainedHashIndex(SCHEME)
    idx.apply(0, batch(stored([1, 2], 0, 2)), 0.0)
    idx.apply(1, batch(stored([1, 2], 0, 2, scheme=other)), 0.0)
    assert 1 in idx.incompatible and 0 not in idx.incompatible
    assert "hash" in idx.incompatible[1]
    assert idx.match(keys([1, 2]), 0.0) == {Worker(0): 2}


def test_radix_index_follows_a_replica_hashing_differently() -> None:
    # Dynamo's design: children keyed by content, engine hashes only link parents.
    other = HashScheme.prefixkv(BS, seed=99)
    idx = RadixBlockIndex(SCHEME)
    idx.apply(1, batch(stored([1, 2], 0, 1, scheme=other)), 0.0)
    idx.apply(1, batch(stored([1, 2], 1, 2, scheme=other)), 0.0)
    assert idx.match(keys([1, 2, 3]), 0.0) == {Worker(1): 2}
    h = other.block_hashes(tokens_of([1, 2]))
    idx.apply(1, batch(removed(h[0])), 0.0)
    assert idx.match(keys([1, 2]), 0.0) == {}
    assert idx.incompatible == {}


def test_radix_index_skips_a_chain_whose_parent_it_never_saw() -> None:
    idx = RadixBlockIndex(SCHEME)
    idx.apply(0, batch(stored([1, 2, 3], 1, 3)), 0.0)  # block 0's event was lost
    assert idx.stats()["orphan_blocks"] == 2
    assert idx.match(keys([1, 2, 3]), 0.0) == {}
    assert idx.stats()["entries"] == 0


def test_radix_prunes_nodes_nobody_holds() -> None:
    idx = RadixBlockIndex(SCHEME)
    h = SCHEME.block_hashes(tokens_of([1, 2, 3]))
    idx.apply(0, batch(stored([1, 2, 3], 0, 3)), 0.0)
    assert idx.stats()["entries"] == 3
    idx.apply(0, batch(removed(h[2]), removed(h[1])), 0.0)
    assert idx.stats()["entries"] == 1
    idx.apply(0, batch(AllBlocksCleared()), 0.0)
    assert idx.stats()["entries"] == 0


# ---------------------------------------------------------------- property

DOCS = [[1, 2, 3, 4], [1, 2, 5], [1, 6, 3], [7, 2, 3, 4, 2], [1, 2, 3, 8]]

op = st.one_of(
    st.tuples(
        st.just("store"),
        st.integers(0, 2),
        st.integers(0, len(DOCS) - 1),
        st.integers(0, 4),
        st.integers(1, 5),
    ),
    st.tuples(st.just("remove"), st.integers(0, 2), st.integers(0, 99)),
    st.tuples(st.just("clear"), st.integers(0, 2)),
    st.tuples(st.just("forget"), st.integers(0, 2)),
)


@settings(max_examples=60)
@given(st.lists(op, max_size=40))
def test_event_fed_indexes_answer_like_the_model(ops: list[tuple[object, ...]]) -> None:
    model: dict[int, dict[int, int]] = {r: {} for r in range(3)}
    indexes = [ChainedHashIndex(SCHEME), RadixBlockIndex(SCHEME)]
    doc_hashes = [SCHEME.block_hashes(tokens_of(d)) for d in DOCS]
    for o in ops:
        kind, r = o[0], o[1]
        assert isinstance(r, int)
        held = model[r]
        b: KVEventBatch | None = None
        if kind == "store":
            _, _, d, start, n = o
            assert isinstance(d, int) and isinstance(start, int) and isinstance(n, int)
            hashes = doc_hashes[d]
            start = min(start, len(hashes) - 1)
            # an engine stores a chain whose parent it holds
            while start and hashes[start - 1] not in held:
                start -= 1
            end = min(len(hashes), start + n)
            b = batch(stored(DOCS[d], start, end))
            for h in hashes[start:end]:
                held[h] = held.get(h, 0) + 1
        elif kind == "remove" and held:
            _, _, pick = o
            assert isinstance(pick, int)
            h = sorted(held)[pick % len(held)]
            held[h] -= 1
            if not held[h]:
                del held[h]
            b = batch(removed(h))
        elif kind == "clear":
            held.clear()
            b = batch(AllBlocksCleared())
        elif kind == "forget":
            held.clear()
            for idx in indexes:
                idx.forget(r)
        for idx in indexes:
            if b is not None:
                idx.apply(r, b, 0.0)
            for rr in range(3):
                assert idx.held(Worker(rr)) == model[rr], idx.kind
            for d, hashes in enumerate(doc_hashes):
                expect = {}
                for rr in range(3):
                    n = 0
                    while n < len(hashes) and hashes[n] in model[rr]:
                        n += 1
                    if n:
                        expect[Worker(rr)] = n
                assert idx.match(keys(DOCS[d]), 0.0) == expect, (idx.kind, d)


# ---------------------------------------------------------------- approximate


def test_approx_index_learns_from_decisions_and_expires() -> None:
    idx = ApproxIndex(ttl=10.0)
    assert isinstance(idx, ClusterIndex)
    idx.apply(0, batch(stored([1, 2], 0, 2)), 0.0)  # events are not read
    assert idx.match(keys([1, 2]), 0.0) == {}
    idx.on_routed(Worker(0), keys([1, 2, 3]), 0.0)
    idx.on_routed(Worker(1), keys([1, 5]), 5.0)
    assert idx.match(keys([1, 2, 4]), 6.0) == {Worker(0): 2, Worker(1): 1}
    # worker 0's entries expire at t = 10; block 1 was refreshed on worker 1 at t = 5
    assert idx.match(keys([1, 2, 4]), 10.0) == {Worker(1): 1}
    idx.on_routed(Worker(0), keys([1]), 11.0)  # refresh
    assert idx.match(keys([1, 2]), 14.9) == {Worker(0): 1, Worker(1): 1}
    assert idx.match(keys([1, 2]), 21.0) == {}
    assert idx.stats()["entries"] == 0


def test_approx_index_cap_and_forget() -> None:
    idx = ApproxIndex(ttl=None, max_blocks=2)
    idx.on_routed(Worker(0), keys([1, 2, 3]), 0.0)  # the oldest entry (block 0) goes
    assert idx.num_blocks(Worker(0)) == 2
    assert idx.match(keys([1, 2, 3]), 1e9) == {}
    idx.on_routed(Worker(0), keys([1]), 1.0)  # block 0 back in; now block 1 is the oldest
    assert idx.match(keys([1, 2, 3]), 1e9) == {Worker(0): 1}
    assert idx.num_blocks(Worker(0)) == 2
    idx.forget(0)
    assert idx.match(keys([1]), 0.0) == {} and idx.held(Worker(0)) == {}
    with pytest.raises(ClusterSettingsError):
        ApproxIndex(ttl=0)
    with pytest.raises(ClusterSettingsError):
        ApproxIndex(max_blocks=0)
