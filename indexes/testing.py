"""The conformance suite every prefix index passes, shipped so a third-party backend
can run it without the repository (as structlog ships its test doubles).

Each case takes a factory ``make(block_size) -> PrefixIndex`` and a block size, builds
fresh indexes, and checks ``check_invariants()`` and the stats identity
``cached == evictable + locked`` after every step. A backend whose description says
it caches nothing (``IndexDescription.caches``) is held to the miss-only contract.

Use it from any test runner::

    from prefixkv.indexes.testing import check_conformance
    check_conformance(lambda bs: MyIndex(block_size=bs))

or one case at a time (``CONFORMANCE_CASES``, e.g. in ``pytest.mark.parametrize``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType

from .base import PrefixIndex, describe
from .errors import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    LockStateError,
    PrefixKVError,
)
from .tokens import TokenKey
from .validation import ceil_div

__all__ = ["BLOCK_SIZES", "CONFORMANCE_CASES", "IndexFactory", "check", "check_conformance"]

IndexFactory = Callable[[int], PrefixIndex]
"""Builds a fresh, empty index with the given block size."""

BLOCK_SIZES = (1, 2, 16)
"""The block sizes every case runs at by default."""


def check(index: PrefixIndex) -> None:
    """The per-step checks: internal invariants and the stats identity."""
    index.check_invariants()
    s = index.stats()
    assert s.num_cached_blocks == s.num_evictable_blocks + s.num_locked_blocks, s
    assert min(s) >= 0, s


@contextmanager
def _raises(exc: type[PrefixKVError]) -> Iterator[None]:
    try:
        yield
    except exc:
        return
    raise AssertionError(f"expected {exc.__name__}")


def _tokens(n: int, start: int = 1) -> list[int]:
    return list(range(start, start + n))


def _new(make: IndexFactory, bs: int) -> tuple[PrefixIndex, bool]:
    index = make(bs)
    assert isinstance(index, PrefixIndex), f"{index!r} does not implement PrefixIndex"
    assert index.block_size == bs, f"block_size {index.block_size}, asked for {bs}"
    check(index)
    return index, describe(index).caches


# --------------------------------------------------------------------- cases


def empty_index_misses(make: IndexFactory, bs: int) -> None:
    """A miss has no blocks; its handle is valid and pins nothing."""
    index, _ = _new(make, bs)
    m = index.match_prefix(TokenKey(_tokens(3 * bs + 1)))
    assert (m.num_tokens, m.block_ids, index.count_evictable(m.handle)) == (0, [], 0)
    index.lock(m.handle)
    check(index)
    assert index.stats().num_cached_blocks == 0
    index.unlock(m.handle)
    check(index)


def insert_then_match_is_block_aligned_and_capped(make: IndexFactory, bs: int) -> None:
    """Hits are whole blocks, capped by ``max_num_tokens``, all evictable when unlocked."""
    length = 40
    for cap in (None, 0, 1, 5, 15, 16, 17, 31, 32, 33, 39, 40):
        index, caches = _new(make, bs)
        ids = list(range(ceil_div(length, bs)))
        index.insert(TokenKey(_tokens(length)), ids)
        check(index)
        m = index.match_prefix(TokenKey(_tokens(length)), cap)
        check(index)
        if not caches:
            assert (m.num_tokens, m.block_ids) == (0, [])
            continue
        limit = length if cap is None else min(cap, length)
        want = limit - limit % bs
        assert (m.num_tokens, m.block_ids) == (want, ids[: want // bs]), (cap, m)
        assert index.count_evictable(m.handle) == want // bs


def match_of_a_diverging_key_stops_at_the_last_whole_common_block(
    make: IndexFactory, bs: int
) -> None:
    """A key differing inside block 1 hits block 0 only; namespaces never share."""
    index, caches = _new(make, bs)
    if not caches:
        return
    ids = [0, 1, 2]
    index.insert(TokenKey(_tokens(3 * bs)), ids)
    other = _tokens(3 * bs)
    other[bs + bs // 2] = 99_999
    m = index.match_prefix(TokenKey(other))
    check(index)
    want = (bs + bs // 2) // bs * bs
    assert (m.num_tokens, m.block_ids) == (want, ids[: want // bs])
    ns = index.match_prefix(TokenKey(_tokens(3 * bs), extra_key="tenant-a"))
    assert (ns.num_tokens, ns.block_ids) == (0, [])
    check(index)


def insert_returns_block_ids_and_a_handle(make: IndexFactory, bs: int) -> None:
    """Only whole blocks register, unlocked; a repeat insert keeps the index's blocks."""
    index, caches = _new(make, bs)
    length = 3 * bs + (bs - 1)
    ids = [0, 1, 2, 3]
    res = index.insert(TokenKey(_tokens(length)), ids)
    check(index)
    if not caches:
        assert (res.num_cached_tokens, res.block_ids) == (0, [])
        assert index.stats().num_cached_blocks == 0
    else:
        assert (res.num_cached_tokens, res.block_ids) == (0, ids[:3])
        s = index.stats()
        assert (s.num_cached_blocks, s.num_evictable_blocks) == (3, 3)
    index.lock(res.handle)
    check(index)
    assert index.stats().num_locked_blocks == (3 if caches else 0)
    index.unlock(res.handle)
    check(index)
    again = index.insert(TokenKey(_tokens(length)), ids)
    check(index)
    if caches:
        assert (again.num_cached_tokens, again.block_ids) == (3 * bs, ids[:3])
        assert index.stats().num_cached_blocks == 3


