"""SGLang's scheduler steps hand evicted pages straight to the next allocation.

``simulated._take_pages`` evicts and takes the evicted pages without passing them
through the pool; what it hands out, and the state it leaves, must be exactly what
freeing them and allocating would give (the pool's LIFO order, the leftovers freed,
the ledger, the counters), so every page id a replay sees is unchanged.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.sglang import PageRows, PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import _take_pages, alloc_for_extend
from prefixkv.indexes import PrefixKVError, RequestStateError
from prefixkv.storage import BlockAllocator, Owner


def _freed_then_allocated(
    cache: PrefixCache, pool: BlockAllocator, need: int, reserve: int
) -> list[int] | None:
    # The reference: evict into the pool, then allocate from it.
    free = pool.num_free_blocks
    if free < need + reserve:
        cache.evict((need + reserve - free) * cache.page_size)
    return pool.allocate(need)


def _cache(seed: int, page_size: int, pages: int, requests: int, running: int) -> PrefixCache:
    # A cache filled by finished requests over a few shared prefixes, some of them
    # running still (their pages locked), the pool partly free.
    rng = random.Random(seed)
    cache = PrefixCache.create_simulated("radix", pages * page_size, page_size)
    heads = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 12))] for _ in range(3)]
    for i in range(requests):
        prompt = rng.choice(heads) + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 20))]
        req = SimpleReq(f"r{i}", prompt)
        if alloc_for_extend(cache, req) is None:
            continue
        req.output_ids.append(1)
        if i >= requests - running:
            cache.cache_unfinished_req(req)
        else:
            cache.cache_finished_req(req)
    if rng.random() < 0.5:  # some pages freed by hand: the pool's LIFO holds both kinds
        taken = cache.pool.allocate(min(3, cache.pool.num_free_blocks))
        if taken:
            cache.pool.free(taken[::-1])
    return cache


def _state(cache: PrefixCache) -> tuple[object, ...]:
    pool = cache.pool
    assert isinstance(pool, BlockAllocator)
    owners = [pool.owner_of(b) for b in range(pool.num_blocks)]
    return (pool.free_block_ids(), owners, cache.totals, cache.index.stats())


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    page_size=st.sampled_from([1, 1, 4]),
    pages=st.integers(8, 60),
    requests=st.integers(0, 12),
    running=st.integers(0, 3),
    need=st.integers(0, 70),
    reserve=st.integers(0, 1),
)
def test_reused_pages_are_the_pages_freeing_and_allocating_gives(
    seed: int, page_size: int, pages: int, requests: int, running: int, need: int, reserve: int
) -> None:
    ours = _cache(seed, page_size, pages, requests, running)
    ref = _cache(seed, page_size, pages, requests, running)
    assert _state(ours) == _state(ref)
    pool, ref_pool = ours.pool, ref.pool
    assert isinstance(pool, BlockAllocator) and isinstance(ref_pool, BlockAllocator)
    got = _take_pages(ours, pool, need, reserve)
    want = _freed_then_allocated(ref, ref_pool, need, reserve)
    assert got == want
    assert _state(ours) == _state(ref)
    if got is not None:  # handed out to the caller, as allocate tags them
        assert all(pool.owner_of(p) is Owner.CALLER for p in got)
        pool.free(got)
        ref_pool.free(want or [])
    ours.check_invariants()
    assert _state(ours) == _state(ref)


def test_adopt_fills_an_empty_row_with_the_list_itself() -> None:
    rows = PageRows()
    row = rows.alloc()
    pages = [3, 1, 2]
    rows.adopt(row, pages)
    assert rows.read(row, 0, 3) == [3, 1, 2]
    with pytest.raises(PrefixKVError, match="holds 3 pages"):
        rows.adopt(row, [4])
    assert rows.pages(row) == [3, 1, 2]
    rows.free(row)
    with pytest.raises(RequestStateError):
        rows.adopt(row, [4])


def test_allocate_one_hands_out_what_allocate_1_would() -> None:
    ours, ref = BlockAllocator(4), BlockAllocator(4)
    for _ in range(2):
        assert [ours.allocate_one()] == ref.allocate(1)
    ours.free([0, 1])
    ref.free([0, 1])
    got = [ours.allocate_one(owner=Owner.MANAGER) for _ in range(5)]
    want = [ref.allocate(1, owner=Owner.MANAGER) for _ in range(5)]
    assert got == [-1 if w is None else w[0] for w in want] == [0, 1, 2, 3, -1]
    assert [ours.owner_of(b) for b in range(4)] == [ref.owner_of(b) for b in range(4)]
    with pytest.raises(PrefixKVError, match="owner must be"):
        ours.allocate_one(owner=Owner.FREE)


def test_append_page_adds_only_the_rows_next_page() -> None:
    rows = PageRows()
    row = rows.alloc()
    rows.append_page(row, 0, 7)
    rows.append_page(row, 1, 3)
    assert rows.pages(row) == [7, 3]
    for index, page in ((1, 5), (3, 5), (2, -1)):
        with pytest.raises(PrefixKVError):
            rows.append_page(row, index, page)
    assert rows.pages(row) == [7, 3]
