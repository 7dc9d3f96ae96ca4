"""Scenario tests of the radix tree, one per SPEC RX / SG fact, pinning splits and
exact eviction order."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters import CacheManager
from prefixkv.indexes import PrefixKVError, RadixIndex, TokenKey, make_index
from prefixkv.indexes.eviction import EvictionQueue, LFUPolicy, LRUPolicy, NodeStats
from prefixkv.storage import BlockAllocator


def toks(n: int, seed: int = 0, lo: int = 1) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(lo, 32000) for _ in range(n)]


def insert(index: RadixIndex, tokens: list[int], first_block: int, **kw: object) -> list[int]:
    n = len(tokens) // index.block_size
    res = index.insert(TokenKey(tokens, **kw), list(range(first_block, first_block + n)))  # type: ignore[arg-type]
    index.check_invariants()
    return res.block_ids


def test_rx_01_page_size_defaults_to_one_and_keys_are_page_aligned() -> None:
    assert RadixIndex().block_size == 1
    assert make_index("radix").block_size == 1
    index = RadixIndex(4)
    res = index.insert(TokenKey(list(range(1, 11))), [0, 1, 2])  # 10 tokens -> 8 inserted
    assert res.block_ids == [0, 1] and index.stats().num_cached_blocks == 2
    m = index.match_prefix(TokenKey(list(range(1, 8))))  # 7 tokens -> 4 matched
    assert m.num_tokens == 4 and m.block_ids == [0]


def test_rx_02_children_keyed_by_first_page() -> None:
    index = RadixIndex(2)
    insert(index, [1, 2, 3, 4], 0)
    insert(index, [1, 3, 5, 6], 10)  # same first token, different first page
    assert index.stats().num_entries == 2
    assert index.match_prefix(TokenKey([1, 3, 5, 6, 7])).block_ids == [10, 11]


@pytest.mark.parametrize("page", [1, 16])
def test_rx_03_match_ending_inside_a_segment_splits_the_node(page: int) -> None:
    index = RadixIndex(page)
    a = toks(10 * page)
    insert(index, a, 0)
    assert index.stats().num_entries == 1
    probe = a[: 4 * page] + toks(3 * page, seed=9)
    m = index.match_prefix(TokenKey(probe))
    assert m.num_tokens == 4 * page
    assert m.block_ids == list(range(4 * page // page))
    assert index.stats().num_entries == 2  # split at the hit: the handle covers exactly it
    index.check_invariants()
    index.lock(m.handle)
    assert index.protected_size() == 4 * page // page  # only the hit's node is locked


@pytest.mark.parametrize("page", [1, 16])
def test_rx_04_insert_diverging_inside_a_segment_splits_and_reports_cached_prefix(
    page: int,
) -> None:
    index = RadixIndex(page)
    a = toks(6 * page)
    insert(index, a, 0)
    b = a[: 2 * page] + toks(5 * page, seed=3)
    res = index.insert(TokenKey(b), list(range(100, 107)))
    assert res.num_cached_tokens == 2 * page
    # The tree keeps its own blocks for the shared part; the caller's are duplicates.
    assert res.block_ids == [0, 1, 102, 103, 104, 105, 106]
    assert index.stats().num_entries == 3  # shared node + two branches
    index.check_invariants()


def test_rx_05_lock_ref_moves_sizes_and_unlock_never_deletes() -> None:
    index = RadixIndex(1)
    insert(index, [1, 2, 3, 4], 0)
    insert(index, [1, 2, 7, 8], 10)  # splits: [1,2] -> {[3,4], [7,8]}
    m = index.match_prefix(TokenKey([1, 2, 3, 4]))
    index.lock(m.handle)
    assert index.protected_size() == 4 and index.evictable_size() == 2
    index.lock(m.handle)
    index.unlock(m.handle)
    assert index.protected_size() == 4  # still one lock
    index.unlock(m.handle)
    assert index.protected_size() == 0 and index.evictable_size() == 6
    assert index.stats().num_cached_blocks == 6  # nothing deleted
    index.check_invariants()


def test_rx_06_eviction_is_leaf_first_whole_nodes_lru_then_parents() -> None:
    index = RadixIndex(1)
    insert(index, [1, 2, 3, 4], 0)  # tick order: a
    insert(index, [1, 2, 7, 8, 9], 10)  # b, splits [1,2]
    insert(index, [5, 6], 20)  # c
    # Leaves: [3,4] (a), [7,8,9] (b), [5,6] (c); [1,2] is an inner node.
    assert index.evict(1) == [2, 3]  # the LRU leaf, whole (overshoots the 1 asked)
    assert index.evict(1) == [12, 13, 14]  # next leaf; now [1,2] is a leaf too
    assert index.evict(3) == [0, 1, 20, 21]  # [1,2] (older) then [5,6]
    assert index.stats().num_cached_blocks == 0
    index.check_invariants()


def test_rx_06_locked_leaves_and_their_paths_are_never_evicted() -> None:
    index = RadixIndex(1)
    insert(index, [1, 2, 3], 0)
    insert(index, [1, 2, 9], 10)
    m = index.match_prefix(TokenKey([1, 2, 3]))
    index.lock(m.handle)
    assert index.evict(100) == [12]  # only [9]; [1,2] and [3] are locked
    index.check_invariants()


def test_rx_06_match_refreshes_recency() -> None:
    index = RadixIndex(1)
    insert(index, [1, 2], 0)
    insert(index, [3, 4], 10)
    index.match_prefix(TokenKey([1, 2]))  # [1,2] is now the most recent
    assert index.evict(1) == [10, 11]


def test_sg_05_split_and_insert_create_later_stamps() -> None:
    index = RadixIndex(1)
    insert(index, [1, 2, 3, 4], 0)
    insert(index, [9], 20)
    # Matching [1,2] splits [1..4]: the lower part [3,4] keeps the match's stamp,
    # the new upper node [1,2] gets a later one; [9] is older than both.
    index.match_prefix(TokenKey([1, 2]))
    assert index.evict(1) == [20]
    assert index.evict(1) == [2, 3]
    assert index.evict(1) == [0, 1]


def test_rx_07_lfu_evicts_least_inserted_first() -> None:
    index = RadixIndex(1, eviction="lfu")
    insert(index, [1, 2], 0)
    for extra in ([1, 2, 5], [1, 2, 6]):  # each insert through [1,2] counts a hit
        key = TokenKey(extra)
        index.insert(key, [0, 1, 30 + extra[2]])
    insert(index, [3, 4], 10)  # newer but used once
    # Leaves: [5] (1 hit), [6] (1 hit), [3,4] (1 hit); [1,2] (3 hits) is inner.
    assert index.evict(1) == [35]  # LRU among the least used
    assert index.evict(1) == [36]
    # Now [1,2] is a leaf too, with 3 hits: the once-used [3,4] goes first.
    assert index.evict(1) == [10, 11]
    assert index.evict(1) == [0, 1]
    index.check_invariants()


def test_rx_07_lfu_keeps_a_hot_old_leaf() -> None:
    index = RadixIndex(1, eviction="lfu")
    hot = TokenKey([1, 2])
    index.insert(hot, [0, 1])
    for _ in range(3):  # three more requests register the same sequence
        index.insert(TokenKey([1, 2]), [0, 1])
    insert(index, [3, 4], 10)
    assert index.evict(1) == [10, 11]  # the newer but colder leaf goes first
    lru = RadixIndex(1)
    lru.insert(TokenKey([1, 2]), [0, 1])
    lru.insert(TokenKey([3, 4]), [10, 11])
    assert lru.evict(1) == [0, 1]


def test_rx_07_priority_evicts_low_priority_first() -> None:
    index = RadixIndex(1, eviction="priority")
    index.insert(TokenKey([1, 2], priority=5), [0, 1])
    index.insert(TokenKey([3, 4], priority=0), [10, 11])
    index.insert(TokenKey([5, 6], priority=9), [20, 21])
    assert index.evict(1) == [10, 11]
    assert index.evict(1) == [0, 1]
    assert index.evict(1) == [20, 21]


def test_rx_07_unknown_policy_is_a_named_error() -> None:
    with pytest.raises(PrefixKVError, match="lru"):
        RadixIndex(1, eviction="random")


def test_sg_04_finish_splits_at_the_prompt_boundary() -> None:
    m = CacheManager(RadixIndex(1), BlockAllocator(64))
    prompt = [1, 2, 3, 4, 5]
    adm = m.admit("a", prompt)
    assert adm is not None
    m.commit("a", 5)
    for t in (6, 7, 8):
        assert m.append("a", [t])
    m.commit("a", 8)
    m.finish("a")
    index = m.index
    assert isinstance(index, RadixIndex)
    assert index.stats().num_entries == 2  # prompt node + output leaf
    freed = index.evict(1)
    assert len(freed) == 3  # the output leaf goes first, the prompt survives
    assert index.match_prefix(TokenKey(prompt + [9])).num_tokens == 5
    index.check_invariants()


def test_shared_1013_token_prefix_survives_heavy_eviction_of_suffixes() -> None:
    shared = toks(1013, seed=1)
    m = CacheManager(RadixIndex(1), BlockAllocator(1013 + 3 * 400))
    hits = []
    for i in range(60):
        prompt = shared + toks(random.Random(i).randrange(200, 400), seed=100 + i)
        adm = m.admit(f"r{i}", prompt)
        assert adm is not None
        hits.append(adm.hit_tokens)
        m.commit(f"r{i}", len(prompt))
        m.finish(f"r{i}")
        m.check_invariants()
    assert m.totals.num_evicted_blocks > 10 * 400  # suffixes were evicted over and over
    assert hits[0] == 0 and all(h == 1013 for h in hits[1:])


# Token ids that agree in some of their four bytes and differ in the others (all but the
# first and last end in the byte 0x01): a child key or a segment compare that read less
# than every byte of a token would mix them up.
SHARED_BYTES = st.sampled_from([0, 1, 257, 65_537, 16_777_217, 2**32 - 255, 2**32 - 1])


@pytest.mark.parametrize("page", [1, 2])
def test_tokens_that_share_bytes_get_children_of_their_own(page: int) -> None:
    # Each id above begins a child of its own, under the root and under a node: a child
    # key that read less than all four bytes would file two of them under one key.
    ids = [0, 1, 257, 65_537, 16_777_217, 2**32 - 255, 2**32 - 1]
    for above in ([], [7] * page):
        shared = len(above) // page  # pages above the children, held by the first insert
        index = RadixIndex(page)
        for k, t in enumerate(ids):
            insert(index, above + [t] * page + [5] * page, k * (shared + 2))
        for k, t in enumerate(ids):
            m = index.match_prefix(TokenKey(above + [t] * page + [5] * page))
            own = k * (shared + 2) + shared
            assert m.block_ids == [*range(shared), own, own + 1], t


# A sequence: fresh tokens, or an earlier one cut and extended, or with one token changed
# (so a node's only child can differ from the tokens in its first token alone).
SEQUENCE = st.tuples(
    st.sampled_from(["fresh", "cut", "change"]),
    st.integers(0, 100),
    st.integers(0, 14),
    st.lists(SHARED_BYTES, max_size=14),
)
OPS = st.lists(st.tuples(st.booleans(), SEQUENCE, st.none() | st.integers(0, 16)), max_size=30)


def _sequence(earlier: list[list[int]], how: tuple[str, int, int, list[int]]) -> list[int]:
    kind, which, cut, tokens = how
    if kind == "fresh" or not earlier:
        return tokens
    base = earlier[which % len(earlier)]
    if kind == "cut":
        return base[:cut] + tokens
    changed = list(base)
    if cut < len(changed):
        changed[cut] = tokens[0] if tokens and tokens[0] != base[cut] else base[cut] ^ 1
    return changed


@settings(max_examples=300)  # each example a handful of tree operations
@given(page=st.sampled_from([1, 2, 3]), ops=OPS)
def test_match_and_insert_agree_with_a_model_on_tokens_that_share_bytes(
    page: int, ops: list[tuple[bool, tuple[str, int, int, list[int]], int | None]]
) -> None:
    # Without eviction, the tree holds every page-aligned prefix inserted, with the block
    # of its last page given by the first insert that reached it.
    index = RadixIndex(page)
    model: dict[tuple[int, ...], int] = {}
    earlier: list[list[int]] = []
    next_block = 0
    for is_insert, how, cap in ops:
        tokens = _sequence(earlier, how)
        earlier.append(tokens)
        key = TokenKey(tokens)
        if is_insert:
            pages = len(tokens) // page
            ids = list(range(next_block, next_block + pages))
            next_block += pages
            cached = 0
            while cached < pages and tuple(tokens[: (cached + 1) * page]) in model:
                cached += 1
            for p in range(pages):
                model.setdefault(tuple(tokens[: (p + 1) * page]), ids[p])
            res = index.insert(key, ids)
            assert res.num_cached_tokens == cached * page
            assert res.block_ids == [model[tuple(tokens[: (p + 1) * page])] for p in range(pages)]
        else:
            limit = len(tokens) if cap is None else min(cap, len(tokens))
            hit = 0
            while (hit + 1) * page <= limit and tuple(tokens[: (hit + 1) * page]) in model:
                hit += 1
            want = [model[tuple(tokens[: (p + 1) * page])] for p in range(hit)]
            assert index.cached_blocks(key, cap) == want
            m = index.match_prefix(key, cap)
            assert (m.num_tokens, m.block_ids) == (hit * page, want)
        index.check_invariants()


def test_namespaces_get_separate_subtrees() -> None:
    index = RadixIndex(1)
    index.insert(TokenKey([1, 2, 3], "tenant-a"), [0, 1, 2])
    assert index.match_prefix(TokenKey([1, 2, 3, 4], "tenant-b")).num_tokens == 0
    assert index.match_prefix(TokenKey([1, 2, 3, 4])).num_tokens == 0
    assert index.match_prefix(TokenKey([1, 2, 3, 4], "tenant-a")).num_tokens == 3
    assert index.evict(10) == [0, 1, 2]
    index.check_invariants()


class _Stats:
    """A node as the eviction queue sees it."""

    def __init__(self, created: int) -> None:
        self.created = created
        self.last_access = created
        self.hit_count = 0
        self.priority = 0
        self.evict_key: tuple[tuple[int, ...], int] | None = None


class _EagerLFU:
    """LFU's keys, re-filed at every touch (no ``monotone``)."""

    name = "eager-lfu"

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        return LFUPolicy().sort_key(node)


