"""Every public entry point, every argument, every kind of wrong value.

For each entry point a working call is written once; the sweep replaces one argument
at a time with values of the wrong type or range (None, a str, a float, NaN, infinity,
a negative, a huge int, a bool, a list, an object) and requires a named error (a
``PrefixKVError``) and an unchanged state snapshot. ``test_bad_input.py`` pins the
messages of the common cases; this file makes sure no argument was forgotten.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from prefixkv.adapters import Engine, EngineConfig
from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import SGLangRadixCache, SimpleReq
from prefixkv.adapters.vllm import SimpleRequest, VLLMKVCacheManager
from prefixkv.indexes import HashChainIndex, PrefixKVError, RadixIndex, TokenKey, make_index
from prefixkv.storage import (
    BlockAllocator,
    PagedKVCache,
    pad_block_tables,
    slot_mapping,
    token_slot,
)

WRONG: list[Any] = [
    None,
    "3",
    1.5,
    math.nan,
    math.inf,
    -1,
    2**70,
    True,
    [1],
    object(),
]


def wrong_for(entry: Entry) -> list[Any]:
    """The wrong values, less those this argument legitimately takes."""
    valid = (*entry.valid, *((None,) if entry.accepts_none else ()))

    def takes(v: Any) -> bool:
        return any(v is x or (type(v) is type(x) and v == x) for x in valid)

    return [v for v in WRONG if not takes(v)]


# ------------------------------------------------------------------ the objects


def busy_manager(name: str) -> CacheManager:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(32))
    m.admit("done", [1, 2, 3, 4, 5])
    m.commit("done", 5)
    m.finish("done")
    m.admit("live", [1, 2, 3, 4, 9, 9])
    m.commit("live", 4)
    return m


def manager_state(m: CacheManager) -> Any:
    return (
        tuple(m.allocator.free_block_ids()),
        m.index.stats(),
        tuple(
            (r, tuple(m.block_table(r)), m.num_computed_tokens(r), tuple(m.key(r).tokens))
            for r in m.running()
        ),
        m.num_held_only_blocks(),
    )


def index_with_content(name: str) -> Any:
    index = make_index(name, block_size=2)
    index.insert(TokenKey([1, 2, 3, 4]), [0, 1])
    return index


def index_state(index: Any) -> Any:
    return (index.stats(), tuple(index.cached_blocks(TokenKey([1, 2, 3, 4]))))


def vllm_facade(name: str) -> VLLMKVCacheManager:
    f = VLLMKVCacheManager(make_index(name, block_size=2), num_blocks=32)
    req = SimpleRequest("live", [1, 2, 3, 4, 5])
    f.get_computed_blocks(req)
    f.allocate_slots(req, 5)
    req.num_computed_tokens = 5
    req.append_output_token_ids(7)
    f.live = req  # type: ignore[attr-defined]
    return f


def sglang_facade(name: str) -> SGLangRadixCache:
    c = SGLangRadixCache(make_index(name, block_size=1), capacity_tokens=64)
    req = SimpleReq("live", [1, 2, 3, 4])
    c.alloc_for_extend(req)
    req.output_ids.append(5)
    c.cache_unfinished_req(req)
    c.live = req  # type: ignore[attr-defined]
    return c


def paged_kv() -> PagedKVCache:
    return PagedKVCache(1, 2, 4, 4, 2, dtype=torch.float64)


@dataclass(frozen=True)
class Entry:
    """One entry point: how to build its object, how to snapshot it, how to call it
    with one argument replaced by ``bad``."""

    name: str
    build: Callable[[], Any]
    state: Callable[[Any], Any]
    call: Callable[[Any, Any], object]
    accepts_none: bool = False
    valid: tuple[Any, ...] = ()  # values of WRONG this argument takes (huge: "does not fit")


def _entries() -> list[Entry]:
    out: list[Entry] = []
    for name in ("hash_chain", "radix"):

        def mk(n: str = name) -> Any:
            return index_with_content(n)

        out += [
            Entry(
                f"{name}.match_prefix(max_num_tokens)",
                mk,
                index_state,
                lambda i, b: i.match_prefix(TokenKey([1, 2, 3, 4]), b),
                accepts_none=True,
            ),
            Entry(
                f"{name}.insert(num_tokens)",
                mk,
                index_state,
                lambda i, b: i.insert(TokenKey([1, 2, 3, 4, 5, 6]), [0, 1, 2], b),
                accepts_none=True,
            ),
            Entry(
                f"{name}.insert(block_ids item)",
                mk,
                index_state,
                lambda i, b: i.insert(TokenKey([7, 8, 9, 10]), [b, 5]),
            ),
            Entry(
                f"{name}.insert(block_ids)",
                mk,
                index_state,
                lambda i, b: i.insert(TokenKey([7, 8, 9, 10]), b),
            ),
            Entry(f"{name}.evict(num_blocks)", mk, index_state, lambda i, b: i.evict(b)),
            Entry(f"{name}.lock(handle)", mk, index_state, lambda i, b: i.lock(b)),
            Entry(f"{name}.unlock(handle)", mk, index_state, lambda i, b: i.unlock(b)),
            Entry(
                f"{name}.count_evictable(handle)",
                mk,
                index_state,
                lambda i, b: i.count_evictable(b),
            ),
            Entry(
                f"{name}.cached_blocks(max_num_tokens)",
                mk,
                index_state,
                lambda i, b: i.cached_blocks(TokenKey([1, 2, 3, 4]), b),
                accepts_none=True,
            ),
            Entry(
                f"make_index({name}, block_size)",
                lambda: None,
                lambda _: None,
                lambda _, b, n=name: make_index(n, block_size=b),
                accepts_none=True,
            ),
        ]

        def mgr(n: str = name) -> CacheManager:
            return busy_manager(n)

        out += [
            Entry(
                f"manager[{name}].admit(tokens)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", b),
                valid=([1],),
            ),
            Entry(
                f"manager[{name}].admit(token)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", [1, 2, b]),
            ),
            Entry(
                f"manager[{name}].admit(num_tokens)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], num_tokens=b),
                accepts_none=True,
            ),
            Entry(
                f"manager[{name}].admit(reserve_blocks)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], reserve_blocks=b),
            ),
            Entry(
                f"manager[{name}].admit(priority)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], priority=b),
                accepts_none=True,
                valid=(-1, 2**70),
            ),
            Entry(
                f"manager[{name}].admit(extra_key)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], b if b != "3" else 5),
                accepts_none=True,
            ),
            Entry(
                f"manager[{name}].admit(lookup)",
                mgr,
                manager_state,
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], lookup=b),
                accepts_none=True,
            ),
            Entry(
                f"manager[{name}].admit(request_id)",
                mgr,
                manager_state,
                lambda m, b: m.admit(b if isinstance(b, list) else "live", [1, 2, 3]),
            ),
            Entry(
                f"manager[{name}].commit(num_tokens)",
                mgr,
                manager_state,
                lambda m, b: m.commit("live", b),
            ),
            Entry(
                f"manager[{name}].append(tokens)",
                mgr,
                manager_state,
                lambda m, b: m.append("live", [b]),
            ),
            Entry(
                f"manager[{name}].append(num_slots)",
                mgr,
                manager_state,
                lambda m, b: m.append("live", [1], num_slots=b),
                accepts_none=True,
            ),
            Entry(
                f"manager[{name}].append(reserve_blocks)",
                mgr,
                manager_state,
                lambda m, b: m.append("live", [1], reserve_blocks=b),
            ),
            Entry(
                f"manager[{name}].advance(num_slots)",
                mgr,
                manager_state,
                lambda m, b: m.advance("live", b, 4),
                valid=(2**70,),
            ),
            Entry(
                f"manager[{name}].advance(num_computed)",
                mgr,
                manager_state,
                lambda m, b: m.advance("live", 12, b),
                accepts_none=True,
            ),
            Entry(
                f"manager[{name}].advance(reserve_blocks)",
                mgr,
                manager_state,
                lambda m, b: m.advance("live", 12, 4, reserve_blocks=b),
            ),
            Entry(
                f"manager[{name}].evict(num_blocks)", mgr, manager_state, lambda m, b: m.evict(b)
            ),
            Entry(
                f"manager[{name}].evict_blocks(ids)",
                mgr,
                manager_state,
                lambda m, b: m.evict_blocks([b]),
            ),
            Entry(
                f"manager[{name}].finish(request_id)",
                mgr,
                manager_state,
                lambda m, b: m.finish(b if isinstance(b, list) else f"ghost-{b!r}"),
            ),
        ]

        def vf(n: str = name) -> VLLMKVCacheManager:
            return vllm_facade(n)

        def sf(n: str = name) -> SGLangRadixCache:
            return sglang_facade(n)

        def vstate(f: VLLMKVCacheManager) -> Any:
            return manager_state(f.manager)

        def sstate(c: SGLangRadixCache) -> Any:
            return manager_state(c.manager)

        out += [
            Entry(
                f"vllm[{name}].allocate_slots(num_new_tokens)",
                vf,
                vstate,
                lambda f, b: f.allocate_slots(f.live, b),
                valid=(2**70,),
            ),
            Entry(
                f"vllm[{name}].allocate_slots(num_new_computed_tokens)",
                vf,
                vstate,
                lambda f, b: f.allocate_slots(SimpleRequest("n", [1, 2, 3]), 3, b),
            ),
            Entry(
                f"vllm[{name}].allocate_slots(num_lookahead_tokens)",
                vf,
                vstate,
                lambda f, b: f.allocate_slots(f.live, 1, num_lookahead_tokens=b),
            ),
            Entry(
                f"vllm[{name}].get_computed_blocks(tokens)",
                vf,
                vstate,
                lambda f, b: f.get_computed_blocks(SimpleRequest("n", [1, b])),
            ),
            Entry(f"vllm[{name}].evict_blocks(ids)", vf, vstate, lambda f, b: f.evict_blocks([b])),
            Entry(
                f"sglang[{name}].match_prefix(tokens)",
                sf,
                sstate,
                lambda c, b: c.match_prefix([1, b]),
            ),
            Entry(
                f"sglang[{name}].insert(value)", sf, sstate, lambda c, b: c.insert([8, 9], [b, 60])
            ),
            Entry(f"sglang[{name}].evict(num_tokens)", sf, sstate, lambda c, b: c.evict(b)),
            Entry(f"sglang[{name}].inc_lock_ref(node)", sf, sstate, lambda c, b: c.inc_lock_ref(b)),
            Entry(
                f"sglang[{name}].alloc_for_extend(priority)",
                sf,
                sstate,
                lambda c, b: c.alloc_for_extend(SimpleReq("n", [1, 2], priority=b)),
                accepts_none=True,
                valid=(-1, 2**70),
            ),
        ]
    out += [
        Entry(
            "TokenKey(priority)",
            lambda: None,
            lambda _: None,
            lambda _, b: TokenKey([1], priority=b),
            valid=(-1, 2**70),
        ),
        Entry(
            "HashChainIndex(verify)",
            lambda: None,
            lambda _: None,
            lambda _, b: HashChainIndex(4, verify=b),
            valid=(True,),
        ),
        Entry(
            "HashChainIndex(seed)",
            lambda: None,
            lambda _: None,
            lambda _, b: HashChainIndex(4, seed=b if not isinstance(b, (int, str)) else 1.5),
            accepts_none=True,
        ),
        Entry(
            "RadixIndex(eviction)",
            lambda: None,
            lambda _: None,
            lambda _, b: RadixIndex(1, eviction=b),
        ),
        Entry(
            "BlockAllocator(num_blocks)",
            lambda: None,
            lambda _: None,
            lambda _, b: BlockAllocator(b),
        ),
        Entry(
            "BlockAllocator.allocate(num_blocks)",
            lambda: BlockAllocator(8),
            lambda a: tuple(a.free_block_ids()),
            lambda a, b: a.allocate(b),
            valid=(2**70,),
        ),
        Entry(
            "BlockAllocator.free(ids)",
            lambda: _allocator_with(3),
            lambda a: tuple(a.free_block_ids()),
            lambda a, b: a.free(b),
            valid=([1],),
        ),
        Entry(
            "BlockAllocator.free(id)",
            lambda: _allocator_with(3),
            lambda a: tuple(a.free_block_ids()),
            lambda a, b: a.free([0, b]),
        ),
        Entry(
            "BlockAllocator.owner_of(id)",
            lambda: BlockAllocator(8),
            lambda a: tuple(a.free_block_ids()),
            lambda a, b: a.owner_of(b),
        ),
        Entry(
            "token_slot(position)",
            lambda: None,
            lambda _: None,
            lambda _, b: token_slot([0, 1], b, 4),
        ),
        Entry(
            "token_slot(block_size)",
            lambda: None,
            lambda _: None,
            lambda _, b: token_slot([0, 1], 1, b),
        ),
        Entry(
            "slot_mapping(end)",
            lambda: None,
            lambda _: None,
            lambda _, b: slot_mapping([0, 1], 0, b, 4),
        ),
        Entry(
            "pad_block_tables(width)",
            lambda: None,
            lambda _: None,
            lambda _, b: pad_block_tables([[0]], b),
            accepts_none=True,
        ),
        Entry(
            "PagedKVCache(num_layers)",
            lambda: None,
            lambda _: None,
            lambda _, b: PagedKVCache(b, 2, 4, 4, 2),
        ),
        Entry(
            "PagedKVCache.gather(layer)",
            paged_kv,
            lambda c: c.kv.clone().sum().item(),
            lambda c, b: c.gather(b, [0], 2),
        ),
        Entry(
            "PagedKVCache.gather(num_tokens)",
            paged_kv,
            lambda c: c.kv.sum().item(),
            lambda c, b: c.gather(0, [0], b),
        ),
        Entry(
            "EngineConfig(num_blocks)",
            lambda: None,
            lambda _: None,
            lambda _, b: EngineConfig(num_blocks=b),
        ),
        Entry(
            "Engine.add_request(max_new_tokens)",
            lambda: Engine(EngineConfig(num_blocks=16)),
            lambda e: e.stats.num_requests,
            lambda e, b: e.add_request([1, 2, 3], b),
        ),
        Entry(
            "Engine.add_request(token)",
            lambda: Engine(EngineConfig(num_blocks=16)),
            lambda e: e.stats.num_requests,
            lambda e, b: e.add_request([1, b], 2),
        ),
    ]
    return out


def _allocator_with(n: int) -> BlockAllocator:
    a = BlockAllocator(8)
    a.allocate(n)
    return a


ENTRIES = _entries()
CASES = [pytest.param(e, bad, id=f"{e.name}={bad!r}"[:90]) for e in ENTRIES for bad in wrong_for(e)]


@pytest.mark.parametrize(("entry", "bad"), CASES)
def test_every_entry_point_refuses_every_wrong_value(entry: Entry, bad: Any) -> None:
    obj = entry.build()
    before = entry.state(obj)
    with pytest.raises(PrefixKVError):
        entry.call(obj, bad)
    assert entry.state(obj) == before, f"{entry.name}({bad!r}) changed the state"
