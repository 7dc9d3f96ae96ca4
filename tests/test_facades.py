"""The vLLM- and SGLang-shaped facades: SPEC VL-1..VL-4 and SG-1..SG-6 with exact
block ids, and every backend behind both facades.

Block ids are vLLM's: block 0 is its null block, never handed out.
"""

from __future__ import annotations

import random

import pytest

from prefixkv.adapters.sglang import SGLangRadixCache, SimpleReq
from prefixkv.adapters.vllm import KVCacheBlock, KVCacheBlocks, KVCacheManager, SimpleRequest
from prefixkv.indexes import HashChainIndex, RadixIndex, make_index


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


def test_vllm_facade_returns_none_when_it_does_not_fit_and_changes_nothing() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=3, block_size=4)  # 2 blocks hold KV
    r = SimpleRequest("big", list(range(1, 13)))
    blocks, hit, _ = kv.get_computed_blocks(r)
    assert kv.allocate_slots(r, 12, hit, blocks) is None
    assert kv.manager.allocator.num_free_blocks == 2 and not kv.manager.running()


def test_vllm_facade_gives_slots_past_num_tokens_but_registers_only_tokens() -> None:
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


def test_vllm_facade_blocks_compare_and_print_like_vllms() -> None:
    one, two, three = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    assert KVCacheBlocks(([one, two],)) == KVCacheBlocks(((one, two),)) != KVCacheBlocks(([one],))
    assert KVCacheBlocks(([three],)).get_block_ids() == ([3],)
    assert KVCacheBlocks(([],)).get_block_ids(allow_none=True) is None
    assert repr(KVCacheBlocks(([three],))) == "KVCacheBlocks(block_ids=([3],))"


def test_vllm_facade_reset_and_usage_and_common_prefix() -> None:
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


def sg_run(cache: SGLangRadixCache, rid: str, prompt: list[int], output: list[int]) -> int:
    req = SimpleReq(rid, prompt)
    hit = cache.alloc_for_extend(req)
    assert hit is not None
    req.output_ids.append(output[0])
    if len(output) == 1:
        cache.cache_finished_req(req)
        return hit
    cache.cache_unfinished_req(req)
    for t in output[1:]:
        assert cache.alloc_for_decode(req)
        req.output_ids.append(t)
    cache.cache_finished_req(req)
    cache.manager.check_invariants()
    return hit


def test_sg_01_admission_caps_and_aligns_the_hit() -> None:
    cache = SGLangRadixCache("radix", capacity_tokens=256, page_size=4)
    sg_run(cache, "a", list(range(1, 11)), [0])  # 10 tokens: pages of 1..8 cached
    assert sg_run(cache, "b", list(range(1, 11)), [0]) == 8  # cap 9, aligned to 8
    assert sg_run(cache, "c", list(range(1, 9)), [0]) == 4  # cap 7, aligned to 4


def test_sg_01_paged_prefill_evicts_one_page_more_than_it_needs() -> None:
    cache = SGLangRadixCache("radix", capacity_tokens=16, page_size=4)  # 4 pages
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
    cache = SGLangRadixCache("radix", capacity_tokens=64, page_size=4)
    sg_run(cache, "a", list(range(1, 8)), [100, 101])  # 7 + 1 fed token = 8: 2 pages
    assert cache.total_size() == 8 and cache.available_size() == 56
    sg_run(cache, "b", list(range(1, 7)), [0])  # 6 tokens: only 1 page goes in
    assert cache.total_size() == 8


def test_sg_03_cache_unfinished_req_swaps_duplicates_for_cached_slots() -> None:
    cache = SGLangRadixCache("radix", capacity_tokens=64, page_size=1)
    prompt = [1, 2, 3, 4, 5]
    first, second = SimpleReq("a", prompt), SimpleReq("b", prompt)
    assert cache.alloc_for_extend(first) == 0
    assert cache.alloc_for_extend(second) == 0  # admitted before a registered anything
    first.output_ids.append(9)
    cache.cache_unfinished_req(first)
    free_before = cache.available_size()
    second.output_ids.append(9)
    cache.cache_unfinished_req(second)
    # b's 5 slots were duplicates: freed, and b now reads a's cached slots.
    assert cache.available_size() == free_before + 5
    assert cache.req_to_token(second) == cache.req_to_token(first)
    assert cache.protected_size() == 5
    cache.cache_finished_req(first)
    cache.cache_finished_req(second)
    cache.manager.check_invariants()
    assert cache.protected_size() == 0


def test_sg_04_finish_inserts_prompt_and_fed_output_split_at_the_prompt() -> None:
    cache = SGLangRadixCache("radix", capacity_tokens=64, page_size=1)
    sg_run(cache, "a", [1, 2, 3, 4], [5, 6, 7])  # fed: 5, 6 (7 is never fed)
    assert cache.total_size() == 6
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).prefix_len == 6
    index = cache.manager.index
    assert isinstance(index, RadixIndex)
    assert index.stats().num_entries == 2  # the prompt node and the output leaf
    assert cache.evict(1) == 2  # the output leaf goes first, whole
    assert cache.match_prefix([1, 2, 3, 4, 9]).prefix_len == 4


def test_sg_06_eviction_frees_whole_leaves_and_may_overshoot() -> None:
    cache = SGLangRadixCache("radix", capacity_tokens=64, page_size=1)
    sg_run(cache, "a", list(range(1, 11)), [0])
    assert cache.evict(1) == 10


def test_sglang_facade_sizes_and_reset() -> None:
    cache = SGLangRadixCache("radix", capacity_tokens=64, page_size=1)
    sg_run(cache, "a", [1, 2, 3], [0])
    assert cache.evictable_size() == 3 and cache.protected_size() == 0
    m = cache.match_prefix([1, 2, 3])
    cache.inc_lock_ref(m.last_node)
    assert cache.protected_size() == 3
    cache.dec_lock_ref(m.last_node)
    cache.reset()
    assert cache.total_size() == 0 and cache.available_size() == 64


# ------------------------------------------------- every backend, both facades


SEED_A = toks(80)
SEED_B = SEED_A[:30] + toks(50, seed=1)


@pytest.mark.parametrize(
    ("name", "bs", "want"),
    [("hash_chain", 16, [0, 16, 64]), ("radix", 1, [0, 30, 79]), ("radix", 16, [0, 16, 64]),
     ("none", 16, [0, 0, 0]), ("hash_chain", 1, [0, 30, 79])],
)  # fmt: skip
def test_bb_02_03_every_backend_behind_the_vllm_facade(name: str, bs: int, want: list[int]) -> None:
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
def test_bb_02_03_every_backend_behind_the_sglang_facade(
    name: str, bs: int, want: list[int]
) -> None:
    cache = SGLangRadixCache(make_index(name, block_size=bs), capacity_tokens=2048)
    hits = [sg_run(cache, rid, p, [0]) for rid, p in (("a", SEED_A), ("b", SEED_B), ("a2", SEED_A))]
    assert hits == want