def insert_with_num_tokens_registers_only_whole_blocks_of_that_prefix(
    make: IndexFactory, bs: int
) -> None:
    """``num_tokens`` limits the registration to its whole blocks."""
    index, caches = _new(make, bs)
    ids = [0, 1, 2, 3]
    index.insert(TokenKey(_tokens(4 * bs)), ids, 2 * bs + bs // 2)
    check(index)
    m = index.match_prefix(TokenKey(_tokens(4 * bs)))
    want = 2 * bs if caches else 0
    assert (m.num_tokens, m.block_ids) == (want, ids[: want // bs])


def lock_unlock_relock(make: IndexFactory, bs: int) -> None:
    """Locks count; relock moves one onto a longer prefix; unlocking never deletes."""
    index, caches = _new(make, bs)
    if not caches:
        return
    ids = [0, 1, 2, 3]
    key = TokenKey(_tokens(4 * bs))
    first = index.insert(key, ids, 2 * bs)
    index.lock(first.handle)
    check(index)
    s = index.stats()
    assert (s.num_locked_blocks, s.num_evictable_blocks) == (2, 0)
    index.lock(first.handle)
    check(index)
    assert index.unlock(first.handle) == []
    check(index)
    assert index.stats().num_locked_blocks == 2
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
    assert index.match_prefix(TokenKey(_tokens(4 * bs))).block_ids == ids


def count_evictable_is_asked_now(make: IndexFactory, bs: int) -> None:
    """``count_evictable`` counts the hit's unlocked blocks at the moment of asking."""
    index, caches = _new(make, bs)
    if not caches:
        return
    ids = [0, 1, 2, 3]
    res = index.insert(TokenKey(_tokens(2 * bs)), ids[:2])
    index.lock(res.handle)
    index.insert(TokenKey(_tokens(4 * bs)), ids)
    check(index)
    m = index.match_prefix(TokenKey(_tokens(4 * bs)))
    check(index)
    assert m.block_ids == ids
    assert index.count_evictable(m.handle) == 2
    index.lock(m.handle)
    assert index.count_evictable(m.handle) == 0


def double_unlock_raises_and_changes_nothing(make: IndexFactory, bs: int) -> None:
    """An unlock without a lock is ``LockStateError`` and changes nothing."""
    index, caches = _new(make, bs)
    if not caches:
        return
    res = index.insert(TokenKey(_tokens(3 * bs)), [0, 1, 2])
    index.lock(res.handle)
    index.unlock(res.handle)
    before = index.stats()
    with _raises(LockStateError):
        index.unlock(res.handle)
    check(index)
    assert index.stats() == before
    m = index.match_prefix(TokenKey(_tokens(3 * bs)))
    with _raises(LockStateError):
        index.unlock(m.handle)
    check(index)
    assert index.stats() == before


def evict_returns_only_unlocked_blocks(make: IndexFactory, bs: int) -> None:
    """Locked blocks survive any eviction; what stays still hits."""
    index, caches = _new(make, bs)
    if not caches:
        return
    locked_ids, free_ids, shared_ids = [0, 1, 2], [3, 4, 5], [6, 7]
    held = index.insert(TokenKey(_tokens(3 * bs)), locked_ids)
    index.lock(held.handle)
    index.insert(TokenKey(_tokens(3 * bs, start=10_000)), free_ids)
    index.insert(TokenKey(_tokens(5 * bs)), [*locked_ids, *shared_ids])
    check(index)
    assert index.evict(0) == []
    evicted = index.evict(10**6)
    check(index)
    assert sorted(evicted) == sorted(free_ids + shared_ids)
    s = index.stats()
    assert (s.num_cached_blocks, s.num_locked_blocks, s.num_evictable_blocks) == (3, 3, 0)
    assert s.num_evicted_blocks == len(evicted)
    assert index.evict(10**6) == []
    assert index.match_prefix(TokenKey(_tokens(5 * bs))).block_ids == locked_ids
    assert index.match_prefix(TokenKey(_tokens(3 * bs, start=10_000))).num_tokens == 0
    index.unlock(held.handle)
    assert sorted(index.evict(10**6)) == sorted(locked_ids)
    check(index)
    assert index.stats().num_cached_blocks == 0


def evict_trims_a_chain_from_the_tail(make: IndexFactory, bs: int) -> None:
    """HC-7 / RX-6: a released (or never locked) chain is evicted tail (leaf) first, so
    what stays cached is a prefix that still hits."""
    for n, lock in ((1, True), (2, True), (3, True), (5, True), (2, False)):
        index, caches = _new(make, bs)
        if not caches:
            return
        ids = [0, 1, 2, 3, 4]
        key_tokens = _tokens(5 * bs)
        res = index.insert(TokenKey(key_tokens), ids)
        if lock:
            index.lock(res.handle)
            index.unlock(res.handle)
        evicted = index.evict(n)
        check(index)
        assert len(evicted) >= n
        assert sorted(evicted) == sorted(ids[len(ids) - len(evicted) :]), (evicted, ids)
        m = index.match_prefix(TokenKey(key_tokens))
        assert m.block_ids == ids[: len(ids) - len(evicted)]


def reset_refuses_while_locked_then_returns_every_block(make: IndexFactory, bs: int) -> None:
    """Reset is refused while locked (nothing changes), then frees all; reusable after."""
    index, caches = _new(make, bs)
    if not caches:
        assert index.reset() == []
        return
    a, b = [0, 1, 2], [3, 4]
    held = index.insert(TokenKey(_tokens(3 * bs)), a)
    index.lock(held.handle)
    index.insert(TokenKey(_tokens(2 * bs, start=500)), b)
    before = index.stats()
    with _raises(CacheInUseError):
        index.reset()
    check(index)
    assert index.stats() == before
    assert index.match_prefix(TokenKey(_tokens(3 * bs))).block_ids == a
    index.unlock(held.handle)
    out = index.reset()
    check(index)
    assert sorted(out) == sorted(a + b)
    s = index.stats()
    assert (s.num_cached_blocks, s.num_evictable_blocks, s.num_locked_blocks) == (0, 0, 0)
    assert index.match_prefix(TokenKey(_tokens(3 * bs))).num_tokens == 0
    assert index.reset() == []
    index.insert(TokenKey(_tokens(3 * bs)), a)
    check(index)
    assert index.match_prefix(TokenKey(_tokens(3 * bs))).block_ids == a


def foreign_handles_are_rejected(make: IndexFactory, bs: int) -> None:
    """Another index's handles, or non-handles, are ``InvalidHandleError``; nothing changes."""
    mine, _ = _new(make, bs)
    other, _ = _new(make, bs)
    other_res = other.insert(TokenKey(_tokens(2 * bs)), [0, 1])
    other_miss = other.match_prefix(TokenKey(_tokens(2 * bs, start=77)))
    mine.insert(TokenKey(_tokens(2 * bs)), [0, 1])
    own = mine.match_prefix(TokenKey(_tokens(2 * bs))).handle
    before = mine.stats()
    for foreign in (other_res.handle, other_miss.handle, object(), None, 0):
        for call, args in (
            (mine.lock, (foreign,)),
            (mine.unlock, (foreign,)),
            (mine.relock, (own, foreign)),
            (mine.relock, (foreign, own)),
            (mine.count_evictable, (foreign,)),
        ):
            with _raises(InvalidHandleError):
                call(*args)
        check(mine)
        assert mine.stats() == before
    check(other)
    assert other.stats().num_locked_blocks == 0


def handle_of_evicted_entries_is_rejected(make: IndexFactory, bs: int) -> None:
    """A lookup whose blocks were evicted since is stale: refused, never trusted."""
    index, caches = _new(make, bs)
    if not caches:
        return
    index.insert(TokenKey(_tokens(2 * bs)), [0, 1])
    m = index.match_prefix(TokenKey(_tokens(2 * bs)))
    assert m.num_tokens == 2 * bs
    assert sorted(index.evict(2)) == [0, 1]
    with _raises(InvalidHandleError):
        index.lock(m.handle)
    with _raises(InvalidHandleError):
        index.count_evictable(m.handle)
    check(index)
    assert index.stats().num_locked_blocks == 0


def insert_with_too_few_block_ids_raises_and_registers_nothing(make: IndexFactory, bs: int) -> None:
    """Fewer block ids than whole blocks is ``BlockOwnershipError``; nothing registers."""
    index, caches = _new(make, bs)
    if not caches:
        return
    with _raises(BlockOwnershipError):
        index.insert(TokenKey(_tokens(3 * bs)), [0, 1])
    check(index)
    assert index.stats().num_cached_blocks == 0
    assert index.match_prefix(TokenKey(_tokens(3 * bs))).num_tokens == 0


CONFORMANCE_CASES: Mapping[str, Callable[[IndexFactory, int], None]] = MappingProxyType(
    {
        f.__name__: f
        for f in (
            empty_index_misses,
            insert_then_match_is_block_aligned_and_capped,
            match_of_a_diverging_key_stops_at_the_last_whole_common_block,
            insert_returns_block_ids_and_a_handle,
            insert_with_num_tokens_registers_only_whole_blocks_of_that_prefix,
            lock_unlock_relock,
            count_evictable_is_asked_now,
            double_unlock_raises_and_changes_nothing,
            evict_returns_only_unlocked_blocks,
            evict_trims_a_chain_from_the_tail,
            reset_refuses_while_locked_then_returns_every_block,
            foreign_handles_are_rejected,
            handle_of_evicted_entries_is_rejected,
            insert_with_too_few_block_ids_raises_and_registers_nothing,
        )
    }
)
"""Every case by name: ``case(make, block_size)``; raises ``AssertionError`` on a violation."""


def check_conformance(make: IndexFactory, block_sizes: tuple[int, ...] = BLOCK_SIZES) -> None:
    """Run every case at every block size.

    Raises:
        AssertionError: naming the failing case and block size.
    """
    for bs in block_sizes:
        for name, case in CONFORMANCE_CASES.items():
            try:
                case(make, bs)
            except AssertionError as exc:
                raise AssertionError(f"{name} (block_size {bs}): {exc}") from exc
