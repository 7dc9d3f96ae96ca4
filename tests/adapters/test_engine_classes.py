"""The vLLM-shaped engine class and SGLang's prefix cache: SPEC VL-1..VL-4 and SG-1..SG-6 with
exact block ids, and every backend behind both (SGLang's driven through its
scheduler-side steps, ``prefixkv.adapters.sglang.simulated``).

Block ids are vLLM's: block 0 is its null block, never handed out.
"""

from __future__ import annotations

import random

import pytest

from prefixkv.adapters.sglang import PageRows, PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import (
    alloc_for_decode,
    alloc_for_extend,
    req_to_token,
    retract,
)
from prefixkv.adapters.vllm import KVCacheBlock, KVCacheBlocks, KVCacheManager, SimpleRequest
from prefixkv.indexes import (
    CacheInUseError,
    HashChainIndex,
    PrefixKVError,
    RadixIndex,
    RequestStateError,
    make_index,
)
from prefixkv.storage import BlockAllocator


def toks(n: int, seed: int = 0) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 32000) for _ in range(n)]


def vllm_admit(kv: KVCacheManager, req: SimpleRequest) -> int:
    blocks, hit, _ = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)
    assert new is not None
    req.num_computed_tokens = req.num_tokens
    return hit


def vllm_served(prompt: list[int], num_blocks: int = 33) -> KVCacheManager:
    """A vLLM KVCacheManager (hash chain, blocks of 4) on which a request computed ``prompt``
    and was freed."""
    kv = KVCacheManager("hash_chain", num_blocks=num_blocks, block_size=4)
    a = SimpleRequest("a", prompt)
    vllm_admit(kv, a)
    kv.free(a)
    return kv


def vllm_decode(kv: KVCacheManager, req: SimpleRequest, token: int) -> None:
    req.append_output_token_ids(token)
    assert kv.allocate_slots(req, 1) is not None
    req.num_computed_tokens += 1


def test_vl_01_prompt_blocks_are_registered_at_allocation_and_hit_concurrently() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=33, block_size=4)
    a = SimpleRequest("a", list(range(1, 11)))  # 10 tokens: 2 full blocks + 2
    assert vllm_admit(kv, a) == 0
    assert kv.get_block_ids("a") == ([1, 2, 3],)
    b = SimpleRequest("b", list(range(1, 11)) + [50])  # a is still running
    assert vllm_admit(kv, b) == 8
    assert kv.get_block_ids("b") == ([1, 2, 4],)


def test_vl_01_hit_is_capped_at_len_minus_one() -> None:
    kv = vllm_served(list(range(1, 9)))
    again = SimpleRequest("a2", list(range(1, 9)))
    blocks, hit, boundary = kv.get_computed_blocks(again)
    assert hit == 4 and blocks.get_block_ids() == ([1],) and boundary == 0


