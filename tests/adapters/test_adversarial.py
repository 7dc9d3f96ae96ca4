"""Call orders and inputs a careful adversary would use on the public API.

Each test pins one class of defect: a lookup trusted after the cache changed under it,
a namespace dropped on the way in, block ids taken from a caller without asking who
owns them, a multi-step call that fails half way. The scheduler paths that vLLM and
SGLang take never produce these orders; an embedding engine, a KV connector or a
buggy caller can.
"""

from __future__ import annotations

import random
from typing import Any

import helpers
import pytest

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import (
    BlockOwnershipError,
    HashChainIndex,
    InvalidHandleError,
    InvalidTokenError,
    PrefixKVError,
    RadixIndex,
    RequestStateError,
    SynchronizedIndex,
    TokenKey,
    make_index,
)
from prefixkv.indexes.errors import StaleHandleError
from prefixkv.storage import BlockAllocator, slot_mapping, token_slot

CACHING = ["hash_chain", "radix"]


def manager_state(m: CacheManager) -> tuple[Any, ...]:
    return helpers.manager_state(m, totals=False)  # a rejected admission counts in them


def toks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 30000) for _ in range(n)]


def cached_manager(
    name: str,
    block_size: int,
    num_blocks: int,
    rid: str,
    prompt: list[int],
    *,
    finish: bool = True,
    extra_key: str | None = None,
) -> CacheManager:
    """A manager whose request ``rid`` computed ``prompt`` (all of it registered), and
    then finished unless ``finish`` is False."""
    m = CacheManager(make_index(name, block_size=block_size), BlockAllocator(num_blocks))
    assert m.admit(rid, prompt, extra_key=extra_key) is not None
    m.commit(rid, len(prompt))
    if finish:
        m.finish(rid)
    return m


# ------------------------------------------------- stale handles after the lookup


def test_a_lookup_made_stale_by_evict_blocks_is_rejected_not_trusted() -> None:
    # get_computed_blocks(S) -> evict_blocks(S's hit, held by R) -> free(R) hands the
    # orphans back -> T allocates them -> allocate_slots(S, ..., S's hit) must not give
    # S the blocks T is writing.
    f = KVCacheManager("hash_chain", num_blocks=17, block_size=4)
    shared = toks(16, 1)
    r = SimpleRequest("R", list(shared))
    f.get_computed_blocks(r)
    assert f.allocate_slots(r, 16) is not None
    s = SimpleRequest("S", shared + toks(3, 2))
    blocks, hit, _ = f.get_computed_blocks(s)
    assert hit == 16
    f.evict_blocks(blocks.get_block_ids()[0])
    f.free(r)
    t = SimpleRequest("T", toks(32, 3))
    f.get_computed_blocks(t)
    assert f.allocate_slots(t, 32) is not None
    before = manager_state(f.manager)
    with pytest.raises(StaleHandleError):
        f.allocate_slots(s, 3, 16, blocks)
    assert manager_state(f.manager) == before
    f.manager.check_invariants()
    # The scheduler looks up again and gets the truth: nothing cached for S.
    assert f.get_computed_blocks(s)[1] == 0
    assert f.allocate_slots(s, 19) is not None
    assert set(f.get_block_ids("S")[0]).isdisjoint(f.get_block_ids("T")[0])
    f.free(s)
    f.free(t)
    f.manager.check_invariants()


@pytest.mark.parametrize("name", CACHING)
def test_an_admission_check_uses_the_state_at_allocation_time(name: str) -> None:
    # The lookup sees R's blocks locked (nothing to protect); R then finishes, so the
    # hit's blocks become evictable; locking them for S protects them again. An
    # admission check that trusted the lookup's count let S in and then failed with
    # the hit locked forever.
    shared = toks(16, 4)
    m = cached_manager(name, 4, 5, "R", shared, finish=False)
    key = TokenKey(shared + toks(8, 5))
    match = m.match(key)
    assert match.num_tokens == 16
    m.finish("R")
    before = manager_state(m)
    assert m.admit("S", key, lookup=match) is None  # 4 hit + 2 new > 5 blocks
    assert manager_state(m) == before
    m.check_invariants()
    m.reset()  # nothing is left locked
    assert m.allocator.num_free_blocks == 5


