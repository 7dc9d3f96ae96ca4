"""One conformance suite for every registered prefix index, plus the manager-level seed facts.

Every backend ``available_indexes()`` lists is run through the same contract
(``indexes/base.py``) at block sizes 1, 2 and 16; ``check_invariants()`` and the stats
identity ``cached == evictable + locked`` are checked after every step. The manager
tests replay SPEC BB-1..BB-4 through ``CacheManager`` for each backend.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    LockStateError,
    PrefixIndex,
    TokenKey,
    available_indexes,
    make_index,
)
from prefixkv.storage import BlockAllocator, slot_mapping, token_slot

BACKENDS = available_indexes()
BLOCK_SIZES = (1, 2, 16)
# "none" is the no-cache baseline: it registers nothing, so cache-content tests skip it.
CACHING = [name for name in BACKENDS if name != "none"]

ALL_CASES = [pytest.param(n, bs, id=f"{n}-bs{bs}") for n in BACKENDS for bs in BLOCK_SIZES]
CACHING_CASES = [pytest.param(n, bs, id=f"{n}-bs{bs}") for n in CACHING for bs in BLOCK_SIZES]


def test_builtin_backends_are_registered() -> None:
    assert {"hash_chain", "radix", "none"} <= set(BACKENDS)


def new_index(name: str, block_size: int) -> PrefixIndex:
    index = make_index(name, block_size=block_size)
    check(index)
    return index


def check(index: PrefixIndex) -> None:
    """The per-step checks: internal invariants and the stats identity."""
    index.check_invariants()
    s = index.stats()
    assert s.num_cached_blocks == s.num_evictable_blocks + s.num_locked_blocks, s
    assert min(s) >= 0, s


def tokens(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


class Ids:
    """Distinct block ids, like an allocator that never reuses."""

    def __init__(self) -> None:
        self._it: Iterator[int] = iter(range(10**6))

    def take(self, n: int) -> list[int]:
        return [next(self._it) for _ in range(n)]


# ------------------------------------------------------------------ protocol basics


@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_is_a_prefix_index(name: str, bs: int) -> None:
    index = new_index(name, bs)
    assert isinstance(index, PrefixIndex)
    assert index.block_size == bs


@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_empty_index_misses(name: str, bs: int) -> None:
    index = new_index(name, bs)
    m = index.match_prefix(TokenKey(tokens(3 * bs + 1)))
    assert (m.num_tokens, m.block_ids, index.count_evictable(m.handle)) == (0, [], 0)
    index.lock(m.handle)  # a miss handle is valid and pins nothing
    check(index)
    assert index.stats().num_cached_blocks == 0
    index.unlock(m.handle)
    check(index)


@pytest.mark.parametrize("cap", [None, 0, 1, 5, 15, 16, 17, 31, 32, 33, 39, 40])
@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_insert_then_match_is_block_aligned_and_capped(name: str, bs: int, cap: int | None) -> None:
    index = new_index(name, bs)
    length = 40
    key = TokenKey(tokens(length))
    ids = Ids().take(-(-length // bs))
    index.insert(key, ids)
    check(index)
    m = index.match_prefix(TokenKey(tokens(length)), cap)
    check(index)
    if name == "none":
        assert (m.num_tokens, m.block_ids) == (0, [])
        return
    limit = length if cap is None else min(cap, length)
    want = limit - limit % bs
    assert m.num_tokens == want
    assert m.block_ids == ids[: want // bs]
    assert index.count_evictable(m.handle) == want // bs  # nothing is locked


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_match_of_a_diverging_key_stops_at_the_last_whole_common_block(name: str, bs: int) -> None:
    index = new_index(name, bs)
    ids = Ids().take(3)
    index.insert(TokenKey(tokens(3 * bs)), ids)
    other = tokens(3 * bs)
    other[bs + bs // 2] = 99_999  # differs inside block 1
    m = index.match_prefix(TokenKey(other))
    check(index)
    want = bs + bs // 2
    want -= want % bs
    assert (m.num_tokens, m.block_ids) == (want, ids[: want // bs])
    # A namespace never shares entries with the default one.
    ns = index.match_prefix(TokenKey(tokens(3 * bs), extra_key="tenant-a"))
    assert (ns.num_tokens, ns.block_ids) == (0, [])
    check(index)


@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_insert_returns_block_ids_and_a_handle(name: str, bs: int) -> None:
    index = new_index(name, bs)
    length = 3 * bs + (bs - 1)  # a partial tail block is never registered
    ids = Ids().take(4)
    res = index.insert(TokenKey(tokens(length)), ids)
    check(index)
    if name == "none":
        assert (res.num_cached_tokens, res.block_ids) == (0, [])
        assert index.stats().num_cached_blocks == 0
    else:
        assert res.num_cached_tokens == 0
        assert res.block_ids == ids[:3]
        assert index.stats().num_cached_blocks == 3
        assert index.stats().num_evictable_blocks == 3  # new entries start unlocked
    index.lock(res.handle)
    check(index)
    assert index.stats().num_locked_blocks == (0 if name == "none" else 3)
    index.unlock(res.handle)
    check(index)
    # The same content again: everything was cached already, the index keeps its blocks.
    again = index.insert(TokenKey(tokens(length)), ids)
    check(index)
    if name != "none":
        assert again.num_cached_tokens == 3 * bs
        assert again.block_ids == ids[:3]
        assert index.stats().num_cached_blocks == 3


@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_insert_with_num_tokens_registers_only_whole_blocks_of_that_prefix(
    name: str, bs: int
) -> None:
    index = new_index(name, bs)
    ids = Ids().take(4)
    index.insert(TokenKey(tokens(4 * bs)), ids, 2 * bs + bs // 2)
    check(index)
    m = index.match_prefix(TokenKey(tokens(4 * bs)))
    want = 0 if name == "none" else 2 * bs
    assert (m.num_tokens, m.block_ids) == (want, ids[: want // bs])


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_lock_unlock_relock(name: str, bs: int) -> None:
    index = new_index(name, bs)
    ids = Ids().take(4)
    key = TokenKey(tokens(4 * bs))
    first = index.insert(key, ids, 2 * bs)
    index.lock(first.handle)
    check(index)
    s = index.stats()
    assert (s.num_locked_blocks, s.num_evictable_blocks) == (2, 0)
    index.lock(first.handle)  # a second request on the same prefix
    check(index)
    assert index.unlock(first.handle) == []
    check(index)
    assert index.stats().num_locked_blocks == 2  # one lock is still held
    # Extend the registration and move the lock onto the longer prefix (SGLang checkpoint).
    longer = index.insert(key, ids, 4 * bs, prefix=first.handle)
    check(index)
    assert index.relock(first.handle, longer.handle) == []
    check(index)
    s = index.stats()
    assert (s.num_cached_blocks, s.num_locked_blocks, s.num_evictable_blocks) == (4, 4, 0)
    assert index.unlock(longer.handle) == []
    check(index)
    s = index.stats()
    assert (s.num_locked_blocks, s.num_evictable_blocks) == (0, 4)
    # Unlocking never deletes: the whole prefix still hits.
    assert index.match_prefix(TokenKey(tokens(4 * bs))).block_ids == ids


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_match_reports_evictable_blocks_of_the_hit(name: str, bs: int) -> None:
    index = new_index(name, bs)
    ids = Ids().take(4)
    res = index.insert(TokenKey(tokens(2 * bs)), ids[:2])
    index.lock(res.handle)
    index.insert(TokenKey(tokens(4 * bs)), ids)
    check(index)
    m = index.match_prefix(TokenKey(tokens(4 * bs)))
    check(index)
    assert m.block_ids == ids
    assert index.count_evictable(m.handle) == 2
    index.lock(m.handle)
    assert index.count_evictable(m.handle) == 0


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_double_unlock_raises_and_changes_nothing(name: str, bs: int) -> None:
    index = new_index(name, bs)
    res = index.insert(TokenKey(tokens(3 * bs)), Ids().take(3))
    index.lock(res.handle)
    index.unlock(res.handle)
    before = index.stats()
    with pytest.raises(LockStateError):
        index.unlock(res.handle)
    check(index)
    assert index.stats() == before
    # An unlock without any lock at all (straight after match) is the same misuse.
    m = index.match_prefix(TokenKey(tokens(3 * bs)))
    with pytest.raises(LockStateError):
        index.unlock(m.handle)
    check(index)
    assert index.stats() == before


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_evict_returns_only_unlocked_blocks(name: str, bs: int) -> None:
    index = new_index(name, bs)
    ids = Ids()
    locked_ids = ids.take(3)
    free_ids = ids.take(3)
    shared_ids = ids.take(2)
    held = index.insert(TokenKey(tokens(3 * bs, start=1)), locked_ids)
    index.lock(held.handle)
    index.insert(TokenKey(tokens(3 * bs, start=10_000)), free_ids)
    # A key sharing the locked prefix and continuing past it: only its tail is evictable.
    index.insert(TokenKey(tokens(5 * bs, start=1)), [*locked_ids, *shared_ids])
    check(index)
    assert index.evict(0) == []
    check(index)
    evicted = index.evict(10**6)
    check(index)
    assert sorted(evicted) == sorted(free_ids + shared_ids)
    assert not set(evicted) & set(locked_ids)
    s = index.stats()
    assert (s.num_cached_blocks, s.num_locked_blocks, s.num_evictable_blocks) == (3, 3, 0)
    assert s.num_evicted_blocks == len(evicted)
    assert index.evict(10**6) == []  # nothing evictable is left
    check(index)
    assert index.match_prefix(TokenKey(tokens(5 * bs))).block_ids == locked_ids
    assert index.match_prefix(TokenKey(tokens(3 * bs, start=10_000))).num_tokens == 0
    index.unlock(held.handle)
    check(index)
    assert sorted(index.evict(10**6)) == sorted(locked_ids)
    check(index)
    assert index.stats().num_cached_blocks == 0


def _assert_tail_first(index: PrefixIndex, key_tokens: list[int], ids: list[int], n: int) -> None:
    evicted = index.evict(n)
    check(index)
    assert len(evicted) >= n
    assert sorted(evicted) == sorted(ids[len(ids) - len(evicted) :]), (evicted, ids)
    m = index.match_prefix(TokenKey(key_tokens))
    assert m.block_ids == ids[: len(ids) - len(evicted)]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_evict_trims_a_released_chain_from_the_tail(name: str, bs: int, n: int) -> None:
    # HC-7 / RX-6: a finished request's chain is evicted tail (leaf) first, so what
    # stays cached is a prefix that still hits.
    index = new_index(name, bs)
    ids = Ids().take(5)
    key_tokens = tokens(5 * bs)
    res = index.insert(TokenKey(key_tokens), ids)
    index.lock(res.handle)
    index.unlock(res.handle)
    check(index)
    _assert_tail_first(index, key_tokens, ids, n)


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_evict_trims_a_never_locked_chain_from_the_tail(name: str, bs: int) -> None:
    # base.py, PrefixIndex.evict: "The hash chain frees exactly that many (tail blocks
    # first)". Entries inserted and never locked are evictable too; taking their head
    # first would leave the rest of the chain cached but unreachable.
    index = new_index(name, bs)
    ids = Ids().take(5)
    key_tokens = tokens(5 * bs)
    index.insert(TokenKey(key_tokens), ids)
    check(index)
    _assert_tail_first(index, key_tokens, ids, 2)


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_reset_refuses_while_locked_then_returns_every_block(name: str, bs: int) -> None:
    index = new_index(name, bs)
    ids = Ids()
    a, b = ids.take(3), ids.take(2)
    held = index.insert(TokenKey(tokens(3 * bs)), a)
    index.lock(held.handle)
    index.insert(TokenKey(tokens(2 * bs, start=500)), b)
    before = index.stats()
    with pytest.raises(CacheInUseError):
        index.reset()
    check(index)
    assert index.stats() == before
    assert index.match_prefix(TokenKey(tokens(3 * bs))).block_ids == a
    assert index.match_prefix(TokenKey(tokens(2 * bs, start=500))).block_ids == b
    index.unlock(held.handle)
    out = index.reset()
    check(index)
    assert sorted(out) == sorted(a + b)
    s = index.stats()
    assert (s.num_cached_blocks, s.num_evictable_blocks, s.num_locked_blocks) == (0, 0, 0)
    assert index.match_prefix(TokenKey(tokens(3 * bs))).num_tokens == 0
    assert index.reset() == []
    # The index is usable again after a reset, with the same block ids.
    index.insert(TokenKey(tokens(3 * bs)), a)
    check(index)
    assert index.match_prefix(TokenKey(tokens(3 * bs))).block_ids == a


@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_foreign_handles_are_rejected(name: str, bs: int) -> None:
    mine, other = new_index(name, bs), new_index(name, bs)
    other_res = other.insert(TokenKey(tokens(2 * bs)), [0, 1])
    other_miss = other.match_prefix(TokenKey(tokens(2 * bs, start=77)))
    mine.insert(TokenKey(tokens(2 * bs)), [0, 1])
    own = mine.match_prefix(TokenKey(tokens(2 * bs))).handle
    before = mine.stats()
    for foreign in (other_res.handle, other_miss.handle, object(), None, 0):
        with pytest.raises(InvalidHandleError):
            mine.lock(foreign)
        with pytest.raises(InvalidHandleError):
            mine.unlock(foreign)
        with pytest.raises(InvalidHandleError):
            mine.relock(own, foreign)
        with pytest.raises(InvalidHandleError):
            mine.relock(foreign, own)
        check(mine)
        assert mine.stats() == before
    # The other index was not touched by the failed calls either.
    check(other)
    assert other.stats().num_locked_blocks == 0


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_handle_of_evicted_entries_is_rejected(name: str, bs: int) -> None:
    index = new_index(name, bs)
    index.insert(TokenKey(tokens(2 * bs)), [0, 1])
    m = index.match_prefix(TokenKey(tokens(2 * bs)))
    assert m.num_tokens == 2 * bs
    assert sorted(index.evict(2)) == [0, 1]
    with pytest.raises(InvalidHandleError):
        index.lock(m.handle)
    check(index)
    assert index.stats().num_locked_blocks == 0


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_insert_with_too_few_block_ids_raises_and_registers_nothing(name: str, bs: int) -> None:
    index = new_index(name, bs)
    with pytest.raises(BlockOwnershipError):
        index.insert(TokenKey(tokens(3 * bs)), [0, 1])
    check(index)
    assert index.stats().num_cached_blocks == 0
    assert index.match_prefix(TokenKey(tokens(3 * bs))).num_tokens == 0


@pytest.mark.parametrize(("name", "bs"), CACHING_CASES)
def test_insert_rejects_a_block_id_cached_for_other_content(name: str, bs: int) -> None:
    # base.py, PrefixIndex.insert: "Raises: BlockOwnershipError: ... a block id cached
    # elsewhere". Accepting it would put one block under two contents.
    index = new_index(name, bs)
    index.insert(TokenKey(tokens(2 * bs, start=1)), [0, 1])
    before = index.stats()
    with pytest.raises(BlockOwnershipError, match="1"):
        index.insert(TokenKey(tokens(2 * bs, start=900)), [1, 7])
    check(index)
    assert index.stats() == before
    assert index.match_prefix(TokenKey(tokens(2 * bs, start=900))).num_tokens == 0


@pytest.mark.parametrize("bs", BLOCK_SIZES)
def test_none_backend_never_hits(bs: int) -> None:
    index = new_index("none", bs)
    key = TokenKey(tokens(4 * bs))
    res = index.insert(key, [0, 1, 2, 3])
    index.lock(res.handle)
    check(index)
    assert index.match_prefix(TokenKey(tokens(4 * bs))).num_tokens == 0
    assert index.stats() == (0, 0, 0, 0, 0)
    assert index.evict(10) == []
    assert index.reset() == []
    index.unlock(res.handle)
    check(index)


# ------------------------------------------------------------- through the manager


def seed_prompts() -> tuple[list[int], list[int]]:
    r = random.Random(0)
    a = [r.randrange(1, 32000) for _ in range(80)]
    b = a[:30] + [r.randrange(1, 32000) for _ in range(50)]
    return a, b


SEED_CASES = [
    pytest.param("hash_chain", 16, 64, (0, 16, 64), id="hash_chain-bs16"),
    pytest.param("radix", 1, 1024, (0, 30, 79), id="radix-page1"),
    pytest.param("radix", 16, 64, (0, 16, 64), id="radix-page16"),
    pytest.param("none", 16, 64, (0, 0, 0), id="none"),
]


def run_seed(name: str, bs: int, pool: int) -> tuple[list[int], list[list[int]]]:
    """Admit, commit and finish A, B, then A again; the hits and block tables."""
    a, b = seed_prompts()
    manager = CacheManager(make_index(name, block_size=bs), BlockAllocator(pool))
    hits, tables = [], []
    for i, prompt in enumerate((a, b, a)):
        adm = manager.admit(f"req-{i}", prompt)
        assert adm is not None
        manager.check_invariants()
        hits.append(adm.hit_tokens)
        tables.append(adm.block_table)
        manager.commit(f"req-{i}", len(prompt))
        manager.check_invariants()
        manager.finish(f"req-{i}")
        manager.check_invariants()
    assert manager.num_held_only_blocks() == 0
    stats = manager.index.stats()
    assert manager.allocator.num_free_blocks + stats.num_cached_blocks == pool
    assert stats.num_locked_blocks == 0
    return hits, tables


@pytest.mark.parametrize(("name", "bs", "pool", "want"), SEED_CASES)
def test_bb_02_b_shares_30_tokens_of_a(
    name: str, bs: int, pool: int, want: tuple[int, int, int]
) -> None:
    hits, _ = run_seed(name, bs, pool)
    assert hits[:2] == list(want[:2])


@pytest.mark.parametrize(("name", "bs", "pool", "want"), SEED_CASES)
def test_bb_03_a_again_hits_all_but_the_last_block(
    name: str, bs: int, pool: int, want: tuple[int, int, int]
) -> None:
    hits, _ = run_seed(name, bs, pool)
    assert hits == list(want)


@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_bb_01_hit_is_capped_at_len_minus_one(name: str, bs: int) -> None:
    manager = CacheManager(make_index(name, block_size=bs), BlockAllocator(256))
    for length in (1, bs, 2 * bs, 2 * bs + 1, 3 * bs - 1):
        prompt = tokens(length, start=length * 1000)
        for rid in ("first", "again"):
            adm = manager.admit(rid, prompt)
            assert adm is not None
            manager.commit(rid, length)
            manager.finish(rid)
            manager.check_invariants()
        capped = length - 1
        want = 0 if name == "none" else capped - capped % bs
        assert adm.hit_tokens == want, (length, adm)


@pytest.mark.parametrize(
    ("name", "bs", "pool"),
    [
        pytest.param("hash_chain", 16, 64, id="hash_chain"),
        pytest.param("radix", 16, 64, id="radix-page16"),
        pytest.param("none", 16, 64, id="none"),
    ],
)
def test_bb_04_token_slots_from_the_block_table(name: str, bs: int, pool: int) -> None:
    hits, tables = run_seed(name, bs, pool)
    for table in tables:
        assert len(table) == 5  # 80 tokens in blocks of 16
        assert token_slot(table, 16, bs) == table[1] * bs + 0
        assert token_slot(table, 79, bs) == table[4] * bs + 15
        slots = slot_mapping(table, 0, 80, bs)
        assert slots[16] == table[1] * bs and slots[79] == table[4] * bs + 15
        assert slots == [table[t // bs] * bs + t % bs for t in range(80)]
    # A again reads its 4 hit blocks from A's first admission.
    if hits[2]:
        assert tables[2][:4] == tables[0][:4]