class _MRU:
    """Most recently used first: a key that decreases when a node is touched."""

    name = "mru"

    def sort_key(self, node: NodeStats) -> tuple[int, ...]:
        return (-node.last_access,)


@pytest.mark.parametrize("seed", range(20))
def test_rx_07_lazy_refiling_evicts_in_the_order_of_current_keys(seed: int) -> None:
    # A monotone policy's queue re-files touched candidates only when they reach the
    # front; its pops must equal a queue that re-files at every touch.
    rng = random.Random(seed)
    lazy, eager = EvictionQueue(LFUPolicy()), EvictionQueue(_EagerLFU())
    nodes: dict[str, list[_Stats]] = {"lazy": [], "eager": []}
    for tick in range(1, 301):
        op = rng.random()
        if op < 0.35 or not nodes["lazy"]:
            for name, q in (("lazy", lazy), ("eager", eager)):
                node = _Stats(tick)
                nodes[name].append(node)
                q.add(node)
        elif op < 0.8:
            i = rng.randrange(len(nodes["lazy"]))
            bump = rng.random() < 0.3
            for name, q in (("lazy", lazy), ("eager", eager)):
                node = nodes[name][i]
                node.last_access = tick
                node.hit_count += bump
                q.rekey(node)
        else:
            got = [q.pop().created for q in (lazy, eager)]
            assert got[0] == got[1]
            for name in nodes:
                nodes[name] = [n for n in nodes[name] if n.created != got[0]]
        lazy.check_invariants()
        eager.check_invariants()
    assert [lazy.pop().created for _ in range(len(lazy))] == [
        eager.pop().created for _ in range(len(eager))
    ]