@pytest.mark.parametrize("invalidate", ["eviction", "reset"])
@pytest.mark.parametrize("name", CACHING)
def test_a_lookup_made_stale_is_rejected(name: str, invalidate: str) -> None:
    a = toks(8, 6)
    m = cached_manager(name, 2, 6, "A", a)
    key = TokenKey(a + [7])
    match = m.match(key)
    assert match.num_tokens == 8
    if invalidate == "eviction":
        m.evict(6)
    else:
        m.reset()
    before = manager_state(m)
    with pytest.raises(StaleHandleError):
        m.admit("S", key, lookup=match)
    assert manager_state(m) == before
    m.check_invariants()


def test_locking_an_evicted_radix_node_says_it_was_evicted() -> None:
    tree = RadixIndex(1)
    tree.insert(TokenKey([1, 2, 3]), [0, 1, 2])
    match = tree.match_prefix(TokenKey([1, 2, 3]))
    tree.evict(3)
    with pytest.raises(StaleHandleError, match="evicted"):
        tree.lock(match.handle)


def test_a_foreign_handle_is_still_an_invalid_handle() -> None:
    a, b = RadixIndex(1), RadixIndex(1)
    a.insert(TokenKey([1, 2]), [0, 1])
    handle = a.match_prefix(TokenKey([1, 2])).handle
    with pytest.raises(InvalidHandleError, match="another"):
        b.lock(handle)
    assert not isinstance(StaleHandleError("x"), type(None))
    assert issubclass(StaleHandleError, InvalidHandleError)


# ------------------------------------------------------------------- namespaces


@pytest.mark.parametrize("name", CACHING)
def test_admit_never_drops_a_namespace_given_with_a_prepared_key(name: str) -> None:
    prompt = toks(33, 8)
    m = cached_manager(name, 4, 64, "alice", prompt, extra_key="alice")
    before = manager_state(m)
    with pytest.raises(PrefixKVError, match="bob"):
        m.admit("bob", TokenKey(prompt), extra_key="bob")  # conflicts with the key's own
    with pytest.raises(PrefixKVError, match="priority"):
        m.admit("bob", TokenKey(prompt, priority=2), priority=5)
    assert manager_state(m) == before
    adm = m.admit("bob", TokenKey(prompt, "bob"), extra_key="bob")  # agreeing: fine
    assert adm is not None and adm.hit_tokens == 0


def test_the_sglang_request_flow_and_tree_api_share_one_namespace_rule() -> None:
    cache = PrefixCache.create_simulated("radix", capacity_tokens=256)
    prompt = toks(20, 9)
    req = SimpleReq("r", prompt, extra_key="x", cache_salt="s")
    assert alloc_for_extend(cache, req) == 0
    req.output_ids.append(5)
    cache.cache_finished_req(req)
    assert cache.match_prefix(prompt, extra_key="x", cache_salt="s").prefix_len == 20
    assert cache.match_prefix(prompt, extra_key="x").prefix_len == 0
    assert cache.match_prefix(prompt).prefix_len == 0
    with pytest.raises(InvalidTokenError):
        cache.match_prefix(prompt, extra_key=(("extra", "x"),))  # SGLang's key is a str


# ----------------------------------------------------------- block ownership


def sglang_with_a_running_request() -> tuple[PrefixCache, SimpleReq]:
    cache = PrefixCache.create_simulated("radix", capacity_tokens=32)
    req = SimpleReq("r", toks(6, 10))
    assert alloc_for_extend(cache, req) == 0
    req.output_ids.append(3)
    cache.cache_unfinished_req(req)  # its 6 pages are cached now, and locked
    return cache, req


@pytest.mark.parametrize(
    "ids",
    [
        "free",  # ids the pool never handed out
        "cached",  # ids the tree caches for other tokens
        [40],  # out of range
        [-1],
        [1.5],
        [None],
        [3, 3],
    ],
    ids=repr,
)
def test_sglang_insert_takes_only_pages_the_caller_holds(ids: Any) -> None:
    cache, req = sglang_with_a_running_request()
    pool = cache.pool
    assert isinstance(pool, BlockAllocator)
    if ids == "free":
        ids = pool.free_block_ids()[:2]
    elif ids == "cached":
        ids = cache.match_prefix(req.origin_input_ids).device_indices[:2]
    before = helpers.cache_state(cache, [req])
    with pytest.raises(BlockOwnershipError):
        cache.insert([1, 2][: len(ids)] or [1], ids)
    assert helpers.cache_state(cache, [req]) == before
    cache.check_invariants([req])


