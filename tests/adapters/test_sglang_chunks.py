"""A chunked prefill allocates chunk by chunk, as SGLang does (``simulated.alloc_for_extend``
with ``extend_len``, then ``alloc_for_chunk``): each step holds only the pages its
chunks reached, a chunk that cannot be had changes nothing, and the request ends up
cached exactly as if its prompt had been allocated whole.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import (
    alloc_for_chunk,
    alloc_for_decode,
    alloc_for_extend,
    req_to_token,
)
from prefixkv.indexes import PrefixKVError, RequestStateError


def _held(cache: PrefixCache) -> int:
    # Pages neither free nor cached: what the running requests hold privately.
    pool = cache.pool
    return pool.num_blocks - pool.num_free_blocks - cache.total_size() // cache.page_size


def _run(cache: PrefixCache, rid: str, prompt: list[int], cuts: list[int]) -> int | None:
    # Prefill in chunks of ``cuts`` (the rest in the last), sample, finish.
    req = SimpleReq(rid, prompt)
    ps = cache.page_size
    hit = alloc_for_extend(cache, req, cuts[0]) if cuts else alloc_for_extend(cache, req)
    assert hit is not None
    end = req.kv.kv_allocated_len
    for cut in cuts[1:] + [len(prompt)]:
        cache.checkpoint(req, up_to=end)
        assert _held(cache) <= -(-end // ps) - hit // ps  # only what the chunks reached
        n = min(cut, len(prompt) - end)
        if n == 0:
            continue
        assert alloc_for_chunk(cache, req, n)
        end += n
        assert len(req_to_token(cache, req)) == end
    req.output_ids.append(5)
    cache.cache_unfinished_req(req)
    assert alloc_for_decode(cache, req)
    req.output_ids.append(6)
    cache.cache_finished_req(req)
    cache.check_invariants()
    return hit


@settings(max_examples=50, deadline=None)
@given(
    page_size=st.sampled_from([1, 4]),
    prompt_len=st.integers(2, 60),
    cuts=st.lists(st.integers(1, 20), max_size=6),
    shared=st.integers(0, 30),
)
def test_chunks_cache_what_a_whole_prompt_caches(
    page_size: int, prompt_len: int, cuts: list[int], shared: int
) -> None:
    first = list(range(1, 40))
    prompt = first[:shared] + list(range(100, 100 + prompt_len))
    caches = []
    for how in (cuts, []):
        cache = PrefixCache.create_simulated("radix", 512, page_size)
        _run(cache, "a", first, [])
        hit = _run(cache, "b", prompt, how)
        probe = cache.match_prefix(prompt + [1], max_prefix_len=len(prompt)).prefix_len
        caches.append((hit, probe, cache.total_size(), cache.pool.num_free_blocks))
    assert caches[0] == caches[1]


def test_a_first_chunk_allocates_only_its_pages() -> None:
    cache = PrefixCache.create_simulated("radix", 64, 4)
    free = cache.pool.num_free_blocks
    req = SimpleReq("a", list(range(1, 30)))
    assert alloc_for_extend(cache, req, 5) == 0
    assert free - cache.pool.num_free_blocks == 2 and req.kv.kv_allocated_len == 5
    assert alloc_for_chunk(cache, req, 3)  # 5..7: the second page still
    assert free - cache.pool.num_free_blocks == 2
    assert alloc_for_chunk(cache, req, 1)  # 8: a third page
    assert free - cache.pool.num_free_blocks == 3
    cache.check_invariants([req])


def test_a_chunk_that_does_not_fit_changes_nothing() -> None:
    cache = PrefixCache.create_simulated("radix", 16, 4)
    req = SimpleReq("a", list(range(1, 30)))
    assert alloc_for_extend(cache, req, 8) == 0
    other = SimpleReq("b", list(range(50, 58)))
    assert alloc_for_extend(cache, other) == 0  # the pool is full
    before = (cache.pool.num_free_blocks, req.kv.kv_allocated_len, req_to_token(cache, req))
    assert not alloc_for_chunk(cache, req, 4)
    assert (cache.pool.num_free_blocks, req.kv.kv_allocated_len, req_to_token(cache, req)) == (
        before
    )
    cache.check_invariants([req, other])


@pytest.mark.parametrize("bad", [0, -1, 30, "2", 2.0, True, None])
def test_a_bad_chunk_length_gets_a_named_error(bad: object) -> None:
    cache = PrefixCache.create_simulated("radix", 64, 4)
    req = SimpleReq("a", list(range(1, 30)))
    assert alloc_for_extend(cache, req, 5) == 0
    free = cache.pool.num_free_blocks
    with pytest.raises(PrefixKVError, match="extend_len"):
        alloc_for_chunk(cache, req, bad)  # type: ignore[arg-type]
    assert cache.pool.num_free_blocks == free and req.kv.kv_allocated_len == 5
    if bad not in (None, 30):  # past the end, a first chunk is the whole rest
        with pytest.raises(PrefixKVError, match="extend_len"):
            alloc_for_extend(cache, SimpleReq("b", [1, 2, 3]), bad)  # type: ignore[arg-type]
        assert cache.pool.num_free_blocks == free and cache.protected_size() == 0


def test_a_chunk_needs_an_admitted_request() -> None:
    cache = PrefixCache.create_simulated("radix", 64, 4)
    with pytest.raises(RequestStateError):
        alloc_for_chunk(cache, SimpleReq("a", [1, 2, 3]), 1)
