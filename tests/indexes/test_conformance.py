"""One conformance suite for every registered prefix index, plus the manager-level seed facts.

Every backend ``available_indexes()`` lists is run through the same contract
(``indexes/base.py``) at block sizes 1, 2 and 16; ``check_invariants()`` and the stats
identity ``cached == evictable + locked`` are checked after every step. The manager
tests replay SPEC BB-1..BB-4 through ``CacheManager`` for each backend.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes import (
    BlockOwnershipError,
    HashChainIndex,
    IndexWrapper,
    NoPrefixIndex,
    PrefixIndex,
    PrefixKVError,
    TokenKey,
    available_indexes,
    make_index,
)
from prefixkv.indexes.registry import IndexRegistry
from prefixkv.indexes.testing import CONFORMANCE_CASES, check, check_conformance
from prefixkv.storage import BlockAllocator, slot_mapping, token_slot

BACKENDS = available_indexes()
BLOCK_SIZES = (1, 2, 16)
# "none" is the no-cache baseline: it registers nothing, so cache-content tests skip it.
CACHING = [name for name in BACKENDS if name != "none"]

ALL_CASES = [pytest.param(n, bs, id=f"{n}-bs{bs}") for n in BACKENDS for bs in BLOCK_SIZES]
CACHING_CASES = [pytest.param(n, bs, id=f"{n}-bs{bs}") for n in CACHING for bs in BLOCK_SIZES]


def test_builtin_backends_are_registered() -> None:
    assert {"hash_chain", "radix", "none"} <= set(BACKENDS)


def test_a_registry_imports_a_backend_when_first_named_and_counts_it_taken_before() -> None:
    homes = {"lazy_chain": "prefixkv.indexes.hash_chain:HashChainIndex"}
    registry = IndexRegistry(homes)
    assert registry.names() == ["lazy_chain"] and not registry._factories  # nothing loaded
    with pytest.raises(PrefixKVError, match="registered already"):
        registry.register("lazy_chain", HashChainIndex)
    assert isinstance(registry.make("lazy_chain", 4), HashChainIndex)
    assert registry.describe("lazy_chain") == HashChainIndex.DESCRIPTION
    replaced = IndexRegistry(homes)
    replaced.register("lazy_chain", NoPrefixIndex, replace=True)  # before its first use
    assert isinstance(replaced.make("lazy_chain", 4), NoPrefixIndex)


def new_index(name: str, block_size: int) -> PrefixIndex:
    index = make_index(name, block_size=block_size)
    check(index)
    return index


def tokens(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


class Ids:
    """Distinct block ids, like an allocator that never reuses."""

    def __init__(self) -> None:
        self._it: Iterator[int] = iter(range(10**6))

    def take(self, n: int) -> list[int]:
        return [next(self._it) for _ in range(n)]


# --------------------------------------------- the shipped suite, every backend


@pytest.mark.parametrize("case", sorted(CONFORMANCE_CASES))
@pytest.mark.parametrize(("name", "bs"), ALL_CASES)
def test_conformance(name: str, bs: int, case: str) -> None:
    CONFORMANCE_CASES[case](lambda size: make_index(name, block_size=size), bs)


def test_a_backend_registered_by_entry_point_runs_the_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A third party ships a module and an entry point in the prefixkv.indexes group;
    # the registry finds it on first use and the shipped suite runs against it.
    (tmp_path / "third_party_index.py").write_text(
        "from prefixkv.indexes import RadixIndex, SynchronizedIndex\n"
        "def shared_radix(block_size=1):\n"
        "    return SynchronizedIndex(RadixIndex(block_size))\n"
    )
    info = tmp_path / "third_party_index-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: third-party-index\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[prefixkv.indexes]\nshared_radix = third_party_index:shared_radix\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = IndexRegistry()
    assert "shared_radix" in registry.names()
    check_conformance(lambda size: registry.make("shared_radix", size))
    # The suite has teeth: a backend that forgets to count a lock fails it.

    class ForgetsLocks(IndexWrapper):
        def lock(self, handle: object) -> None:
            pass

    with pytest.raises(AssertionError, match="block_size 1"):
        check_conformance(lambda size: ForgetsLocks(make_index("hash_chain", block_size=size)))


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