def test_sglang_insert_of_caller_pages_then_evict_keeps_every_page() -> None:
    cache, req = sglang_with_a_running_request()
    mine = cache.pool.allocate(3)
    assert mine is not None
    assert cache.insert([7, 8, 9], mine) == 0
    cache.check_invariants([req])
    # Re-inserting the tree's own pages for the same tokens is allowed.
    own = cache.match_prefix([7, 8, 9]).device_indices
    assert cache.insert([7, 8, 9], own) == 3
    assert cache.evict(3) == 3
    cache.check_invariants([req])


@pytest.mark.parametrize("name", CACHING)
def test_evict_blocks_rejects_ids_outside_the_pool(name: str) -> None:
    f = KVCacheManager(name, num_blocks=9, block_size=4)
    before = manager_state(f.manager)
    for bad in ([9], [-1], [1.5], ["3"]):
        with pytest.raises(BlockOwnershipError):
            f.evict_blocks(bad)
    assert manager_state(f.manager) == before


# ---------------------------------------------- validate before anything changes


@pytest.mark.parametrize("name", CACHING)
@pytest.mark.parametrize("bad", ["2", None, 2**70, -1, 1.5])
def test_admit_validates_reserve_blocks_before_locking(name: str, bad: Any) -> None:
    a = toks(8, 11)
    m = cached_manager(name, 2, 16, "A", a)
    before = manager_state(m)
    with pytest.raises(PrefixKVError, match="reserve_blocks"):
        m.admit("S", a + [3], reserve_blocks=bad)
    assert manager_state(m) == before
    m.reset()


@pytest.mark.parametrize("name", CACHING)
@pytest.mark.parametrize("bad", ["x", 1.5, -1, 10**6])
def test_advance_validates_num_computed_before_adding_blocks(name: str, bad: Any) -> None:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    assert m.admit("A", toks(4, 12)) is not None
    before = manager_state(m)
    with pytest.raises(PrefixKVError, match="num_computed"):
        m.advance("A", 8, bad)
    assert manager_state(m) == before


@pytest.mark.parametrize("name", CACHING)
def test_advance_learns_the_tokens_it_registers_from_the_sequence(name: str) -> None:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    prompt = toks(3, 15)
    assert m.admit("A", prompt) is not None
    m.commit("A", 3)
    seq = [*prompt, 7, 8, 9]
    assert m.advance("A", 6, 6, tokens=seq[:5]) == [m.block_table("A")[-1]]
    assert list(m.key("A").tokens) == seq[:5]  # learned up to the sequence's end
    assert m.num_computed_tokens("A") == 5  # registration capped at its length
    assert m.index.match_prefix(TokenKey([*seq[:4], 1])).num_tokens == 4
    assert m.advance("A", 6, 6) == []  # without the sequence the key lags: no block 2
    assert m.index.match_prefix(TokenKey([*seq, 1])).num_tokens == 4
    m.check_invariants()


@pytest.mark.parametrize("name", CACHING)
@pytest.mark.parametrize("bad", ["x", 1.5, -1, 2**32, True, None])
def test_advance_checks_the_tokens_it_learns_before_adding_blocks(name: str, bad: Any) -> None:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    prompt = toks(4, 16)
    assert m.admit("A", prompt) is not None
    m.commit("A", 4)
    before = manager_state(m)
    with pytest.raises(InvalidTokenError):
        m.advance("A", 8, 6, tokens=[*prompt, 5, bad])  # a new block and a bad token
    with pytest.raises(InvalidTokenError, match="sequence"):
        m.advance("A", 8, 6, tokens=bad if bad is not None else 5)
    assert manager_state(m) == before


@pytest.mark.parametrize("name", CACHING)
def test_a_failing_unlock_leaves_the_request_running(name: str) -> None:
    class BrokenUnlock(SynchronizedIndex):
        def unlock(self, handle: Any) -> list[int]:
            raise PrefixKVError("unlock refused")

    m = CacheManager(BrokenUnlock(make_index(name, block_size=2)), BlockAllocator(16))
    assert m.admit("A", toks(5, 13)) is not None
    m.commit("A", 4)
    before = manager_state(m)
    with pytest.raises(PrefixKVError, match="unlock refused"):
        m.finish("A")
    assert manager_state(m) == before
    assert "A" in m


@pytest.mark.parametrize("name", CACHING)
def test_two_running_requests_cannot_share_one_key_object(name: str) -> None:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    key = TokenKey(toks(4, 14))
    assert m.admit("A", key) is not None
    before = manager_state(m)
    with pytest.raises(RequestStateError, match="key"):
        m.admit("B", key)
    assert manager_state(m) == before