def test_vl_02_decode_registers_full_blocks_except_the_last_tokens() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=33, block_size=4)
    a = SimpleRequest("a", [1, 2, 3, 4, 5, 6])
    vllm_admit(kv, a)
    a.append_output_token_ids(7)  # sampled at prefill
    for t in (8, 9, 10):  # three decode steps, each sampling the next token
        assert kv.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
        a.append_output_token_ids(t)
    kv.free(a)  # tokens 1..9 have KV (the last sampled 10 never does): 2 full blocks
    probe = SimpleRequest("p", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    assert kv.get_computed_blocks(probe)[1] == 8
    index = kv.manager.index
    assert isinstance(index, HashChainIndex)
    assert index.stats().num_cached_blocks == 2


def test_vl_03_recomputed_last_block_is_a_second_block_under_the_same_hash() -> None:
    kv = vllm_served(list(range(1, 9)))
    a2 = SimpleRequest("a2", list(range(1, 9)))
    assert vllm_admit(kv, a2) == 4
    assert kv.get_block_ids("a2") == ([1, 3],)  # block 2's content recomputed into 3
    index = kv.manager.index
    assert isinstance(index, HashChainIndex)
    assert index.is_cached(2) and index.is_cached(3) and index.stats().num_entries == 2
    kv.free(a2)
    kv.manager.check_invariants()


def test_vl_04_free_queue_order_and_eviction() -> None:
    kv = vllm_served(list(range(1, 11)), num_blocks=7)  # blocks 1,2 full + 3 partial
    index = kv.manager.index
    assert isinstance(index, HashChainIndex)
    # Hashed blocks go to the LRU tail, tail first; the unhashed block 3 to the head.
    assert index.free_queue_block_ids() == [2, 1]
    assert kv.manager.allocator.free_block_ids() == [3, 4, 5, 6]
    # Never-used (and unhashed) blocks go before any cached block is evicted.
    b = SimpleRequest("b", toks(16, seed=1))
    vllm_admit(kv, b)
    assert kv.get_block_ids("b") == ([3, 4, 5, 6],)
    assert index.stats().num_cached_blocks == 2 + 4
    kv.free(b)
    # A hit takes its blocks out of the queue; the next allocation evicts LRU: b's
    # tail (block 6) went to the queue head, after a's blocks only if a is older.
    c = SimpleRequest("c", list(range(1, 9)) + [99])
    assert vllm_admit(kv, c) == 8
    assert kv.get_block_ids("c") == ([1, 2, 6],)
    kv.manager.check_invariants()


def test_vllm_engine_class_returns_none_when_it_does_not_fit_and_changes_nothing() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=3, block_size=4)  # 2 blocks hold KV
    r = SimpleRequest("big", list(range(1, 13)))
    blocks, hit, _ = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 12, hit, blocks) is None
    assert kv.manager.allocator.num_free_blocks == 2 and not kv.manager.running()


def test_vllm_engine_class_gives_slots_past_num_tokens_but_registers_only_tokens() -> None:
    # vLLM's allocate_slots: slots for computed + new tokens, which async scheduling
    # runs past num_tokens (the placeholders of tokens not sampled yet); blocks are
    # cached only up to num_tokens.
    kv = KVCacheManager("hash_chain", num_blocks=33, block_size=4)
    a = SimpleRequest("a", [1, 2, 3, 4, 5, 6])
    vllm_admit(kv, a)
    a.append_output_token_ids(7)  # num_tokens 7, computed 6
    assert kv.allocate_slots(a, 3) is not None  # one token and two placeholders
    assert len(kv.get_block_ids("a")[0]) == 3  # slots for 9 tokens
    index = kv.manager.index
    assert isinstance(index, HashChainIndex)
    assert index.stats().num_cached_blocks == 1  # tokens 5..8 are not all known yet
    a.num_computed_tokens = 9
    a.append_output_token_ids(8)
    a.append_output_token_ids(9)
    assert kv.allocate_slots(a, 1) is kv.empty_kv_cache_blocks  # 10 slots fit in 3 blocks
    assert index.stats().num_cached_blocks == 2  # block 1 (tokens 5..8) is known now
    kv.free(a)
    kv.manager.check_invariants()


def test_vllm_engine_class_blocks_compare_and_print_like_vllms() -> None:
    one, two, three = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    assert KVCacheBlocks(([one, two],)) == KVCacheBlocks(((one, two),)) != KVCacheBlocks(([one],))
    assert KVCacheBlocks(([three],)).get_block_ids() == ([3],)
    assert KVCacheBlocks(([],)).get_block_ids(allow_none=True) is None
    assert repr(KVCacheBlocks(([three],))) == "KVCacheBlocks(block_ids=([3],))"


