"""Every public entry of indexes, storage and the manager rejects bad input.

Each misuse must raise a named ``PrefixKVError`` subclass whose message names the
offending value, and must leave the object as it was (compared through a snapshot
taken before the call).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import helpers
import pytest

from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes import (
    BlockOwnershipError,
    CacheInUseError,
    HashChainIndex,
    InvalidTokenError,
    PrefixIndex,
    PrefixKVError,
    RequestStateError,
    TokenKey,
    UnknownIndexError,
    available_indexes,
    make_index,
)
from prefixkv.indexes.tokens import as_token_array
from prefixkv.storage import BlockAllocator, pad_block_tables, slot_mapping, token_slot

BACKENDS = available_indexes()
CACHING = [name for name in BACKENDS if name != "none"]


def raises(exc: type[PrefixKVError], fn: Callable[[], object], *shown: object) -> str:
    """Call ``fn``; it must raise ``exc`` (a PrefixKVError) naming each of ``shown``."""
    with pytest.raises(exc) as info:
        fn()
    assert isinstance(info.value, PrefixKVError)
    msg = str(info.value)
    for value in shown:
        text = value if isinstance(value, str) else repr(value)
        assert text in msg, f"message {msg!r} does not name {text}"
    return msg


# ---------------------------------------------------------------------- TokenKey

BAD_TOKENS: list[Any] = [-1, -(2**40), True, False, 1.5, 2.0, 2**32, 2**64, None, "7", [1], b"x"]


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
def test_token_key_rejects_a_bad_token_id(bad: Any) -> None:
    msg = raises(InvalidTokenError, lambda: TokenKey([5, 6, bad, 7]), bad)
    assert "position 2" in msg


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
def test_token_key_rejects_a_bad_token_in_a_tuple_or_iterator(bad: Any) -> None:
    raises(InvalidTokenError, lambda: TokenKey((bad,)), bad)
    raises(InvalidTokenError, lambda: TokenKey(iter([0, bad])), bad)


@pytest.mark.parametrize("bad", [None, 5, 1.5, object()], ids=["None", "5", "1.5", "object"])
def test_token_key_rejects_tokens_that_are_not_a_sequence(bad: Any) -> None:
    # errors.py: "Every misuse of a public entry point ... raises a subclass of
    # PrefixKVError"; a non-iterable prompt is such a misuse (today: a bare TypeError).
    raises(InvalidTokenError, lambda: TokenKey(bad), bad)


BAD_EXTRA_KEYS: list[Any] = [
    5,
    1.5,
    True,
    b"salt",
    ["lora", "x"],
    (("lora",),),
    (("lora", True),),
    (("lora", 1.5),),
    ((1, "x"),),
    ("lora", "x"),
]


@pytest.mark.parametrize("bad", BAD_EXTRA_KEYS, ids=repr)
def test_token_key_rejects_a_bad_extra_key(bad: Any) -> None:
    raises(InvalidTokenError, lambda: TokenKey([1, 2], extra_key=bad), bad)


@pytest.mark.parametrize("bad", [1.5, "high", None, True], ids=repr)
def test_token_key_rejects_a_bad_priority(bad: Any) -> None:
    raises(InvalidTokenError, lambda: TokenKey([1, 2], priority=bad), bad)


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
def test_token_key_append_rejects_bad_tokens_and_keeps_the_key(bad: Any) -> None:
    key = TokenKey([1, 2, 3, 4])
    hc = HashChainIndex(2, seed=0)
    hashes = list(key.block_hashes(hc.hasher))
    raises(InvalidTokenError, lambda: key.append([9, bad]), bad)
    assert list(key.tokens) == [1, 2, 3, 4]
    assert key.block_hashes(hc.hasher) == hashes


# ---------------------------------------------------------------------- registry


def test_make_index_with_an_unknown_name_lists_the_known_ones() -> None:
    msg = raises(UnknownIndexError, lambda: make_index("lru_tree"), "lru_tree")
    assert issubclass(UnknownIndexError, ValueError)
    for name in BACKENDS:
        assert name in msg
    with pytest.raises(ValueError):  # generic handlers keep working
        make_index("")


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "16"], ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_make_index_rejects_a_bad_block_size(name: str, bad: Any) -> None:
    raises(PrefixKVError, lambda: make_index(name, block_size=bad), bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True], ids=repr)
def test_hash_chain_rejects_a_bad_block_size_directly(bad: Any) -> None:
    raises(PrefixKVError, lambda: HashChainIndex(bad), bad)


def test_hash_chain_rejects_an_unknown_hash_algorithm() -> None:
    raises(PrefixKVError, lambda: HashChainIndex(4, hash_algorithm="md5"), "md5")


# --------------------------------------------------------------------- allocator


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"], ids=repr)
def test_block_allocator_rejects_a_bad_size(bad: Any) -> None:
    raises(PrefixKVError, lambda: BlockAllocator(bad), bad)


def alloc_state(a: BlockAllocator) -> tuple[object, ...]:
    a.check_invariants()
    return (tuple(a.free_block_ids()), a.num_free_blocks)


@pytest.mark.parametrize("bad", [-1, 1.5, True, None], ids=repr)
def test_allocate_rejects_a_bad_count(bad: Any) -> None:
    a = BlockAllocator(8)
    a.allocate(3)
    before = alloc_state(a)
    raises(PrefixKVError, lambda: a.allocate(bad), bad)
    assert alloc_state(a) == before


def test_allocate_too_many_returns_none_and_takes_nothing() -> None:
    a = BlockAllocator(4)
    before = alloc_state(a)
    assert a.allocate(5) is None
    assert alloc_state(a) == before


@pytest.mark.parametrize(
    ("ids", "shown"),
    [
        ([8], 8),  # another pool's id
        ([100], 100),
        ([-1], -1),
        ([0, -3], -3),
        ([1.0], 1.0),
        ([True], True),
        (["0"], "'0'"),
    ],
    ids=repr,
)
def test_free_rejects_a_foreign_id_and_frees_nothing(ids: list[Any], shown: Any) -> None:
    a = BlockAllocator(8)
    held = a.allocate(4)
    assert held is not None
    before = alloc_state(a)
    raises(BlockOwnershipError, lambda: a.free([held[0], *ids]), shown)
    assert alloc_state(a) == before


def test_double_free_is_rejected_and_frees_nothing() -> None:
    a = BlockAllocator(8)
    held = a.allocate(4)
    assert held is not None
    a.free([held[0]])
    before = alloc_state(a)
    raises(BlockOwnershipError, lambda: a.free([held[1], held[0]]), held[0])
    assert alloc_state(a) == before
    never_taken = a.free_block_ids()[-1]
    raises(BlockOwnershipError, lambda: a.free([never_taken]), never_taken)
    assert alloc_state(a) == before


def test_free_with_a_repeated_id_is_rejected_and_frees_nothing() -> None:
    a = BlockAllocator(8)
    held = a.allocate(4)
    assert held is not None
    before = alloc_state(a)
    raises(BlockOwnershipError, lambda: a.free([held[2], held[1], held[2]]), held[2])
    assert alloc_state(a) == before


# ----------------------------------------------------------------------- indexes


def index_state(index: PrefixIndex, probes: list[TokenKey]) -> tuple[object, ...]:
    index.check_invariants()
    queue = getattr(index, "free_queue_block_ids", None)
    stats = index.stats()
    matches = tuple(
        tuple(index.match_prefix(TokenKey(k.tokens, k.extra_key)).block_ids) for k in probes
    )
    return (stats, tuple(queue()) if queue else None, matches)


def hc_with_content() -> tuple[HashChainIndex, list[TokenKey]]:
    index = HashChainIndex(2, seed=0)
    a, b = TokenKey([1, 2, 3, 4, 5, 6]), TokenKey([1, 2, 9, 9])
    index.lock(index.insert(a, [0, 1, 2]).handle)
    index.insert(b, [0, 5])
    return index, [a, b, TokenKey([7, 7, 7, 7])]


def test_hash_chain_insert_with_too_few_block_ids() -> None:
    index, probes = hc_with_content()
    before = index_state(index, probes)
    raises(BlockOwnershipError, lambda: index.insert(TokenKey([7, 7, 7, 7, 7, 7]), [8, 9]), "2")
    assert index_state(index, probes) == before


def test_hash_chain_insert_with_a_repeated_block_id() -> None:
    index, probes = hc_with_content()
    before = index_state(index, probes)
    raises(BlockOwnershipError, lambda: index.insert(TokenKey([7, 7, 7, 7, 7, 7]), [8, 9, 8]), "8")
    assert index_state(index, probes) == before


@pytest.mark.parametrize("bid", [1, 2, 5])
def test_hash_chain_insert_with_a_block_cached_for_other_content(bid: int) -> None:
    index, probes = hc_with_content()
    before = index_state(index, probes)
    raises(
        BlockOwnershipError, lambda: index.insert(TokenKey([7, 7, 7, 7, 7, 7]), [8, bid, 9]), bid
    )
    assert index_state(index, probes) == before


@pytest.mark.parametrize("bad", [-1, 1.5, None, True], ids=repr)
def test_hash_chain_insert_with_a_malformed_block_id(bad: Any) -> None:
    index, probes = hc_with_content()
    before = index_state(index, probes)
    raises(BlockOwnershipError, lambda: index.insert(TokenKey([7, 7, 7, 7]), [8, bad]), bad)
    assert index_state(index, probes) == before


@pytest.mark.parametrize("name", CACHING)
@pytest.mark.parametrize(
    ("ids", "shown"),
    [([8], "1"), ([8, 9, 8], "8"), ([8, -1, 9], "-1"), ([8, 1.5, 9], "1.5")],
    ids=["too-few", "repeated", "negative", "float"],
)
def test_insert_rejects_bad_block_ids_on_every_backend(
    name: str, ids: list[Any], shown: str
) -> None:
    index = make_index(name, block_size=2)
    probe = TokenKey([1, 2, 3, 4, 5, 6])
    index.insert(probe, [0, 1, 2])
    before = index_state(index, [probe])
    raises(BlockOwnershipError, lambda: index.insert(TokenKey([7, 7, 7, 7, 7, 7]), ids), shown)
    assert index_state(index, [probe]) == before


@pytest.mark.parametrize("bad", [-1, 7, 1.5, True], ids=repr)
@pytest.mark.parametrize("name", CACHING)
def test_insert_and_match_reject_a_bad_token_count(name: str, bad: Any) -> None:
    index = make_index(name, block_size=2)
    probe = TokenKey([1, 2, 3, 4, 5, 6])
    index.insert(probe, [0, 1, 2])
    before = index_state(index, [probe])
    key = TokenKey([1, 2, 3, 4, 9, 9])
    raises(PrefixKVError, lambda: index.insert(key, [3, 4, 5], bad), bad)
    assert index_state(index, [probe]) == before
    if bad != 7:  # a cap above the key's length is harmless for a match
        raises(PrefixKVError, lambda: index.match_prefix(key, bad), bad)
        assert index_state(index, [probe]) == before


@pytest.mark.parametrize("bad", [-1, 1.5, True, None], ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_evict_rejects_a_bad_count(name: str, bad: Any) -> None:
    index = make_index(name, block_size=2)
    probe = TokenKey([1, 2, 3, 4])
    index.insert(probe, [0, 1])
    before = index_state(index, [probe])
    raises(PrefixKVError, lambda: index.evict(bad), bad)
    assert index_state(index, [probe]) == before


@pytest.mark.parametrize("bad", [-1, 1.5, None], ids=repr)
def test_hash_chain_evict_blocks_rejects_malformed_ids(bad: Any) -> None:
    index, probes = hc_with_content()
    before = index_state(index, probes)
    raises(BlockOwnershipError, lambda: index.evict_blocks([5, bad]), bad)
    assert index_state(index, probes) == before


# ----------------------------------------------------------------------- manager


def refuses(
    m: CacheManager, exc: type[PrefixKVError], fn: Callable[[], object], *shown: object
) -> None:
    """``fn`` raises ``exc`` naming each of ``shown`` (see :func:`raises`) and leaves ``m``
    exactly as it was."""
    before = manager_state(m)
    raises(exc, fn, *shown)
    assert manager_state(m) == before


def manager_state(m: CacheManager) -> tuple[object, ...]:
    m.check_invariants()
    return helpers.manager_state(m)


def busy_manager(name: str) -> CacheManager:
    """Two finished requests cached, one running (``"run"``: 6 tokens, 2 committed)."""
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    for rid, prompt in (("a", [1, 2, 3, 4, 5, 6]), ("b", [1, 2, 3, 9, 9, 9])):
        m.admit(rid, prompt)
        m.commit(rid, len(prompt))
        m.finish(rid)
    m.admit("run", [1, 2, 3, 4, 7, 7])
    m.commit("run", 2)
    m.check_invariants()
    return m


@pytest.mark.parametrize("name", BACKENDS)
def test_admit_rejects_a_running_request_id(name: str) -> None:
    m = busy_manager(name)
    refuses(m, RequestStateError, lambda: m.admit("run", [5, 5, 5]), "'run'")


@pytest.mark.parametrize("name", BACKENDS)
def test_admit_rejects_an_empty_prompt(name: str) -> None:
    m = busy_manager(name)
    before = manager_state(m)
    for empty in ([], (), iter([]), TokenKey([])):
        raises(InvalidTokenError, lambda e=empty: m.admit("new", e), "empty")  # type: ignore[misc]
    assert manager_state(m) == before


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_admit_rejects_bad_tokens(name: str, bad: Any) -> None:
    m = busy_manager(name)
    refuses(m, InvalidTokenError, lambda: m.admit("new", [1, 2, 3, bad]), bad)


@pytest.mark.parametrize("bad", BAD_EXTRA_KEYS[:4], ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_admit_rejects_a_bad_extra_key(name: str, bad: Any) -> None:
    m = busy_manager(name)
    refuses(m, InvalidTokenError, lambda: m.admit("new", [1, 2, 3], bad), bad)


BAD_NUM_TOKENS = [
    pytest.param(name, bad, id=f"{name}-{bad!r}")
    for name in BACKENDS
    for bad in (99, 7, 0, -1, 1.5, True)
]


@pytest.mark.parametrize(("name", "bad"), BAD_NUM_TOKENS)
def test_admit_rejects_a_bad_num_tokens_and_changes_nothing(name: str, bad: Any) -> None:
    # [1, 2, 3, 9, 7, 7] hits 4 tokens and ends inside the cached [3, 9, 9, 9] segment
    # (page size 2): the match must leave no trace (a radix split, a recency stamp)
    # when the call is then rejected.
    m = busy_manager(name)
    before = manager_state(m)
    raises(PrefixKVError, lambda: m.admit("new", [1, 2, 3, 9, 7, 7], num_tokens=bad), bad)
    assert "new" not in m
    assert manager_state(m) == before


@pytest.mark.parametrize("bad", [7, -1, 1.5, True, None], ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_commit_beyond_the_slots_is_rejected(name: str, bad: Any) -> None:
    m = busy_manager(name)
    refuses(m, PrefixKVError, lambda: m.commit("run", bad), bad)


@pytest.mark.parametrize("name", BACKENDS)
def test_commit_beyond_the_allocated_slots_of_a_chunked_prefill(name: str) -> None:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    m.admit("chunk", [1, 2, 3, 4, 5, 6], num_tokens=2)  # slots for 2 tokens only
    refuses(m, PrefixKVError, lambda: m.commit("chunk", 3), 3)


@pytest.mark.parametrize("bad", BAD_TOKENS, ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_append_rejects_bad_tokens(name: str, bad: Any) -> None:
    m = busy_manager(name)
    refuses(m, InvalidTokenError, lambda: m.append("run", [8, bad]), bad)


@pytest.mark.parametrize("name", BACKENDS)
def test_a_bad_tokens_position_counts_from_the_start_of_what_was_given(name: str) -> None:
    # advance() takes the request's whole token list and checks only the part the key
    # lacks: the position must still be the one in the list given, not in that tail.
    m = busy_manager(name)
    m.append("run", [8, 8])  # the key holds 8 tokens
    tokens = [1, 2, 3, 4, 7, 7, 8, 8, 5, -7]
    message = raises(InvalidTokenError, lambda: m.advance("run", 10, 10, tokens=tokens), -7)
    assert "position 9 holds -7" in message
    key = TokenKey([1, 2, 3])
    assert "position 4 holds -1" in raises(
        InvalidTokenError, lambda: key.append([4, -1], offset=3), -1
    )
    assert "position 5 holds 1.5" in raises(
        InvalidTokenError,
        lambda: as_token_array([0, 1.5], offset=4),
        1.5,  # type: ignore[list-item]
    )
    assert list(key.tokens) == [1, 2, 3]


@pytest.mark.parametrize("bad", [-1, 99, 1.5], ids=repr)
@pytest.mark.parametrize("name", BACKENDS)
def test_append_rejects_a_bad_num_slots(name: str, bad: Any) -> None:
    m = busy_manager(name)
    refuses(m, PrefixKVError, lambda: m.append("run", [8], num_slots=bad), bad)


@pytest.mark.parametrize("op", ["finish", "abort", "commit", "append", "block_table", "key"])
@pytest.mark.parametrize("name", BACKENDS)
def test_unknown_or_finished_request_ids_are_rejected(name: str, op: str) -> None:
    m = busy_manager(name)
    calls: dict[str, Callable[[Any], object]] = {
        "finish": m.finish,
        "abort": m.abort,
        "commit": lambda rid: m.commit(rid, 0),
        "append": lambda rid: m.append(rid, [1]),
        "block_table": m.block_table,
        "key": m.key,
    }
    before = manager_state(m)
    for rid in ("a", "b", "ghost", 7, None):  # "a" and "b" finished already
        raises(RequestStateError, lambda r=rid: calls[op](r), repr(rid))  # type: ignore[misc]
        assert manager_state(m) == before


@pytest.mark.parametrize("name", BACKENDS)
def test_double_finish_and_abort_after_finish_are_rejected(name: str) -> None:
    m = busy_manager(name)
    m.finish("run")
    before = manager_state(m)
    raises(RequestStateError, lambda: m.finish("run"), "'run'")
    raises(RequestStateError, lambda: m.abort("run"), "'run'")
    assert manager_state(m) == before


@pytest.mark.parametrize("name", BACKENDS)
def test_reset_while_requests_run_is_rejected(name: str) -> None:
    m = busy_manager(name)
    refuses(m, CacheInUseError, lambda: m.reset(), "1")


def test_manager_rejects_an_object_that_is_not_an_index() -> None:
    raises(PrefixKVError, lambda: CacheManager(object(), BlockAllocator(4)), "object")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["radix", "none"])
def test_evict_blocks_on_an_index_without_it_is_rejected(name: str) -> None:
    m = busy_manager(name)
    refuses(m, PrefixKVError, lambda: m.evict_blocks([0]), type(m.index).__name__)


# ---------------------------------------------------------------- block tables


def test_block_table_helpers_reject_out_of_range_positions() -> None:
    table = [3, 7]
    raises(PrefixKVError, lambda: token_slot(table, 4, 2), "4")
    raises(PrefixKVError, lambda: token_slot(table, -1, 2), "-1")
    raises(PrefixKVError, lambda: slot_mapping(table, 0, 5, 2), "5")
    raises(PrefixKVError, lambda: slot_mapping(table, 3, 2, 2), "3")
    raises(PrefixKVError, lambda: pad_block_tables([[1, 2, 3]], 2), "2")


# ------------------------------------------------------------------ paged KV cache

torch = pytest.importorskip("torch")


def paged_kv() -> Any:
    from prefixkv.storage.paged_kv import PagedKVCache

    cache = PagedKVCache(2, 2, 4, 4, 2)  # layers, heads, dim, blocks, block_size
    cache.kv.copy_(torch.arange(cache.kv.numel(), dtype=cache.kv.dtype).view_as(cache.kv))
    return cache


SIZE_ARGS = ["num_layers", "num_kv_heads", "head_dim", "num_blocks", "block_size"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True], ids=repr)
@pytest.mark.parametrize("arg", SIZE_ARGS)
def test_paged_kv_rejects_bad_sizes(arg: str, bad: Any) -> None:
    from prefixkv.storage.paged_kv import PagedKVCache

    sizes: dict[str, Any] = dict.fromkeys(SIZE_ARGS, 2)
    sizes[arg] = bad
    raises(PrefixKVError, lambda: PagedKVCache(**sizes), arg, bad)


def kv_tokens(n: int, heads: int = 2, dim: int = 4) -> Any:
    return torch.ones(n, heads, dim)


@pytest.mark.parametrize(
    ("k_shape", "v_shape", "slots", "shown"),
    [
        ((3, 2, 4), (3, 2, 4), [0, 1], "(3, 2, 4)"),  # k/v longer than the slot mapping
        ((2, 3, 4), (2, 3, 4), [0, 1], "(2, 3, 4)"),  # wrong head count
        ((2, 2, 5), (2, 2, 5), [0, 1], "(2, 2, 5)"),  # wrong head dim
        ((2, 2, 4), (1, 2, 4), [0, 1], "(1, 2, 4)"),  # v disagrees with k
        ((2, 2, 4), (2, 2, 4), [[0, 1]], "(1, 2)"),  # a 2-D slot mapping
    ],
    ids=["long-kv", "heads", "head-dim", "v-vs-k", "2d-slots"],
)
def test_paged_kv_write_rejects_wrong_shapes(
    k_shape: tuple[int, ...], v_shape: tuple[int, ...], slots: Any, shown: str
) -> None:
    from prefixkv.storage import StorageShapeError

    cache = paged_kv()
    before = cache.kv.clone()
    raises(
        StorageShapeError,
        lambda: cache.write(0, torch.ones(k_shape), torch.ones(v_shape), slots),
        shown,
    )
    assert torch.equal(cache.kv, before)


@pytest.mark.parametrize("bad", [8, 100, -2], ids=repr)
def test_paged_kv_write_rejects_out_of_range_slots(bad: int) -> None:
    cache = paged_kv()  # 4 blocks of 2 tokens: slots 0..7, -1 = skip
    before = cache.kv.clone()
    raises(PrefixKVError, lambda: cache.write(1, kv_tokens(3), kv_tokens(3), [0, bad, 1]), bad)
    assert torch.equal(cache.kv, before)


@pytest.mark.parametrize("bad", [2, -1, 1.5], ids=repr)
def test_paged_kv_write_rejects_a_bad_layer(bad: Any) -> None:
    cache = paged_kv()
    before = cache.kv.clone()
    raises(PrefixKVError, lambda: cache.write(bad, kv_tokens(1), kv_tokens(1), [0]), bad)
    assert torch.equal(cache.kv, before)


def test_paged_kv_write_rejects_a_float_slot_mapping() -> None:
    # storage/errors.py: StorageShapeError is for "a tensor or index ... with the wrong
    # shape, dtype or device"; slot 1.5 must not be truncated to slot 1.
    from prefixkv.storage import StorageShapeError

    cache = paged_kv()
    before = cache.kv.clone()
    raises(
        StorageShapeError,
        lambda: cache.write(0, kv_tokens(1), kv_tokens(1), torch.tensor([1.5])),
        "float",
    )
    assert torch.equal(cache.kv, before)


@pytest.mark.parametrize(("table", "n"), [([0], 3), ([0, 1], 5), ([], 1)])
def test_paged_kv_gather_rejects_a_short_block_table(table: list[int], n: int) -> None:
    cache = paged_kv()
    before = cache.kv.clone()
    raises(PrefixKVError, lambda: cache.gather(0, table, n), str(n), f"{len(table)}-block")
    assert torch.equal(cache.kv, before)


@pytest.mark.parametrize("table", [[0, 4], [-1, 0], [0, 99]], ids=repr)
def test_paged_kv_gather_rejects_foreign_block_ids(table: list[int]) -> None:
    cache = paged_kv()
    raises(PrefixKVError, lambda: cache.gather(0, table, 4), str(table))


def test_paged_kv_gather_rejects_negative_token_counts_and_bad_layers() -> None:
    cache = paged_kv()
    raises(PrefixKVError, lambda: cache.gather(0, [0, 1], -1), "-1")
    raises(PrefixKVError, lambda: cache.gather(5, [0, 1], 2), "5")


@pytest.mark.parametrize(("src", "dst"), [([0, 1], [2]), ([0], []), ([], [3])], ids=repr)
def test_paged_kv_copy_blocks_rejects_mismatched_lengths(src: list[int], dst: list[int]) -> None:
    from prefixkv.storage import StorageShapeError

    cache = paged_kv()
    before = cache.kv.clone()
    raises(
        StorageShapeError,
        lambda: cache.copy_blocks(src, dst),
        f"src has {len(src)}",
        f"dst has {len(dst)}",
    )
    assert torch.equal(cache.kv, before)


@pytest.mark.parametrize(
    ("src", "dst", "shown"),
    [([0, 4], [1, 2], "4"), ([0], [-1], "-1"), ([0, 1], [2, 2], "[2, 2]")],
    ids=["src-out-of-range", "dst-negative", "dst-repeated"],
)
def test_paged_kv_copy_blocks_rejects_bad_ids(src: list[int], dst: list[int], shown: str) -> None:
    cache = paged_kv()
    before = cache.kv.clone()
    raises(PrefixKVError, lambda: cache.copy_blocks(src, dst), shown)
    assert torch.equal(cache.kv, before)


# ------------------------------------------------------------------------ imports


def test_importing_the_indexes_does_not_import_torch() -> None:
    code = "import prefixkv.indexes, sys; assert 'torch' not in sys.modules, 'torch imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_error_messages_are_matchable_by_value() -> None:
    # The helper above relies on exact reprs; make sure a regex user can rely on them too.
    with pytest.raises(InvalidTokenError, match=re.escape("-1")):
        TokenKey([-1])