def test_rx_07_a_policy_whose_key_can_decrease_is_refiled_at_every_touch() -> None:
    q = EvictionQueue(_MRU())
    a, b = _Stats(1), _Stats(2)
    q.add(a)
    q.add(b)
    a.last_access = 3
    q.rekey(a)  # a is now the most recent: first out
    q.check_invariants()
    assert q.pop() is a and q.pop() is b


def test_rx_07_a_monotone_policy_whose_key_decreased_fails_the_check() -> None:
    q = EvictionQueue(LRUPolicy())
    a = _Stats(5)
    q.add(a)
    a.last_access = 1  # a key moving back breaks the monotone promise
    with pytest.raises(AssertionError, match="decreased"):
        q.check_invariants()


# ----------------------------------------------- lent lists (match and insert results)


def test_a_hit_in_one_node_is_that_nodes_list_and_eviction_leaves_it_as_it_was() -> None:
    # The lookup of a hit held by one node returns the node's own list (no copy); when
    # that node is evicted first and another after it, the evicted ids must be a new
    # list, not the lent one grown by the second leaf's ids.
    index = RadixIndex()
    a, b = toks(50, seed=1), toks(40, seed=2)
    insert(index, a, 0)
    m = index.match_prefix(TokenKey(a))
    assert m.block_ids == list(range(50))
    again = index.match_prefix(TokenKey(a))
    assert again.block_ids is m.block_ids  # lent, not copied
    insert(index, b, 100)  # newer: a is evicted first
    evicted = index.evict(90)
    assert evicted == [*range(50), *range(100, 140)]
    assert m.block_ids == list(range(50))  # what the lookup returned did not change
    index.check_invariants()


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "match", "evict", "lock"]),
            st.integers(0, 5),  # which key
            st.integers(1, 40),  # length / blocks to evict
        ),
        max_size=40,
    )
)
def test_no_list_a_lookup_or_insert_returned_ever_changes(
    ops: list[tuple[str, int, int]],
) -> None:
    # Whatever the tree does later (splits, eviction, more inserts), block ids it
    # handed out (lent or copied) keep their contents, and still equal a fresh copy.
    index = RadixIndex(check_block_ids=True)
    keys = [toks(5, seed=0) + toks(40, seed=k) if k % 2 else toks(45, seed=k) for k in range(6)]
    handed: list[tuple[list[int], list[int]]] = []
    next_block = 0
    locks = []
    for op, which, n in ops:
        key = TokenKey(keys[which][:n])
        if op == "insert":
            hit = index.cached_blocks(key)
            fresh = list(range(next_block, next_block + n - len(hit)))
            next_block += len(fresh)
            res = index.insert(key, [*hit, *fresh])
            handed.append((res.block_ids, list(res.block_ids)))
        elif op == "match":
            m = index.match_prefix(key)
            handed.append((m.block_ids, list(m.block_ids)))
        elif op == "lock":
            m = index.match_prefix(key)
            index.lock(m.handle)
            locks.append(m.handle)
        else:
            index.evict(n)
        index.check_invariants()
        for got, snapshot in handed:
            assert got == snapshot
    for handle in locks:
        index.unlock(handle)
    index.evict(10**6)
    for got, snapshot in handed:
        assert got == snapshot
    index.check_invariants()
