"""Each parameter pyproject.toml's ``[tool.prefixkv.mypyc.checked]`` lists (compiled
declared ``object``) meets a value of a type no parameter takes as the pure-Python
package does, on both builds: with the project's named error, never a bare
``TypeError``, or, for the few that take any value (a truth value, a call declined),
with the same answer. A working call is written once per function and the wrong value
replaces one listed parameter at a time; drawn from the table itself, so a function
added to it without a call here fails ``test_every_listed_function_has_a_call``.
``test_bad_input_sweep.py`` pins wrong values of the right type and the unchanged state.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import PageRows, PrefixCache, SimpleReq
from prefixkv.adapters.sglang.prefix_cache import simulated_parts
from prefixkv.adapters.sglang.simulated import alloc_for_chunk, alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import HashChainIndex, PrefixKVError, RadixIndex, TokenKey
from prefixkv.indexes.hashing import BlockHasher, make_block_hasher
from prefixkv.indexes.tokens import make_extra_key
from prefixkv.storage import BlockAllocator

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


def _manager(index: Any = None) -> CacheManager:
    m = CacheManager(index or RadixIndex(2), BlockAllocator(32))
    m.admit("live", [1, 2, 3, 4, 9, 9])
    m.commit("live", 4)
    return m


def _vllm() -> tuple[KVCacheManager, SimpleRequest]:
    f = KVCacheManager("hash_chain", num_blocks=33, block_size=2)
    req = SimpleRequest("live", [1, 2, 3, 4, 5])
    f.get_computed_blocks(req)
    f.allocate_slots(req, 5)
    req.num_computed_tokens = 5
    req.append_output_token_ids(7)
    return f, req


def _sglang() -> tuple[PrefixCache, SimpleReq]:
    c = PrefixCache.create_simulated("radix", capacity_tokens=64)
    req = SimpleReq("live", [1, 2, 3, 4])
    alloc_for_extend(c, req)
    req.output_ids.append(5)
    c.cache_unfinished_req(req)
    return c, req


def _rows() -> PageRows:
    rows = PageRows()
    row = rows.alloc()
    assert row == 0
    rows.write(0, 0, [4, 5])
    return rows


def _node(c: PrefixCache) -> Any:
    return c.match_prefix([1, 2, 3]).last_node


def _alloc_for_chunk(**bad: Any) -> object:
    c, _ = _sglang()
    req = SimpleReq("n", [7, 8, 9, 10])
    alloc_for_extend(c, req, 2)
    return alloc_for_chunk(c, req, **{"extend_len": 1, **bad})


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
    f"{ADAPTERS}sglang.simulated:alloc_for_extend": lambda **b: alloc_for_extend(
        _sglang()[0], SimpleReq("n", [1, 2, 3, 4, 9]), **b
    ),
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
}
for _kind in ("hash_chain:HashChainIndex", "radix:RadixIndex"):
    _make: Callable[[], Any] = HashChainIndex if _kind.startswith("hash") else RadixIndex

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


def _extend_locked(**bad: Any) -> object:
    index = HashChainIndex(2)
    key = TokenKey([1, 2, 3, 4])
    handle = index.insert(key, [0, 1], 2).handle
    index.lock(handle)
    good = {"key": key, "block_ids": [0, 1], "num_tokens": 4, "prefix": handle}
    return index.extend_locked(**{**good, **bad})


def _rows_with_empty() -> PageRows:
    rows = _rows()
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
    answer = CALLS[function]()
    for entry, declined in DECLINED.items():  # served, so a "no" answer says something
        if entry.startswith(f"{function}("):
            assert answer is not declined


@pytest.mark.parametrize(("function", "parameter"), LISTED, ids=[f"{f}({p})" for f, p in LISTED])
@given(bad=WRONG)
@settings(max_examples=8)
def test_a_wrong_type_gets_the_named_error(function: str, parameter: str, bad: object) -> None:
    entry = f"{function}({parameter})"
    if entry in DECLINED:
        assert CALLS[function](**{parameter: bad}) is DECLINED[entry]
    elif entry in TRUTH_VALUES:
        CALLS[function](**{parameter: bad})
    else:
        with pytest.raises(PrefixKVError):
            CALLS[function](**{parameter: bad})
