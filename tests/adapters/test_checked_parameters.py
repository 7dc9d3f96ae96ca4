"""Each parameter pyproject.toml's ``[tool.prefixkv.mypyc.checked]`` lists (compiled
declared ``object``) meets a value of a type no parameter takes as the pure-Python
package does, on both builds: with the project's named error, never a bare
``TypeError``, or, for the few that take any value (a truth value, a call declined),
with the same answer; a refused call leaves every object it was made on as it was, and
their invariants hold (free + held + cached == total). A working call is written once
per function and the wrong value replaces one listed parameter at a time; drawn from
the table itself, so a function added to it without a call here fails
``test_every_listed_function_has_a_call``. ``test_bad_input_sweep.py`` pins wrong values
of the right type.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import cache_state, manager_state
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import PageRows, PrefixCache, SimpleReq
from prefixkv.adapters.sglang.prefix_cache import simulated_parts
from prefixkv.adapters.sglang.simulated import (
    alloc_for_chunk,
    alloc_for_decode,
    alloc_for_extend,
    req_to_token,
    retract,
)
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import HashChainIndex, PrefixKVError, RadixIndex, TokenKey
from prefixkv.indexes.hashing import BlockHasher, encode_extra_key, make_block_hasher
from prefixkv.indexes.tokens import make_extra_key
from prefixkv.storage import BlockAllocator
from prefixkv.storage.allocator import Owner

ROOT = Path(__file__).resolve().parents[2]

Call = Callable[..., object]


def table() -> list[tuple[str, str]]:
    """(module:function, parameter) for every listed parameter."""
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        checked = tomllib.load(f)["tool"]["prefixkv"]["mypyc"]["checked"]
    out = []
    for module, entries in checked.items():
        for entry in entries:
            name, _, params = "".join(entry.split()).rstrip(")").partition("(")
            out += [(f"{module}:{name}", p) for p in params.split(",")]
    return out


# ------------------------------------------------------------ the working calls

# What each call's objects were built to, as (object, its state, that state when built):
# a refused call must leave each as it was.
BUILT: list[tuple[Any, Callable[[Any], Any], Any]] = []


def _tracked(state: Callable[[Any], Any]) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    """A builder that records what it built and its state (``state`` checks its
    invariants too) before any call on it."""

    def wrap(make: Callable[[], Any]) -> Callable[[], Any]:
        def build() -> Any:
            built = make()
            BUILT.append((built, state, state(built)))
            return built

        return build

    return wrap


def _ready() -> None:
    """The call's good arguments are made (a match, pages): the state to keep is now."""
    BUILT[:] = [(built, state, state(built)) for built, state, _ in BUILT]


def _manager_state(m: CacheManager) -> Any:
    m.check_invariants()
    return manager_state(m)


def _vllm_state(built: tuple[KVCacheManager, SimpleRequest]) -> Any:
    built[0].check_invariants()
    return manager_state(built[0].manager)


def _sglang_state(built: tuple[PrefixCache, SimpleReq]) -> Any:
    built[0].check_invariants()  # the index (pages a call allocates by hand are no leak)
    return cache_state(built[0], [built[1]])


def _allocator_state(a: BlockAllocator) -> Any:
    a.check_invariants()
    return tuple(a.free_block_ids()), a.num_blocks_held_by(Owner.CALLER)


def _index_state(index: Any) -> Any:
    index.check_invariants()
    return index.stats(), tuple(index.cached_blocks(TokenKey([1, 2, 3, 4])))


@_tracked(_manager_state)
def _manager() -> CacheManager:
    m = CacheManager(RadixIndex(2), BlockAllocator(32))
    m.admit("live", [1, 2, 3, 4, 9, 9])
    m.commit("live", 4)
    return m


@_tracked(_vllm_state)
def _vllm() -> tuple[KVCacheManager, SimpleRequest]:
    f = KVCacheManager("hash_chain", num_blocks=33, block_size=2)
    req = SimpleRequest("live", [1, 2, 3, 4, 5])
    f.get_computed_blocks(req)
    f.allocate_slots(req, 5)
    req.num_computed_tokens = 5
    req.append_output_token_ids(7)
    return f, req