def test_sglang_request_ids_keep_their_type() -> None:
    cache = PrefixCache.create_simulated("radix", capacity_tokens=64)
    one, one_str = SimpleReq(1, toks(4, 15)), SimpleReq("1", toks(4, 16))
    for req in (one, one_str):
        assert alloc_for_extend(cache, req) == 0
        req.output_ids.append(1)
        cache.cache_unfinished_req(req)  # 1 and "1" are two requests, not one
    cache.check_invariants([one, one_str])
    assert cache.protected_size() == 8


def test_sglang_a_second_request_under_a_running_ones_id_is_refused() -> None:
    cache, req = sglang_with_a_running_request()
    twin = SimpleReq("r", toks(6, 11))
    assert alloc_for_extend(cache, twin) == 0  # SGLang's ids are unique: not checked here
    twin.output_ids.append(1)
    before = helpers.cache_state(cache, [req, twin])
    with pytest.raises(RequestStateError, match="another running request"):
        cache.cache_unfinished_req(twin)
    assert helpers.cache_state(cache, [req, twin]) == before
    cache.cache_finished_req(req)
    cache.cache_unfinished_req(twin)  # the id is free again
    cache.cache_finished_req(twin)
    cache.check_invariants([])


# ------------------------------------------------- capabilities through wrappers


def test_a_synchronized_index_forwards_every_capability() -> None:
    inner = HashChainIndex(4, seed=0)
    wrapped = SynchronizedIndex(inner)
    for name in ("evict_blocks", "num_common_prefix_blocks", "memory_bytes", "hasher"):
        assert hasattr(wrapped, name), name
    m = CacheManager(wrapped, BlockAllocator(8))
    a = toks(8, 17)
    assert m.admit("A", a) is not None
    m.commit("A", 8)
    m.finish("A")
    m.evict_blocks(m.index.match_prefix(TokenKey(a)).block_ids)
    assert m.match(TokenKey(a + [1])).num_tokens == 0
    m.check_invariants()
    assert not hasattr(SynchronizedIndex(RadixIndex(1)), "evict_blocks")


# ------------------------------------------------------------- smaller defects


@pytest.mark.parametrize("name", ["hash_chain", "radix", "none"])
def test_an_unknown_index_option_is_a_named_error(name: str) -> None:
    with pytest.raises(PrefixKVError, match="bogus"):
        make_index(name, bogus=1)


@pytest.mark.parametrize("bad", ["no", 0, 1, None])
def test_verify_must_be_a_bool(bad: Any) -> None:
    with pytest.raises(PrefixKVError, match="verify"):
        HashChainIndex(4, verify=bad)


def test_seeds_of_different_types_give_different_roots() -> None:
    roots = {HashChainIndex(4, seed=s).hasher.root for s in (0, "\x00", b"\x00", "0", b"0")}
    assert len(roots) == 5


@pytest.mark.parametrize("bad", [None, 5, "1", [1.5]])
def test_allocator_free_of_a_non_list_is_a_named_error(bad: Any) -> None:
    a = BlockAllocator(4)
    a.allocate(2)
    before = a.free_block_ids()
    with pytest.raises(BlockOwnershipError):
        a.free(bad)
    assert a.free_block_ids() == before


def test_a_huge_pool_is_lazy_or_refused_never_a_memory_error() -> None:
    a = BlockAllocator(2**31 - 1)  # vLLM's block ids are int32
    assert a.allocate(3) == [0, 1, 2]
    assert a.num_free_blocks == 2**31 - 4
    with pytest.raises(PrefixKVError, match="num_blocks"):
        BlockAllocator(10**12)


@pytest.mark.parametrize("bs", [0, -1, 1.5, "4"])
def test_slot_helpers_reject_a_bad_block_size(bs: Any) -> None:
    with pytest.raises(PrefixKVError, match="block_size"):
        token_slot([0, 1], 3, bs)
    with pytest.raises(PrefixKVError, match="block_size"):
        slot_mapping([0, 1], 0, 2, bs)


@pytest.mark.parametrize("bad", ["3", 1.5, None])
def test_slot_helpers_reject_a_bad_position(bad: Any) -> None:
    with pytest.raises(PrefixKVError):
        token_slot([0, 1], bad, 4)
    with pytest.raises(PrefixKVError):
        slot_mapping([0, 1], 0, bad, 4)
