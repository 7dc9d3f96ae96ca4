"""The radix tree's cached hit paths: a match over several nodes is kept on its last
node, and the next match through that branch (a conversation's next turn) jumps to it,
extending the kept list in place once no caller holds it. Nothing a caller can see may
change: hits, block lists a caller holds, recency (eviction order)."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.indexes import RadixIndex, TokenKey


def toks(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 32000) for _ in range(n)]


def forget_hit_paths(index: RadixIndex) -> None:
    """Drop every cached hit path and jump: the tree then walks node by node."""
    stack: list[Any] = list(index._roots.values())
    while stack:
        node = stack.pop()
        node.path, node.path_key, node.jump = None, b"", None
        stack.extend(node.children.values())


def test_a_conversations_next_turn_gets_the_cached_path_and_its_own_blocks() -> None:
    index = RadixIndex()
    system = toks(40, seed=1)
    history = system + toks(10, seed=2)
    index.insert(TokenKey(history), list(range(len(history))))
    other = system + toks(7, seed=3)  # a second branch under the system prompt
    index.insert(TokenKey(other), [*range(40), *range(500, 507)])
    block = 1000
    for turn in range(5):  # each turn: the history plus a user message, then its answer
        prompt = history + toks(6, seed=10 + turn)
        m = index.match_prefix(TokenKey(prompt), len(prompt) - 1)
        assert m.num_tokens == len(history)
        assert m.block_ids == index.cached_blocks(TokenKey(history))
        again = index.match_prefix(TokenKey(prompt), len(prompt) - 1)
        assert again.block_ids == m.block_ids
        if turn == 0:  # the hit list itself is kept, and lent again while it is all
            assert again.block_ids is m.block_ids
        answer = toks(4, seed=100 + turn)
        new = len(prompt) + len(answer) - len(history)
        index.insert(TokenKey(prompt + answer), [*m.block_ids, *range(block, block + new)])
        block += new
        history = prompt + answer
        index.check_invariants()
    assert index.match_prefix(TokenKey(other)).block_ids == [*range(40), *range(500, 507)]
    index.check_invariants()


def test_a_cached_path_past_the_cap_or_with_other_tokens_is_not_taken() -> None:
    index = RadixIndex()
    a = toks(30, seed=1)
    b = a + toks(20, seed=2)
    index.insert(TokenKey(a), list(range(30)))
    index.insert(TokenKey(b), list(range(50)))
    assert index.match_prefix(TokenKey(b)).block_ids == list(range(50))  # cached
    changed = list(b)
    changed[45] ^= 1
    assert index.match_prefix(TokenKey(changed)).block_ids == list(range(45))
    assert index.match_prefix(TokenKey(b)).block_ids == list(range(50))
    assert index.match_prefix(TokenKey(b), 40).block_ids == list(range(40))  # the cap
    assert index.match_prefix(TokenKey(b)).block_ids == list(range(50))
    index.check_invariants()


def test_a_jump_stamps_the_nodes_it_skips_as_a_walk_would() -> None:
    # a (nodes A, B) is cached on B, jumped to from A; the match ends at B, over C
    # and a newer branch y: B and A must come after y in LRU order, as walked.
    index = RadixIndex()
    a, b, c = toks(30, seed=1), toks(20, seed=2), toks(10, seed=3)
    index.insert(TokenKey(a), list(range(30)))
    index.insert(TokenKey(a + b), list(range(50)))
    assert index.match_prefix(TokenKey(a + b)).num_tokens == 50  # cached on B
    index.insert(TokenKey(a + b + c), list(range(60)))
    index.insert(TokenKey(toks(10, seed=4)), list(range(100, 110)))
    assert index.match_prefix(TokenKey(a + b + c), 50).num_tokens == 50  # the jump
    assert index.evict(10**6) == [*range(50, 60), *range(100, 110), *range(30, 50), *range(30)]
    index.check_invariants()


def test_a_kept_path_no_caller_holds_is_extended_in_place_and_a_held_one_never_changes() -> None:
    index = RadixIndex()
    history = toks(40, seed=1)
    index.insert(TokenKey(history), list(range(40)))
    block, lists, held = 1000, [], None
    for turn in range(6):
        prompt = history + toks(5, seed=10 + turn)
        m = index.match_prefix(TokenKey(prompt), len(prompt) - 1)
        assert m.block_ids == index.cached_blocks(TokenKey(history))
        lists.append(id(m.block_ids))
        if turn == 4:  # this caller keeps its hit: the next turn's may not grow it
            held = (m.block_ids, list(m.block_ids))
        history = prompt + toks(3, seed=100 + turn)
        ids = [*m.block_ids, *range(block, block + len(history) - m.num_tokens)]
        block += len(history) - m.num_tokens
        del m  # the caller lets its hit go
        index.insert(TokenKey(history), ids)
        index.check_invariants()
    # turn 0: the one node's own list; 1: a new list, kept; 2-4: that list, extended in
    # place; 5: a copy, turn 4's caller holding the kept list still
    assert lists[1] == lists[2] == lists[3] == lists[4] != lists[5]
    assert held is not None and held[0] == held[1]


TURN = st.tuples(
    st.integers(0, 3),  # which conversation
    st.integers(0, 8),  # user tokens
    st.integers(1, 6),  # answer tokens
    st.sampled_from([None, "evict", "lock", "unlock", "cap"]),
    st.integers(1, 30),
    st.booleans(),  # whether the caller keeps the hit's list
)


@settings(max_examples=150, deadline=None)
@given(page=st.sampled_from([1, 2]), turns=st.lists(TURN, max_size=40))
def test_hit_paths_change_no_hit_no_held_list_and_no_eviction_order(
    page: int, turns: list[tuple[int, int, int, str | None, int, bool]]
) -> None:
    # The same conversations through two trees, one of which forgets its hit paths
    # before every match: equal hits, equal evictions, and lists that never change
    # while their caller holds them (the others the tree may extend in place).
    cached, plain = RadixIndex(page), RadixIndex(page)
    system = toks(12, seed=0)
    histories = [system + toks(3 * k, seed=k) for k in range(4)]
    handed: list[tuple[list[int], list[int]]] = []
    locks: list[tuple[object, object]] = []
    block = 0
    for n, (who, user, answer, extra, amount, keep) in enumerate(turns):
        prompt = histories[who] + toks(user, seed=1000 + n)
        cap = amount if extra == "cap" else len(prompt) - 1
        forget_hit_paths(plain)
        m, p = (t.match_prefix(TokenKey(prompt), cap) for t in (cached, plain))
        assert (m.num_tokens, m.block_ids) == (p.num_tokens, p.block_ids)
        assert m.block_ids == plain.cached_blocks(TokenKey(prompt), cap)
        if keep:
            handed.append((m.block_ids, list(m.block_ids)))
        if extra == "lock":
            cached.lock(m.handle)
            plain.lock(p.handle)
            locks.append((m.handle, p.handle))
        elif extra == "unlock" and locks:
            for t, h in zip((cached, plain), locks.pop(), strict=True):
                t.unlock(h)
        full = prompt + toks(answer, seed=2000 + n)
        new = len(full) // page - len(m.block_ids)
        ids = [*m.block_ids, *range(block, block + new)]
        block += new
        del m, p  # only handed holds a hit's list now
        for t in (cached, plain):
            t.insert(TokenKey(full), ids)
        histories[who] = full
        if extra == "evict":
            assert cached.evict(amount) == plain.evict(amount)
        cached.check_invariants()
        for got, snapshot in handed:
            assert got == snapshot
    assert cached.evict(10**6) == plain.evict(10**6)
    cached.check_invariants()