@_tracked(_sglang_state)
def _sglang() -> tuple[PrefixCache, SimpleReq]:
    c = PrefixCache.create_simulated("radix", capacity_tokens=64)
    req = SimpleReq("live", [1, 2, 3, 4])
    alloc_for_extend(c, req)
    req.output_ids.append(5)
    c.cache_unfinished_req(req)
    return c, req


def _rows_state(rows: PageRows) -> Any:
    return rows.num_rows_in_use(), *map(tuple, map(rows.pages, range(rows.num_rows_in_use())))


def _new_rows() -> PageRows:
    rows = PageRows()
    row = rows.alloc()
    assert row == 0
    rows.write(0, 0, [4, 5])
    return rows


_rows = _tracked(_rows_state)(_new_rows)


@_tracked(_allocator_state)
def _allocator() -> BlockAllocator:
    a = BlockAllocator(8)
    assert a.allocate(2) == [0, 1]  # held by Owner.CALLER
    return a


REQ = object()  # the vLLM class's running request, in a call's arguments


def _vllm_call(method: str, *args: Any, **good: Any) -> Call:
    """``method`` of the vLLM class on ``args`` (``REQ``: its running request, "live")."""

    def call(**bad: Any) -> object:
        f, req = _vllm()
        return getattr(f, method)(*(req if a is REQ else a for a in args), **{**good, **bad})

    return call


def _truncate(**bad: Any) -> object:
    f, _ = _vllm()
    blocks = f.get_computed_blocks(SimpleRequest("n", [1, 2, 3, 4, 5]))[0]
    return f.truncate_computed_blocks(blocks, **{"num_computed_tokens": 2, **bad})


def _on_admit(**bad: Any) -> object:
    c, req = _sglang()
    match = c.match_prefix([1, 2, 3])
    _ready()
    return c.on_admit(req, **{"match": match, **bad})


def _on_release(**bad: Any) -> object:
    c, req = _sglang()
    return c.on_release(req, **{"checkpointed": True, **bad})


def _scheduler_step(step: Callable[..., object], new: bool = False) -> Call:
    """A simulated scheduler step on the running request (a new one: ``new``)."""

    def call(**bad: Any) -> object:
        c, req = _sglang()
        return step(**{"cache": c, "req": SimpleReq("n", [1, 2, 3]) if new else req, **bad})

    return call


def _node(c: PrefixCache) -> Any:
    return c.match_prefix([1, 2, 3]).last_node


def _alloc_for_chunk(**bad: Any) -> object:
    c, _ = _sglang()
    req = SimpleReq("n", [7, 8, 9, 10])
    alloc_for_extend(c, req, 2)
    _ready()
    return alloc_for_chunk(**{"cache": c, "req": req, "extend_len": 1, **bad})


def _allocate_slots(**bad: Any) -> object:
    f, req = _vllm()
    return f.allocate_slots(req, **{"num_new_tokens": 1, **bad})


def _checkpoint(**bad: Any) -> object:
    c, req = _sglang()
    return c.checkpoint(req, **{"up_to": 4, **bad})


def _cache_finished_req(**bad: Any) -> object:
    c, req = _sglang()
    return c.cache_finished_req(req, **bad)


def _sglang_call(method: str, **good: Any) -> Call:
    def call(**bad: Any) -> object:
        c, _ = _sglang()
        args = {k: v(c) if callable(v) else v for k, v in good.items()}
        _ready()
        return getattr(c, method)(**{**args, **bad})

    return call


def _with(make: Callable[[], Any], method: str, **good: Any) -> Call:
    return lambda **bad: getattr(make(), method)(**{**good, **bad})


