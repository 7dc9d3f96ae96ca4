"""The hash chain under a caller that owns the block pool: the duplicate-id check it
may skip, and the O(1) evictable count a manager reads when free blocks run short."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters import CacheManager
from prefixkv.adapters.vllm import KVCacheManager
from prefixkv.indexes import (
    BlockOwnershipError,
    HashChainIndex,
    PrefixKVError,
    TokenKey,
    describe_index,
)
from prefixkv.indexes.registry import pool_owned_options
from prefixkv.storage import BlockAllocator


def toks(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 32000) for _ in range(n)]


def test_a_repeated_block_id_is_refused_by_default_and_nothing_is_registered() -> None:
    index = HashChainIndex(4, seed=0)
    assert index.check_block_ids is True
    with pytest.raises(BlockOwnershipError, match="block 3 appears twice"):
        index.insert(TokenKey(toks(12, 1)), [3, 5, 3])
    assert index.stats() == HashChainIndex(4, seed=0).stats()
    index.check_invariants()


@pytest.mark.parametrize("bad", [0, 1, "no", None])
def test_check_block_ids_must_be_a_bool(bad: object) -> None:
    with pytest.raises(PrefixKVError, match="check_block_ids"):
        HashChainIndex(4, check_block_ids=bad)


def test_a_pool_owner_builds_the_chain_without_the_duplicate_check() -> None:
    assert pool_owned_options("hash_chain") == {"check_block_ids": False}
    assert describe_index("hash_chain").pool_owned_options == {"check_block_ids": False}
    engine = KVCacheManager("hash_chain", num_blocks=8, block_size=4)
    assert engine.manager.index.check_block_ids is False  # type: ignore[attr-defined]


def test_an_id_cached_under_another_hash_is_refused_without_the_duplicate_check() -> None:
    index = HashChainIndex(4, seed=0, check_block_ids=False)
    index.insert(TokenKey(toks(8, 2)), [0, 1])
    before = index.stats()
    with pytest.raises(BlockOwnershipError):
        index.insert(TokenKey(toks(8, 3)), [1, 2])
    assert index.stats() == before
    index.check_invariants()


@settings(max_examples=30, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 40), st.integers(0, 3)),
        min_size=1,
        max_size=30,
    )
)
def test_num_evictable_blocks_is_the_stats_count_at_every_step(
    ops: list[tuple[int, int, int]],
) -> None:
    # A small pool, so admissions evict; requests share prefixes by their seed.
    m = CacheManager(HashChainIndex(4, seed=0), BlockAllocator(12))
    index = m.index
    assert isinstance(index, HashChainIndex)
    running: list[str] = []
    for n, (seed, length, action) in enumerate(ops):
        if action == 0 and running:
            m.finish(running.pop(0))
        elif action == 1 and running:
            rid = running[-1]
            m.advance(rid, m.num_computed_tokens(rid) + 4, m.num_computed_tokens(rid))
        else:
            rid = f"r{n}"
            if m.admit(rid, toks(length, seed)) is not None:
                m.commit(rid, length)
                running.append(rid)
        assert index.num_evictable_blocks() == index.stats().num_evictable_blocks
    for rid in running:
        m.finish(rid)
    assert index.num_evictable_blocks() == index.stats().num_evictable_blocks
    m.check_invariants()