def test_vllm_engine_class_reset_and_usage_and_common_prefix() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=9, block_size=4, log_stats=True)
    a, b = SimpleRequest("a", [1, 2, 3, 4, 5]), SimpleRequest("b", [1, 2, 3, 4, 6])
    vllm_admit(kv, a)
    kv.record_prefix_cache_stats(a, 0)
    vllm_admit(kv, b)
    kv.record_prefix_cache_stats(b, 4)
    assert kv.get_num_common_prefix_blocks("a") == [1]
    assert kv.usage == pytest.approx(3 / 8)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    kv.free(b)
    assert kv.reset_prefix_cache() is True
    assert kv.manager.index.stats().num_cached_blocks == 0
    assert kv.manager.totals.num_hit_tokens == 4
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits, stats.reset) == (2, 10, 4, True)
    assert kv.make_prefix_cache_stats().requests == 0  # taken: a fresh one


# ------------------------------------------------------------------ SGLang side


def sg_run(cache: PrefixCache, rid: str, prompt: list[int], output: list[int]) -> int:
    req = SimpleReq(rid, prompt)
    hit = alloc_for_extend(cache, req)
    assert hit is not None
    req.output_ids.append(output[0])
    if len(output) == 1:
        cache.cache_finished_req(req)
        return hit
    cache.cache_unfinished_req(req)
    for t in output[1:]:
        assert alloc_for_decode(cache, req)
        req.output_ids.append(t)
    cache.cache_finished_req(req)
    cache.check_invariants(running=[])
    return hit


def sglang(capacity_tokens: int, page_size: int = 1) -> PrefixCache:
    return PrefixCache.create_simulated("radix", capacity_tokens, page_size)


def test_sg_01_admission_caps_and_aligns_the_hit() -> None:
    cache = sglang(256, page_size=4)
    sg_run(cache, "a", list(range(1, 11)), [0])  # 10 tokens: pages of 1..8 cached
    assert sg_run(cache, "b", list(range(1, 11)), [0]) == 8  # cap 9, aligned to 8
    assert sg_run(cache, "c", list(range(1, 9)), [0]) == 4  # cap 7, aligned to 4


def test_sg_01_paged_prefill_evicts_one_page_more_than_it_needs() -> None:
    cache = sglang(16, page_size=4)  # 4 pages
    sg_run(cache, "a", [1, 2, 3, 4], [0])
    sg_run(cache, "b", [5, 6, 7, 8], [0])
    assert cache.total_size() == 8 and cache.available_size() == 8
    # 8 new tokens need 2 pages, which are free; SGLang still wants 3 free pages,
    # so the LRU page (a's) is evicted although the extend fits without it.
    sg_run(cache, "c", list(range(20, 28)), [0])
    assert cache.total_size() == 12
    assert cache.match_prefix([1, 2, 3, 4, 5]).prefix_len == 0
    assert cache.match_prefix([5, 6, 7, 8, 9]).prefix_len == 4


def test_sg_02_partial_last_page_is_private_and_freed() -> None:
    cache = sglang(64, page_size=4)
    sg_run(cache, "a", list(range(1, 8)), [100, 101])  # 7 + 1 fed token = 8: 2 pages
    assert cache.total_size() == 8 and cache.available_size() == 56
    sg_run(cache, "b", list(range(1, 7)), [0])  # 6 tokens: only 1 page goes in
    assert cache.total_size() == 8


def test_sg_03_cache_unfinished_req_swaps_duplicates_for_cached_slots() -> None:
    cache = sglang(64)
    prompt = [1, 2, 3, 4, 5]
    first, second = SimpleReq("a", prompt), SimpleReq("b", prompt)
    assert alloc_for_extend(cache, first) == 0
    assert alloc_for_extend(cache, second) == 0  # admitted before a registered anything
    first.output_ids.append(9)
    cache.cache_unfinished_req(first)
    free_before = cache.available_size()
    second.output_ids.append(9)
    cache.cache_unfinished_req(second)
    # b's 5 slots were duplicates: freed, and b now reads a's cached slots.
    assert cache.available_size() == free_before + 5
    assert req_to_token(cache, second) == req_to_token(cache, first)
    assert cache.protected_size() == 5
    cache.check_invariants(running=[first, second])
    cache.cache_finished_req(first)
    cache.cache_finished_req(second)
    cache.check_invariants(running=[])
    assert cache.protected_size() == 0