INDEXES = "prefixkv.indexes."
ADAPTERS = "prefixkv.adapters."
CALLS: dict[str, Call] = {
    f"{INDEXES}tokens:make_extra_key": lambda **b: make_extra_key(**{"lora": "a", **b}),
    f"{INDEXES}tokens:TokenKey.__init__": lambda **b: TokenKey([1, 2], **b),
    f"{INDEXES}hashing:BlockHasher.__init__": lambda **b: BlockHasher(**{"block_size": 4, **b}),
    f"{INDEXES}hashing:make_block_hasher": lambda **b: make_block_hasher(**{"block_size": 4, **b}),
    f"{INDEXES}hash_chain:HashChainIndex.__init__": lambda **b: HashChainIndex(**b),
    f"{INDEXES}radix:RadixIndex.__init__": lambda **b: RadixIndex(**b),
    "prefixkv.storage.allocator:BlockAllocator.__init__": lambda **b: BlockAllocator(
        **{"num_blocks": 4, **b}
    ),
    "prefixkv.storage.allocator:BlockAllocator.allocate": _with(
        lambda: BlockAllocator(8), "allocate", num_blocks=2
    ),
    "prefixkv.storage.allocator:BlockAllocator.owner_of": _with(
        lambda: BlockAllocator(8), "owner_of", block_id=1
    ),
    "prefixkv.storage.allocator:BlockAllocator.is_free": _with(
        lambda: BlockAllocator(8), "is_free", block_id=1
    ),
    f"{ADAPTERS}manager:CacheManager.__init__": lambda **b: CacheManager(
        **{"index": RadixIndex(2), "allocator": BlockAllocator(8), **b}
    ),
    f"{ADAPTERS}manager:CacheManager.make_key": _with(_manager, "make_key", tokens=[1, 2]),
    f"{ADAPTERS}manager:CacheManager.admit": _with(
        _manager, "admit", request_id="new", tokens=[1, 2, 3, 4, 8]
    ),
    f"{ADAPTERS}manager:CacheManager.commit": _with(
        _manager, "commit", request_id="live", num_tokens=4
    ),
    f"{ADAPTERS}manager:CacheManager.append": _with(
        _manager, "append", request_id="live", tokens=[1]
    ),
    f"{ADAPTERS}manager:CacheManager.advance": _with(
        _manager, "advance", request_id="live", num_slots=8, num_computed=6
    ),
    f"{ADAPTERS}manager:CacheManager.step_in_place": _with(
        _manager, "step_in_place", request_id="live", num_tokens=5
    ),
    f"{ADAPTERS}manager:CacheManager.finish": _with(_manager, "finish", request_id="live"),
    f"{ADAPTERS}manager:CacheManager.evict": _with(_manager, "evict", num_blocks=1),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.__init__": lambda **b: KVCacheManager(**b),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.get_computed_blocks": lambda **b: _vllm()[
        0
    ].get_computed_blocks(SimpleRequest("n", [1, 2, 3]), **b),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.get_computed_blocks_for_connector": (
        lambda **b: _vllm()[0].get_computed_blocks_for_connector(SimpleRequest("n", [1, 2]), **b)
    ),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.allocate_slots": _allocate_slots,
    f"{ADAPTERS}sglang.prefix_cache:simulated_parts": lambda **b: simulated_parts(
        **{"index": "radix", "capacity_tokens": 64, "page_size": None, **b}
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.__init__": lambda **b: PrefixCache(
        **{"index": RadixIndex(1), "pool": BlockAllocator(8), "rows": PageRows(), **b}
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.create_simulated": lambda **b: (
        PrefixCache.create_simulated(**{"capacity_tokens": 64, **b})
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.namespace": _sglang_call(
        "namespace", extra_key="e", cache_salt="s"
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.match_req": lambda **b: _sglang()[0].match_req(
        SimpleReq("n", [1, 2, 3]), **b
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.match_prefix": _sglang_call(
        "match_prefix", token_ids=[1, 2, 3]
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.insert": _sglang_call(
        "insert", token_ids=[8, 9], value=lambda c: c.pool.allocate(2)
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.evict": _sglang_call("evict", num_tokens=1),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.token_usage": _sglang_call(
        "token_usage", max_total_num_tokens=64
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.inc_lock_ref": _sglang_call(
        "inc_lock_ref", node=_node
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.dec_lock_ref": _sglang_call(
        "dec_lock_ref", node=_node
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.lock": _sglang_call("lock", node=_node),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.unlock": _sglang_call("unlock", lock=None),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.checkpoint": _checkpoint,
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.cache_finished_req": _cache_finished_req,
    f"{ADAPTERS}sglang.simulated:alloc_for_chunk": lambda **b: _alloc_for_chunk(**b),
    f"{ADAPTERS}sglang.page_rows:PageRows.__init__": lambda **b: PageRows(**b),
    f"{ADAPTERS}sglang.page_rows:PageRows.free": _with(_rows, "free", row=0),
    f"{ADAPTERS}sglang.page_rows:PageRows.read": _with(_rows, "read", row=0, start=0, stop=1),
    f"{ADAPTERS}sglang.page_rows:PageRows.write": _with(
        _rows, "write", row=0, start=2, page_ids=[6]
    ),
    f"{ADAPTERS}sglang.page_rows:PageRows.append_page": _with(
        _rows, "append_page", row=0, index=2, page=6
    ),
    f"{ADAPTERS}sglang.page_rows:PageRows.adopt": lambda **b: _rows_with_empty().adopt(
        **{"row": 1, "page_ids": [6], **b}
    ),
    f"{ADAPTERS}sglang.page_rows:PageRows.pages": _with(_rows, "pages", row=0),
    f"{INDEXES}tokens:TokenKey.append": lambda **b: TokenKey([1, 2]).append(**{"tokens": [3], **b}),
    f"{INDEXES}hashing:encode_extra_key": lambda **b: encode_extra_key(**{"extra_key": None, **b}),
    "prefixkv.storage.allocator:BlockAllocator.allocate_one": _with(_allocator, "allocate_one"),
    "prefixkv.storage.allocator:BlockAllocator.free": _with(_allocator, "free", block_ids=[0]),
    "prefixkv.storage.allocator:BlockAllocator.transfer": _with(
        _allocator, "transfer", block_ids=[0], src=Owner.CALLER, dst=Owner.MANAGER
    ),
    "prefixkv.storage.allocator:BlockAllocator.check_held": _with(
        _allocator, "check_held", block_ids=[0], owner=Owner.CALLER, what="held"
    ),
    "prefixkv.storage.allocator:BlockAllocator.num_blocks_held_by": _with(
        _allocator, "num_blocks_held_by", owner=Owner.CALLER
    ),
    f"{ADAPTERS}manager:CacheManager.match": _with(_manager, "match", key=TokenKey([1, 2, 3])),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.create_kv_cache_blocks": _vllm_call(
        "create_kv_cache_blocks", blocks=([],)
    ),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.record_prefix_cache_stats": _vllm_call(
        "record_prefix_cache_stats", REQ, num_hits=0
    ),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.cache_blocks": _vllm_call(
        "cache_blocks", REQ, num_computed_tokens=4
    ),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.get_block_ids_for_computed_tokens": (
        _vllm_call("get_block_ids_for_computed_tokens", "live", num_computed_tokens=2)
    ),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.truncate_computed_blocks": _truncate,
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.remove_skipped_blocks": _vllm_call(
        "remove_skipped_blocks", "live", processed_computed_tokens=4, num_prompt_tokens=5
    ),
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.record_blocks_for_zeroing": _vllm_call(
        "record_blocks_for_zeroing", "live", start_token=0
    ),
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.on_admit": _on_admit,
    f"{ADAPTERS}sglang.prefix_cache:PrefixCache.on_release": _on_release,
    f"{ADAPTERS}sglang.simulated:alloc_for_extend": _scheduler_step(alloc_for_extend, new=True),
    f"{ADAPTERS}sglang.simulated:alloc_for_decode": _scheduler_step(alloc_for_decode),
    f"{ADAPTERS}sglang.simulated:req_to_token": _scheduler_step(req_to_token),
    f"{ADAPTERS}sglang.simulated:retract": _scheduler_step(retract),
}
for _kind in ("hash_chain:HashChainIndex", "radix:RadixIndex"):
    _make: Callable[[], Any] = HashChainIndex if _kind.startswith("hash") else RadixIndex

    @_tracked(_index_state)
    def _filled(make: Callable[..., Any] = _make) -> Any:
        index = make(2)
        index.insert(TokenKey([1, 2, 3, 4]), [0, 1])
        return index

    CALLS |= {
        f"{INDEXES}{_kind}.match_prefix": _with(_filled, "match_prefix", key=TokenKey([1, 2, 3])),
        f"{INDEXES}{_kind}.cached_blocks": _with(_filled, "cached_blocks", key=TokenKey([1, 2])),
        f"{INDEXES}{_kind}.insert": _with(
            _filled, "insert", key=TokenKey([1, 2, 3, 4, 5, 6]), block_ids=[0, 1, 2]
        ),
        f"{INDEXES}{_kind}.evict": _with(_filled, "evict", num_blocks=1),
    }
    if _kind.startswith("hash"):
        CALLS |= {
            f"{INDEXES}{_kind}.num_common_prefix_blocks": _with(
                _filled, "num_common_prefix_blocks", block_ids=[0, 1], num_requests=0
            ),
            f"{INDEXES}{_kind}.ref_cnt": _with(_filled, "ref_cnt", block_id=1),
            f"{INDEXES}{_kind}.is_cached": _with(_filled, "is_cached", block_id=1),
        }


