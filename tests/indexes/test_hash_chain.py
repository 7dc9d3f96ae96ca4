"""Scenario tests of the hash chain, one per SPEC HC fact, pinning exact block ids
and eviction order the way vLLM's own ``test_prefix_caching.py`` does."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters import CacheManager
from prefixkv.indexes import (
    BlockHasher,
    HashChainIndex,
    InsertResult,
    InvalidHandleError,
    LockStateError,
    PrefixMatch,
    StaleHandleError,
    TokenKey,
    make_extra_key,
    make_index,
)
from prefixkv.storage import BlockAllocator


def toks(n: int, seed: int = 0) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 32000) for _ in range(n)]


def manager(num_blocks: int = 64, block_size: int = 16, **kw: object) -> CacheManager:
    return CacheManager(HashChainIndex(block_size, seed=0, **kw), BlockAllocator(num_blocks))  # type: ignore[arg-type]


def run(m: CacheManager, rid: str, tokens: list[int]) -> int:
    adm = m.admit(rid, tokens)
    assert adm is not None
    m.commit(rid, len(tokens))
    m.finish(rid)
    m.check_invariants()
    return adm.hit_tokens


def test_hc_01_block_size_defaults_to_16() -> None:
    assert HashChainIndex().block_size == 16
    assert make_index("hash_chain").block_size == 16


def test_hc_02_only_full_blocks_are_hashed_and_chained() -> None:
    h = BlockHasher(4, seed=1)
    key = TokenKey([1, 2, 3, 4, 5, 6, 7, 8, 9])
    hashes = key.block_hashes(h)
    assert len(hashes) == 2  # 9 tokens: two full blocks, the ninth token has no hash
    # H_1 depends on H_0: same block-1 tokens after a different block 0 hash differently.
    other = TokenKey([9, 2, 3, 4, 5, 6, 7, 8]).block_hashes(h)
    assert other[1] != hashes[1]
    assert TokenKey([1, 2, 3, 4, 5, 6, 7, 8]).block_hashes(h) == hashes


def test_hc_02_root_seed_is_random_unless_given() -> None:
    key = [1, 2, 3, 4]
    a = TokenKey(key).block_hashes(BlockHasher(4))
    b = TokenKey(key).block_hashes(BlockHasher(4))
    assert a != b  # fresh random roots
    c = TokenKey(key).block_hashes(BlockHasher(4, seed=7))
    d = TokenKey(key).block_hashes(BlockHasher(4, seed=7))
    assert c == d


def test_hc_03_hashes_extend_incrementally_and_restart_for_a_new_request() -> None:
    calls: list[bytes] = []

    def digest(data: bytes) -> bytes:
        calls.append(data)
        return bytes(16) if not data else (len(calls).to_bytes(16, "little"))

    h = BlockHasher(4, algorithm=digest, seed=0)
    calls.clear()
    key = TokenKey([1, 2, 3, 4, 5, 6, 7, 8])
    first = list(key.block_hashes(h))
    assert len(calls) == 2
    key.append([9, 10, 11])
    key.block_hashes(h)
    assert len(calls) == 2  # no new full block, nothing hashed
    key.append([12])
    assert key.block_hashes(h)[:2] == first
    assert len(calls) == 3  # only block 2 was hashed; start = len(hashes) * block_size
    again = TokenKey([1, 2, 3, 4, 5, 6, 7, 8])
    assert again.block_hashes(h) == first
    # A new request's memo is a list of its own; its leading blocks' hashes are taken
    # from a recent sequence with the same tokens (compared, not trusted), unhashed.
    assert again.block_hashes(h) is not key.block_hashes(h)
    assert len(calls) == 3
    TokenKey([1, 2, 3, 4, 5, 6, 7, 99]).block_hashes(h)
    assert len(calls) == 4  # block 0 shared, block 1 differs: only block 1 is hashed


def _chain(tokens: list[int], block_size: int, extra_key: object) -> list[bytes]:
    """The chain of SPEC HC-2, computed directly (no memo, no reuse)."""
    import xxhash

    from prefixkv.indexes.hashing import encode_extra_key

    parent = BlockHasher(block_size, seed=5).root + encode_extra_key(extra_key)  # type: ignore[arg-type]
    out = []
    for i in range(len(tokens) // block_size):
        block = array("I", tokens[i * block_size : (i + 1) * block_size]).tobytes()
        parent = xxhash.xxh3_128_digest(parent + block)
        out.append(parent)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # which earlier sequence to start from (mod the count)
            st.integers(0, 40),  # how many of its tokens to keep
            st.lists(st.integers(0, 3), max_size=30),  # then these tokens
            st.sampled_from([None, "a", "b"]),  # the namespace
            st.integers(0, 6),  # tokens appended after the first hashing
        ),
        min_size=1,
        max_size=40,
    )
)
def test_hashes_reused_from_recent_sequences_equal_the_chain(
    steps: list[tuple[int, int, list[int], object, int]],
) -> None:
    """One hasher over many keys that share prefixes (and sometimes namespaces), some
    growing after their first hashing: every memo equals the chain computed directly."""
    h = BlockHasher(4, seed=5)
    seqs: list[list[int]] = [[]]
    keys: list[tuple[TokenKey, list[int], object]] = []
    for pick, keep, tail, namespace, grow in steps:
        base = seqs[pick % len(seqs)]
        tokens = base[:keep] + tail
        seqs.append(tokens)
        key = TokenKey(tokens, namespace)
        key.block_hashes(h)
        extra = [7] * grow
        key.append(extra)
        keys.append((key, tokens + extra, key.extra_key))
        for k, full, ns in keys[-3:]:  # earlier keys keep growing
            assert k.block_hashes(h) == _chain(full, 4, ns)


def test_reuse_compares_the_whole_recent_sequence_not_its_ends() -> None:
    """A recent sequence whose first and last blocks recur in a new one at the same
    places, a block between them differing, lends the new one its first block only."""
    h = BlockHasher(4, seed=5)
    TokenKey([1] * 4 + [2] * 4 + [3] * 4).block_hashes(h)
    second = [1] * 4 + [9] * 4 + [3] * 4 + [4] * 4
    assert TokenKey(second).block_hashes(h) == _chain(second, 4, None)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2), max_size=24),
    st.lists(st.integers(0, 2), max_size=24),
    st.integers(0, 14),
)
def test_common_blocks_counts_the_shared_blocks_whatever_the_guess(
    a: list[int], b: list[int], guess: int
) -> None:
    """The blocks two byte strings share, found whether the guess (the blocks the older
    one shared with its own predecessor) is right, short, long or out of range."""
    from prefixkv.indexes.hashing import _common_blocks

    step = 2
    shared = 0
    while (shared + 1) * step <= min(len(a), len(b)) and (
        a[shared * step : (shared + 1) * step] == b[shared * step : (shared + 1) * step]
    ):
        shared += 1
    assert _common_blocks(bytes(a), bytes(b), step, guess) == shared


def test_hc_04_first_miss_stops_lookup() -> None:
    index = HashChainIndex(4, seed=0)
    a = list(range(1, 13))  # three blocks
    index.insert(TokenKey(a), [0, 1, 2])
    probe = a[:4] + [99, 99, 99, 99] + a[8:]  # block 1 differs, block 2 equal
    m = index.match_prefix(TokenKey(probe))
    assert m.num_tokens == 4 and m.block_ids == [0]
    assert m.num_tokens % index.block_size == 0


def test_hc_05_flat_dict_of_hash_entries() -> None:
    index = HashChainIndex(4, seed=0)
    index.insert(TokenKey(list(range(1, 13))), [5, 6, 7])
    assert index.stats().num_entries == 3 and index.stats().num_cached_blocks == 3


def test_hc_06_hit_takes_block_out_of_free_queue_and_release_keeps_hash() -> None:
    m = manager(block_size=4)
    run(m, "a", list(range(1, 10)))  # blocks 0, 1 cached; block 2 (partial) freed
    index = m.index
    assert isinstance(index, HashChainIndex)
    assert index.free_queue_block_ids() == [1, 0]
    adm = m.admit("b", list(range(1, 10)))
    assert adm is not None and adm.hit_tokens == 8
    assert index.ref_cnt(0) == 1 and index.ref_cnt(1) == 1
    assert index.free_queue_block_ids() == []
    m.finish("b")
    assert index.ref_cnt(0) == 0 and index.is_cached(0)  # evictable, still matchable
    assert run(m, "c", list(range(1, 10))) == 8


def test_hc_07_release_is_tail_first_so_eviction_trims_from_the_tail() -> None:
    m = manager(num_blocks=4, block_size=4)
    run(m, "a", list(range(1, 17)))  # 4 full blocks 0..3, hit capped -> all registered
    index = m.index
    assert isinstance(index, HashChainIndex)
    assert index.free_queue_block_ids() == [3, 2, 1, 0]
    # A new 8-token request needs 2 blocks: evicts the tail blocks 3 and 2.
    adm = m.admit("b", [50, 51, 52, 53, 54, 55, 56, 57])
    assert adm is not None and adm.block_table == [3, 2]
    m.abort("b")
    # The surviving prefix (blocks 0, 1) still hits.
    assert run(m, "c", list(range(1, 9)) + [77]) == 8


def test_hc_08_free_queue_removal_is_o1_intrusive_list() -> None:
    index = HashChainIndex(1, seed=0)
    n = 2000
    res = index.insert(TokenKey(list(range(n))), list(range(n)))
    # Lock a block in the middle: it must leave the queue without a scan.
    mid = index.match_prefix(TokenKey(list(range(n // 2 + 1))))
    index.lock(mid.handle)
    assert len(index.free_queue_block_ids()) == n - (n // 2 + 1)
    index.check_invariants()
    index.unlock(mid.handle)
    assert index.free_queue_block_ids()[-1] == 0  # tail first: block 0 released last
    del res


def test_hc_09_reused_block_loses_its_hash_before_reuse() -> None:
    m = manager(num_blocks=3, block_size=4)
    run(m, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])  # blocks 0, 1 cached; 2 (partial) free
    index = m.index
    assert isinstance(index, HashChainIndex)
    adm = m.admit("b", [20, 21, 22, 23, 24, 25, 26, 27])
    assert adm is not None
    assert adm.block_table == [2, 1]  # the free block first, then the evicted tail
    assert not index.is_cached(1)  # its old entry is gone before anyone writes it
    m.abort("b")
    assert run(m, "c", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 4  # only the survivor hits


def test_hc_10_evict_blocks_drops_entries_and_descendants_become_unreachable() -> None:
    m = manager(block_size=4)
    run(m, "a", list(range(1, 14)))  # blocks 0,1,2 cached
    index = m.index
    assert isinstance(index, HashChainIndex)
    m.evict_blocks([1])
    assert not index.is_cached(1) and index.is_cached(2)  # 2 stays, unreachable
    assert run(m, "b", list(range(1, 14))) == 4  # stops at the missing link
    m.check_invariants()


def test_hc_10_evict_blocks_of_a_locked_block_returns_it_at_last_unlock() -> None:
    m = manager(num_blocks=8, block_size=4)
    run(m, "a", list(range(1, 10)))
    adm = m.admit("b", list(range(1, 10)))
    assert adm is not None and adm.hit_tokens == 8
    free_before = m.allocator.num_free_blocks
    m.evict_blocks([0])
    m.check_invariants()
    assert m.allocator.num_free_blocks == free_before  # still held by b
    m.finish("b")
    m.check_invariants()
    assert m.allocator.num_free_blocks == free_before + 2  # block 0 and b's tail block


def test_hc_11_num_common_prefix_blocks() -> None:
    m = manager(block_size=4)
    shared = list(range(1, 9))
    run(m, "warm", shared + [100])
    m.admit("x", shared + [1, 2, 3, 4, 5])
    m.admit("y", shared + [6, 7, 8, 9, 10])
    assert m.num_common_prefix_blocks("x") == 2
    index = m.index
    assert isinstance(index, HashChainIndex)
    assert index.num_common_prefix_blocks(m.block_table("x"), 2) == 2
    m.finish("y")
    # Alone, x holds all its blocks (its private tail has ref_cnt 1 in vLLM too).
    assert m.num_common_prefix_blocks("x") == len(m.block_table("x"))


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256_raw", "sha256", "sha256_cbor", "xxhash"])
def test_hc_12_hash_algorithms(algorithm: str) -> None:
    m = CacheManager(HashChainIndex(4, hash_algorithm=algorithm, seed=3), BlockAllocator(16))
    assert run(m, "a", list(range(1, 10))) == 0
    assert run(m, "b", list(range(1, 10))) == 8


def test_hc_12_namespaces_enter_block_zero_with_type_tags() -> None:
    h = BlockHasher(4, seed=0)
    t = [1, 2, 3, 4]
    plain = TokenKey(t).block_hashes(h)
    lora = TokenKey(t, make_extra_key(lora="x")).block_hashes(h)
    salt = TokenKey(t, make_extra_key(cache_salt="x")).block_hashes(h)
    lora_int = TokenKey(t, make_extra_key(lora=1)).block_hashes(h)
    lora_str = TokenKey(t, make_extra_key(lora="1")).block_hashes(h)
    assert len({plain[0], lora[0], salt[0], lora_int[0], lora_str[0]}) == 5


def test_hc_13_duplicate_blocks_are_both_kept() -> None:
    index = HashChainIndex(4, seed=0)
    a = TokenKey([1, 2, 3, 4])
    r1 = index.insert(a, [10])
    r2 = index.insert(TokenKey([1, 2, 3, 4]), [11])  # computed concurrently
    assert r2.num_cached_tokens == 4 and r2.block_ids == [11]  # adopted, not deduplicated
    assert index.match_prefix(TokenKey([1, 2, 3, 4, 5])).block_ids == [10]  # first one wins
    index.lock(r2.handle)
    assert index.evict(1) == [10]  # each duplicate is evicted on its own
    assert index.match_prefix(TokenKey([1, 2, 3, 4, 5])).block_ids == [11]
    index.check_invariants()
    del r1


def test_hc_13_recomputed_last_block_registers_a_duplicate() -> None:
    m = manager(block_size=16)
    a = toks(80)
    run(m, "a", a)
    adm = m.admit("a2", a)
    assert adm is not None and adm.hit_tokens == 64
    m.commit("a2", 80)
    index = m.index
    assert isinstance(index, HashChainIndex)
    assert index.stats().num_entries == 5 and index.stats().num_cached_blocks == 6
    m.finish("a2")
    m.check_invariants()


def test_handles_are_checked() -> None:
    a, b = HashChainIndex(4, seed=0), HashChainIndex(4, seed=0)
    r = a.insert(TokenKey([1, 2, 3, 4]), [0])
    with pytest.raises(InvalidHandleError):
        b.lock(r.handle)
    with pytest.raises(LockStateError):
        a.unlock(r.handle)
    m = a.match_prefix(TokenKey([1, 2, 3, 4, 5]))
    assert a.evict(1) == [0]
    with pytest.raises(InvalidHandleError, match="evicted"):
        a.lock(m.handle)


def test_verify_rejects_a_colliding_hash() -> None:
    def collide(data: bytes) -> bytes:  # every block hashes alike
        return bytes(16)

    for verify, expect in ((False, 4), (True, 0)):
        index = HashChainIndex(4, hash_algorithm=collide, seed=0, verify=verify)
        index.insert(TokenKey([1, 2, 3, 4]), [0])
        m = index.match_prefix(TokenKey([9, 9, 9, 9, 9]))
        assert m.num_tokens == expect
        index.check_invariants()


def test_insert_results_compare_by_value_and_print_briefly() -> None:
    index = HashChainIndex(4, seed=0)
    r = index.insert(TokenKey([1, 2, 3, 4, 5]), [10, 11])
    assert r == InsertResult(0, [10], r.handle) != InsertResult(4, [10], r.handle)
    assert r != (0, [10], r.handle, 0)
    assert repr(r) == (
        "InsertResult(num_cached_tokens=0, block_ids=[10], "
        "handle=<hash-chain handle: 1 blocks, epoch 0>, first_block=0)"
    )


def test_prefix_matches_compare_by_value_and_print_briefly() -> None:
    index = HashChainIndex(4, seed=0)
    index.insert(TokenKey([1, 2, 3, 4, 5]), [10, 11])
    m = index.match_prefix(TokenKey([1, 2, 3, 4, 9]))
    assert m == PrefixMatch(4, [10], m.handle) != PrefixMatch(4, [11], m.handle)
    assert m != (4, [10], m.handle)
    assert repr(m) == (
        "PrefixMatch(num_tokens=4, block_ids=[10], handle=<hash-chain handle: 1 blocks, epoch 0>)"
    )


def test_evicted_ids_registered_again_and_ids_that_never_come_back_are_forgotten() -> None:
    """An evicted block's id may be registered again at once (a pool's ids come back),
    under a new record; ids that never come back (a caller numbering blocks afresh)
    leave nothing behind: the index's size follows what it caches, not what it saw."""
    index = HashChainIndex(4, seed=0)
    key = TokenKey(list(range(1, 13)))
    first = index.insert(key, [5, 6, 7])
    assert index.evict(3) == [7, 6, 5]  # tail first
    assert index.stats().num_cached_blocks == 0
    assert index.match_prefix(key).num_tokens == 0
    index.check_invariants()
    again = index.insert(TokenKey(list(range(100, 112))), [7, 6, 5])  # the same ids
    assert again.block_ids == [7, 6, 5] and index.stats().num_cached_blocks == 3
    assert [index.ref_cnt(b) for b in (5, 6, 7)] == [0, 0, 0]
    with pytest.raises(StaleHandleError):
        index.lock(first.handle)  # the old records died with their entries
    index.check_invariants()
    index.evict(3)
    baseline = index.memory_bytes()
    for r in range(400):  # 12,000 fresh ids, 30 cached at a time
        ids = list(range(1000 + 30 * r, 1030 + 30 * r))
        index.insert(TokenKey([r + 1] * 120), ids)
        assert index.stats().num_cached_blocks == 30
        index.evict(30)
        assert index.ref_cnt(ids[0]) == -1 and not index.is_cached(ids[0])
    index.check_invariants()
    assert index.memory_bytes() < baseline + 4096 * 200  # bounded by the purge, not 12,000


def test_memory_bytes_counts_the_sequences_the_hasher_keeps_for_reuse() -> None:
    # A lookup hashes the key, and the hasher keeps the last sequences it hashed (to
    # start a new one from their hashes); they stay alive after the key is gone, so the
    # index's memory counts them: at least their token bytes, twice (bytes and array).
    index = HashChainIndex(16, seed=0)
    empty = index.memory_bytes()
    tokens = toks(16 * 256)
    index.match_prefix(TokenKey(tokens))
    with_it = index.memory_bytes()
    assert with_it >= empty + 2 * 4 * len(tokens)
    for i in range(40):  # 32 recent at most: the long one is pushed out, and let go
        index.match_prefix(TokenKey(toks(16, seed=i + 1)))
    assert index.memory_bytes() < with_it - 4 * len(tokens)