def test_sg_04_finish_inserts_prompt_and_fed_output_split_at_the_prompt() -> None:
    cache = sglang(64)
    sg_run(cache, "a", [1, 2, 3, 4], [5, 6, 7])  # fed: 5, 6 (7 is never fed)
    assert cache.total_size() == 6
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).prefix_len == 6
    index = cache.index
    assert isinstance(index, RadixIndex)
    assert index.stats().num_entries == 2  # the prompt node and the output leaf
    assert cache.evict(1) == 2  # the output leaf goes first, whole
    assert cache.match_prefix([1, 2, 3, 4, 9]).prefix_len == 4


def test_sg_04_the_prompt_boundary_holds_without_a_checkpoint_after_prefill() -> None:
    cache = sglang(64)
    req = SimpleReq("a", [1, 2, 3, 4])
    assert alloc_for_extend(cache, req) == 0
    req.output_ids.append(5)
    for t in (6, 7):  # decoded without cache_unfinished_req (a retracted re-run's way)
        assert alloc_for_decode(cache, req)
        req.output_ids.append(t)
    cache.cache_finished_req(req)  # one insert of 6 tokens runs past the prompt's end
    assert cache.index.stats().num_entries == 2  # split there: prompt node, output leaf
    assert cache.evict(1) == 2
    assert cache.match_prefix([1, 2, 3, 4, 9]).prefix_len == 4


def test_sg_06_eviction_frees_whole_leaves_and_may_overshoot() -> None:
    cache = sglang(64)
    sg_run(cache, "a", list(range(1, 11)), [0])
    assert cache.evict(1) == 10


def test_sglang_cache_sizes_and_reset() -> None:
    cache = sglang(64)
    sg_run(cache, "a", [1, 2, 3], [0])
    assert cache.evictable_size() == 3 and cache.protected_size() == 0
    m = cache.match_prefix([1, 2, 3])
    assert cache.inc_lock_ref(m.last_node) == -3  # SGLang's delta: 3 tokens protected
    assert cache.protected_size() == 3
    assert cache.dec_lock_ref(m.last_node) == 3
    cache.reset()
    assert cache.total_size() == 0 and cache.available_size() == 64


@pytest.mark.parametrize("prompt", [[1, 2, 3, 4], [1, 2, 3]], ids=["locks", "locks nothing"])
def test_a_running_request_keeps_the_cache_from_resetting(prompt: list[int]) -> None:
    cache = sglang(64, page_size=4)  # 3 tokens: no whole page, nothing cached or locked
    req = SimpleReq("r", prompt)
    assert alloc_for_extend(cache, req) == 0
    req.output_ids.append(5)
    cache.cache_unfinished_req(req)
    with pytest.raises(CacheInUseError):
        cache.reset()
    cache.cache_finished_req(req)
    cache.reset()
    cache.check_invariants(running=[])


def test_check_invariants_finds_a_leaked_page() -> None:
    cache = sglang(16)
    req = SimpleReq("r", [1, 2, 3])
    assert alloc_for_extend(cache, req) == 0
    cache.check_invariants(running=[req])
    with pytest.raises(AssertionError, match="leak"):
        cache.check_invariants(running=[])  # the request's pages are unaccounted for
    assert cache.pool.allocate(1) is not None  # a page nobody holds
    with pytest.raises(AssertionError, match="leak"):
        cache.check_invariants(running=[req])