@_tracked(lambda built: _index_state(built[0]))
def _locked_chain() -> tuple[HashChainIndex, TokenKey, Any]:
    index = HashChainIndex(2)
    key = TokenKey([1, 2, 3, 4])
    handle = index.insert(key, [0, 1], 2).handle
    index.lock(handle)
    return index, key, handle


def _extend_locked(**bad: Any) -> object:
    index, key, handle = _locked_chain()
    good = {"key": key, "block_ids": [0, 1], "num_tokens": 4, "prefix": handle}
    return index.extend_locked(**{**good, **bad})


@_tracked(_rows_state)
def _rows_with_empty() -> PageRows:
    rows = _new_rows()
    assert rows.alloc() == 1
    return rows


CALLS[f"{INDEXES}hash_chain:HashChainIndex.extend_locked"] = _extend_locked

# Listed parameters that take a value of any type, on both builds alike (compiled, the
# value must reach the body too): their function's "no" answer, or the call's answer.
DECLINED = {
    f"{INDEXES}hash_chain:HashChainIndex.extend_locked(num_tokens)": None,  # the general path
    f"{ADAPTERS}manager:CacheManager.step_in_place(num_tokens)": False,  # the checked path
}
TRUTH_VALUES = {  # read as Python reads a truth value
    f"{ADAPTERS}manager:CacheManager.commit(swap_duplicates)",
    f"{ADAPTERS}manager:CacheManager.advance(swap_duplicates)",
    f"{ADAPTERS}manager:CacheManager.finish(split_at_prompt)",
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.allocate_slots(full_sequence_must_fit)",
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.allocate_slots(has_scheduled_reqs)",
    # vLLM's, for groups a single-group manager does not have: unused
    f"{ADAPTERS}vllm.kv_cache_manager:KVCacheManager.allocate_slots(skip_zeroing_group_ids)",
}


