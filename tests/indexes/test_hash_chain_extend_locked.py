"""``HashChainIndex.extend_locked`` is ``insert`` then ``relock``, in one call.

The manager registers a running request's new blocks with it (its prompt after the hit,
each decoded block). Whatever a run of admissions, registrations, releases and
evictions does, an index driven through ``extend_locked`` must end in the state the two
calls give: the same entries, ref counts, free-queue order and KV events, and the same
blocks under each handle. Where the one call does not apply it answers ``None`` and
changes nothing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.indexes import HashChainIndex, TokenKey
from prefixkv.indexes.base import CacheHandle

BS = 4


class Recorder:
    """An event sink keeping every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_stored(self, hashes: Any, parent: Any, tokens: Any, bs: int, extra: Any) -> None:
        self.calls.append(("stored", list(hashes), parent, list(tokens), bs, extra))

    def on_removed(self, hashes: Any) -> None:
        self.calls.append(("removed", list(hashes)))

    def on_cleared(self) -> None:
        self.calls.append(("cleared",))


def state(index: HashChainIndex, sink: Recorder) -> tuple[Any, ...]:
    index.check_invariants()
    ids = sorted(index._blocks)
    return (
        sorted(index.cached_block_hashes()),
        index.free_queue_block_ids(),
        [(b, index.ref_cnt(b)) for b in ids],
        index.stats(),
        sink.calls,
    )


class Side:
    """One index and its requests: ``fast`` registers with ``extend_locked``."""

    def __init__(self, fast: bool) -> None:
        self.fast = fast
        self.sink = Recorder()
        self.index = HashChainIndex(BS, seed=7, check_block_ids=False)
        self.index.set_event_sink(self.sink)
        self.running: dict[int, tuple[TokenKey, list[int], CacheHandle]] = {}
        self.took_fast = 0

    def register(self, rid: int, num_tokens: int) -> None:
        key, table, handle = self.running[rid]
        new: CacheHandle | None = None
        if self.fast:
            new = self.index.extend_locked(key, table, num_tokens, handle)
            self.took_fast += new is not None
        if new is None:
            new = self.index.insert(key, table, num_tokens, prefix=handle).handle
            assert self.index.relock(handle, new) == []
        self.running[rid] = (key, table, new)


def run(side: Side, ops: list[tuple[int, int, int]], prompts: list[list[int]]) -> list[Any]:
    states = []
    next_id = 0
    free: list[int] = []
    for kind, a, b in ops:
        rid = a % 4
        if kind == 0 and rid not in side.running:  # admit: lock the hit, take blocks
            key = TokenKey(prompts[b % len(prompts)])
            m = side.index.match_prefix(key, len(key) - 1)
            side.index.lock(m.handle)
            table = list(m.block_ids)
            while len(table) * BS < len(key):
                if free:
                    table.append(free.pop())
                else:
                    table.append(next_id)
                    next_id += 1
            side.running[rid] = (key, table, m.handle)
            side.register(rid, len(key) - b % BS)
        elif kind == 1 and rid in side.running:  # decode: tokens, maybe a block, register
            key, table, _ = side.running[rid]
            key.append([b % 50 + 1] * (1 + a % 5))
            while len(table) * BS < len(key):
                table.append(free.pop() if free else next_id)
                next_id += 0 if free else 1
            side.register(rid, len(key))
        elif kind == 2 and rid in side.running:  # finish
            _, table, handle = side.running.pop(rid)
            side.index.unlock(handle)
            n = sum(1 for b in table if side.index.ref_cnt(b) < 0)
            free += [b for b in table[::-1] if side.index.ref_cnt(b) < 0][:n]
        elif kind == 3:
            free += side.index.evict(b % 6)
        states.append(state(side.index, side.sink))
    return states


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 3), min_size=5, max_size=30), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 50)), max_size=40),
)
def test_extend_locked_leaves_the_state_insert_and_relock_leave(
    prompts: list[list[int]], ops: list[tuple[int, int, int]]
) -> None:
    shared = [5, 6, 7, 8, 9, 10, 11, 12]  # a common head, so requests hit each other
    full = [shared + p for p in prompts]
    fast, slow = Side(True), Side(False)
    assert run(fast, ops, full) == run(slow, ops, full)
    for rid, (_, _, handle) in fast.running.items():
        other = slow.running[rid][2]
        assert handle.length == other.length  # type: ignore[attr-defined]
        assert [b.block_id for b in handle.blocks()] == [  # type: ignore[attr-defined]
            b.block_id
            for b in other.blocks()  # type: ignore[attr-defined]
        ]


def test_a_request_registering_its_own_fresh_blocks_takes_the_one_call() -> None:
    side = Side(True)
    run(side, [(0, 0, 0), (1, 0, 3), (1, 0, 4)], [list(range(1, 14))])
    assert side.took_fast == 3


def test_it_answers_none_and_changes_nothing_where_it_does_not_apply() -> None:
    index = HashChainIndex(BS, seed=7)
    other = HashChainIndex(BS, seed=7)
    key = TokenKey(range(1, 13))
    m = index.match_prefix(key)
    index.lock(m.handle)
    before = (index.stats(), index.free_queue_block_ids(), index.cached_block_hashes())
    cases: list[tuple[Any, Any, Any]] = [
        ([0, 1, 2], 12, other.match_prefix(key).handle),  # another index's handle
        ([0, 1, 2], 13, m.handle),  # more tokens than the key has
        ([0, 1], 12, m.handle),  # too few block ids
        ((0, 1, 2), 12, m.handle),  # not a list
        ([0, 1, 0], 12, m.handle),  # repeated ids are checked (check_block_ids)
        (["0", 1, 2], 4, m.handle),  # not an int
        ([-1, 1, 2], 4, m.handle),  # not a block id
    ]
    for ids, n, handle in cases:
        assert index.extend_locked(key, ids, n, handle) is None
    assert (index.stats(), index.free_queue_block_ids(), index.cached_block_hashes()) == before
    index.insert(TokenKey(range(50, 58)), [7, 8])  # block 7 cached for other content
    before = (index.stats(), index.free_queue_block_ids(), index.cached_block_hashes())
    assert index.extend_locked(key, [7], 4, m.handle) is None
    assert (index.stats(), index.free_queue_block_ids(), index.cached_block_hashes()) == before
    index.check_invariants()