def test_the_cache_state_lives_on_the_request_as_in_sglang() -> None:
    cache = sglang(64, page_size=2)
    sg_run(cache, "a", [1, 2, 3, 4, 5, 6], [0])
    req = SimpleReq("b", [1, 2, 3, 4, 9])
    assert alloc_for_extend(cache, req) == 4
    assert (req.prefix_len, req.last_node.num_tokens, req.lock is req.last_node) == (4, 4, True)
    kv = req.kv
    assert (kv.cache_protected_len, kv.kv_committed_len, kv.kv_allocated_len) == (4, 5, 5)
    req.output_ids.append(7)
    assert alloc_for_decode(cache, req)
    req.output_ids.append(8)
    cache.cache_unfinished_req(req)  # 6 committed tokens: 3 pages, the last new
    assert (kv.cache_protected_len, req.last_node.num_tokens) == (6, 6)
    assert cache.match_prefix([1, 2, 3, 4, 9, 7, 1]).prefix_len == 6
    cache.cache_finished_req(req)
    assert kv.req_pool_idx is None and req.lock is None
    cache.check_invariants(running=[])


def test_retract_caches_nothing_more() -> None:
    cache = sglang(64)
    req = SimpleReq("r", [1, 2, 3])
    assert alloc_for_extend(cache, req) == 0
    req.output_ids.append(4)
    retract(cache, req)
    assert cache.total_size() == 0 and cache.available_size() == 64
    with pytest.raises(RequestStateError):
        retract(cache, req)


def test_create_simulated_refuses_bad_sizes_by_name() -> None:
    with pytest.raises(PrefixKVError, match="capacity_tokens"):
        PrefixCache.create_simulated("radix", 3, 4)
    with pytest.raises(PrefixKVError, match="page_size"):
        PrefixCache.create_simulated(RadixIndex(4), 64, 2)
    with pytest.raises(PrefixKVError, match="PagePool"):
        PrefixCache(RadixIndex(1), object(), PageRows())
    with pytest.raises(PrefixKVError, match="ReqToPagePool"):
        PrefixCache(RadixIndex(1), BlockAllocator(4), object())
    with pytest.raises(PrefixKVError, match="max_running_requests"):
        PrefixCache.create_simulated("radix", 64, max_running_requests=0)


def test_running_out_of_rows_is_a_refused_admission() -> None:
    cache = PrefixCache.create_simulated("radix", 64, max_running_requests=1)
    first, second = SimpleReq("a", [1, 2]), SimpleReq("b", [3, 4])
    assert alloc_for_extend(cache, first) == 0
    free = cache.available_size()
    assert alloc_for_extend(cache, second) is None
    assert cache.available_size() == free and cache.totals.num_rejected == 1


# ------------------------------------------------- every backend, both engine classes


SEED_A = toks(80)
SEED_B = SEED_A[:30] + toks(50, seed=1)


@pytest.mark.parametrize(
    ("name", "bs", "want"),
    [("hash_chain", 16, [0, 16, 64]), ("radix", 1, [0, 30, 79]), ("radix", 16, [0, 16, 64]),
     ("none", 16, [0, 0, 0]), ("hash_chain", 1, [0, 30, 79])],
)  # fmt: skip
def test_bb_02_03_every_backend_behind_the_vllm_engine_class(
    name: str, bs: int, want: list[int]
) -> None:
    kv = KVCacheManager(make_index(name, block_size=bs), num_blocks=2048 // bs + 1)
    hits = []
    for rid, prompt in (("a", SEED_A), ("b", SEED_B), ("a2", SEED_A)):
        r = SimpleRequest(rid, list(prompt))
        hits.append(vllm_admit(kv, r))
        kv.free(r)
        kv.manager.check_invariants()
    assert hits == want


@pytest.mark.parametrize(
    ("name", "bs", "want"),
    [("hash_chain", 16, [0, 16, 64]), ("radix", 1, [0, 30, 79]), ("radix", 16, [0, 16, 64]),
     ("none", 16, [0, 0, 0]), ("hash_chain", 1, [0, 30, 79])],
)  # fmt: skip
def test_bb_02_03_every_backend_behind_the_sglang_engine_class(
    name: str, bs: int, want: list[int]
) -> None:
    cache = PrefixCache.create_simulated(make_index(name, block_size=bs), capacity_tokens=2048)
    hits = [sg_run(cache, rid, p, [0]) for rid, p in (("a", SEED_A), ("b", SEED_B), ("a2", SEED_A))]
    assert hits == want