# Values of a type no listed parameter takes (a float outside watermark's [0, 1)).
WRONG = st.one_of(
    st.builds(object),
    st.builds(SimpleNamespace),
    st.complex_numbers(allow_nan=False),
    st.floats(min_value=1.0) | st.floats(max_value=-1.0) | st.just(float("nan")),
)

LISTED = table()


def test_every_listed_function_has_a_call() -> None:
    assert sorted({f for f, _ in LISTED}) == sorted(CALLS)
    listed = {f"{f}({p})" for f, p in LISTED}
    assert {*DECLINED, *TRUTH_VALUES} <= listed


@pytest.mark.parametrize("function", sorted(CALLS))
def test_the_working_call_works(function: str) -> None:
    BUILT.clear()
    answer = CALLS[function]()
    for entry, declined in DECLINED.items():  # served, so a "no" answer says something
        if entry.startswith(f"{function}("):
            assert answer is not declined


@pytest.mark.parametrize(("function", "parameter"), LISTED, ids=[f"{f}({p})" for f, p in LISTED])
@given(bad=WRONG)
@settings(max_examples=8)
def test_a_wrong_type_gets_the_named_error(function: str, parameter: str, bad: object) -> None:
    entry = f"{function}({parameter})"
    BUILT.clear()
    if entry in DECLINED:
        assert CALLS[function](**{parameter: bad}) is DECLINED[entry]
    elif entry in TRUTH_VALUES:
        CALLS[function](**{parameter: bad})
        return
    else:
        with pytest.raises(PrefixKVError):
            CALLS[function](**{parameter: bad})
    for built, state, before in BUILT:  # refused or declined: nothing changed
        assert state(built) == before, f"{entry}={bad!r} changed {built!r}"
