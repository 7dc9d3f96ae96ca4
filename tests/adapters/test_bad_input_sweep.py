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
from helpers import cache_state, manager_state

from prefixkv.adapters.engine import Engine, EngineConfig, ModelConfig
from prefixkv.adapters.events.transport import ZmqEventPublisher, ZmqEventSubscriber
from prefixkv.adapters.lab.cluster.config import ClusterSettings
from prefixkv.adapters.lab.cluster.faults import FaultPlan, ScheduledFault, parse_faults
from prefixkv.adapters.lab.sim import (
    COEFFICIENTS,
    CostProfile,
    SimSettings,
    fixed_rate_arrivals,
    poisson_arrivals,
    with_arrivals,
)
from prefixkv.adapters.lab.sim.calibration import measure_engine
from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import PageRows, PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
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


def index_with_content(name: str) -> Any:
    index = make_index(name, block_size=2)
    index.insert(TokenKey([1, 2, 3, 4]), [0, 1])
    return index


def index_state(index: Any) -> Any:
    return (index.stats(), tuple(index.cached_blocks(TokenKey([1, 2, 3, 4]))))


# Each engine class's running request, by engine class (a compiled one takes no new
# attributes).
LIVE: dict[int, Any] = {}


def vllm_manager(name: str) -> KVCacheManager:
    f = KVCacheManager(make_index(name, block_size=2), num_blocks=33)
    req = SimpleRequest("live", [1, 2, 3, 4, 5])
    f.get_computed_blocks(req)
    f.allocate_slots(req, 5)
    req.num_computed_tokens = 5
    req.append_output_token_ids(7)
    LIVE[id(f)] = req
    return f


def sglang_cache(name: str) -> PrefixCache:
    c = PrefixCache.create_simulated(make_index(name, block_size=1), capacity_tokens=64)
    req = SimpleReq("live", [1, 2, 3, 4])
    alloc_for_extend(c, req)
    req.output_ids.append(5)
    c.cache_unfinished_req(req)
    LIVE[id(c)] = req
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


def on(label: str, build: Callable[[], Any], state: Callable[[Any], Any]) -> Callable[..., Entry]:
    """Entries on one kind of object: ``at(what, call, ...)`` is the entry ``label.what``
    (``what`` alone for an unlabelled group) built by ``build``, snapshot by ``state``."""

    def at(what: str, call: Callable[[Any, Any], object], **options: Any) -> Entry:
        return Entry(f"{label}.{what}" if label else what, build, state, call, **options)

    return at


def _free_ids(a: BlockAllocator) -> Any:
    return tuple(a.free_block_ids())


def _entries() -> list[Entry]:
    out: list[Entry] = []
    bare = on("", lambda: None, lambda _: None)
    for name in ("hash_chain", "radix"):

        def mk(n: str = name) -> Any:
            return index_with_content(n)

        index = on(name, mk, index_state)

        out += [
            index(
                "match_prefix(max_num_tokens)",
                lambda i, b: i.match_prefix(TokenKey([1, 2, 3, 4]), b),
                accepts_none=True,
            ),
            index(
                "insert(num_tokens)",
                lambda i, b: i.insert(TokenKey([1, 2, 3, 4, 5, 6]), [0, 1, 2], b),
                accepts_none=True,
            ),
            index("insert(block_ids item)", lambda i, b: i.insert(TokenKey([7, 8, 9, 10]), [b, 5])),
            index("insert(block_ids)", lambda i, b: i.insert(TokenKey([7, 8, 9, 10]), b)),
            index("evict(num_blocks)", lambda i, b: i.evict(b)),
            index("lock(handle)", lambda i, b: i.lock(b)),
            index("unlock(handle)", lambda i, b: i.unlock(b)),
            index("count_evictable(handle)", lambda i, b: i.count_evictable(b)),
            index(
                "cached_blocks(max_num_tokens)",
                lambda i, b: i.cached_blocks(TokenKey([1, 2, 3, 4]), b),
                accepts_none=True,
            ),
            bare(
                f"make_index({name}, block_size)",
                lambda _, b, n=name: make_index(n, block_size=b),
                accepts_none=True,
            ),
        ]

        def mgr(n: str = name) -> CacheManager:
            return busy_manager(n)

        manager = on(f"manager[{name}]", mgr, manager_state)

        out += [
            manager("admit(tokens)", lambda m, b: m.admit("new", b), valid=([1],)),
            manager("admit(token)", lambda m, b: m.admit("new", [1, 2, b])),
            manager(
                "admit(num_tokens)",
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], num_tokens=b),
                accepts_none=True,
            ),
            manager(
                "admit(reserve_blocks)",
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], reserve_blocks=b),
            ),
            manager(
                "admit(priority)",
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], priority=b),
                accepts_none=True,
                valid=(-1, 2**70),
            ),
            manager(
                "admit(extra_key)",
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], b if b != "3" else 5),
                accepts_none=True,
            ),
            manager(
                "admit(lookup)",
                lambda m, b: m.admit("new", [1, 2, 3, 4, 8], lookup=b),
                accepts_none=True,
            ),
            manager(
                "admit(request_id)",
                lambda m, b: m.admit(b if isinstance(b, list) else "live", [1, 2, 3]),
            ),
            manager("commit(num_tokens)", lambda m, b: m.commit("live", b)),
            manager("append(tokens)", lambda m, b: m.append("live", [b])),
            manager(
                "append(num_slots)",
                lambda m, b: m.append("live", [1], num_slots=b),
                accepts_none=True,
            ),
            manager("append(reserve_blocks)", lambda m, b: m.append("live", [1], reserve_blocks=b)),
            manager("advance(num_slots)", lambda m, b: m.advance("live", b, 4), valid=(2**70,)),
            manager(
                "advance(num_computed)", lambda m, b: m.advance("live", 12, b), accepts_none=True
            ),
            manager(
                "advance(reserve_blocks)", lambda m, b: m.advance("live", 12, 4, reserve_blocks=b)
            ),
            manager(
                "advance(tokens)",
                lambda m, b: m.advance("live", 8, 8, tokens=b),
                accepts_none=True,
                valid=([1],),
            ),
            manager(
                "advance(token)",
                lambda m, b: m.advance("live", 8, 8, tokens=[1, 2, 3, 4, 9, 9, b, 7]),
            ),
            manager("evict(num_blocks)", lambda m, b: m.evict(b)),
            manager("evict_blocks(ids)", lambda m, b: m.evict_blocks([b])),
            manager(
                "finish(request_id)",
                lambda m, b: m.finish(b if isinstance(b, list) else f"ghost-{b!r}"),
            ),
        ]

        def vf(n: str = name) -> KVCacheManager:
            return vllm_manager(n)

        def sf(n: str = name) -> PrefixCache:
            return sglang_cache(n)

        def vstate(f: KVCacheManager) -> Any:
            return manager_state(f.manager)

        def sstate(c: PrefixCache) -> Any:
            return cache_state(c, [LIVE[id(c)]])

        vllm = on(f"vllm[{name}]", vf, vstate)
        sglang = on(f"sglang[{name}]", sf, sstate)

        out += [
            vllm(
                "allocate_slots(num_new_tokens)",
                lambda f, b: f.allocate_slots(LIVE[id(f)], b),
                valid=(2**70,),
            ),
            vllm(
                "allocate_slots(num_new_computed_tokens)",
                lambda f, b: f.allocate_slots(SimpleRequest("n", [1, 2, 3]), 3, b),
            ),
            vllm(
                "allocate_slots(num_lookahead_tokens)",
                lambda f, b: f.allocate_slots(LIVE[id(f)], 1, num_lookahead_tokens=b),
                valid=(2**70,),
            ),
            vllm(
                "allocate_slots(reserved_blocks)",
                lambda f, b: f.allocate_slots(LIVE[id(f)], 1, reserved_blocks=b),
                valid=(2**70,),
            ),
            vllm(
                "allocate_slots(num_external_computed_tokens)",
                lambda f, b: f.allocate_slots(LIVE[id(f)], 1, num_external_computed_tokens=b),
            ),
            vllm(
                "get_computed_blocks(max_cache_hit_length)",
                lambda f, b: f.get_computed_blocks(SimpleRequest("n", [1, 2, 3]), b),
                accepts_none=True,
                valid=(2**70,),
            ),
            vllm(
                "get_computed_blocks(tokens)",
                lambda f, b: f.get_computed_blocks(SimpleRequest("n", [1, b])),
            ),
            vllm("evict_blocks(ids)", lambda f, b: f.evict_blocks([b])),
            sglang("match_prefix(tokens)", lambda c, b: c.match_prefix([1, b])),
            sglang(
                "match_prefix(extra_key)",
                lambda c, b: c.match_prefix([1, 2], b),
                accepts_none=True,
                valid=("3", -1, 2**70),  # a str (or an int) names a namespace
            ),
            sglang(
                "match_prefix(cache_salt)",
                lambda c, b: c.match_prefix([1, 2], None, b),
                accepts_none=True,
                valid=("3", -1, 2**70),
            ),
            sglang(
                "match_prefix(lora_id)",
                lambda c, b: c.match_prefix([1, 2], lora_id=b),
                accepts_none=True,
                valid=("3", -1, 2**70),
            ),
            sglang(
                "match_prefix(max_prefix_len)",
                lambda c, b: c.match_prefix([1, 2], max_prefix_len=b),
                accepts_none=True,
                valid=(2**70,),
            ),
            sglang("insert(value)", lambda c, b: c.insert([8, 9], [b, 60])),
            sglang("insert(tokens)", lambda c, b: c.insert([8, b], [59, 60])),
            sglang("evict(num_tokens)", lambda c, b: c.evict(b)),
            sglang("inc_lock_ref(node)", lambda c, b: c.inc_lock_ref(b)),
            sglang("dec_lock_ref(node)", lambda c, b: c.dec_lock_ref(b)),
            sglang("lock(node)", lambda c, b: c.lock(b)),
            sglang("unlock(lock)", lambda c, b: c.unlock(b), accepts_none=True),
            sglang("checkpoint(up_to)", lambda c, b: c.checkpoint(LIVE[id(c)], up_to=b)),
            sglang(
                "checkpoint(final)",
                lambda c, b: c.checkpoint(LIVE[id(c)], up_to=5, final=b),
                valid=(True,),
            ),
            sglang(
                "cache_finished_req(is_insert)",
                lambda c, b: c.cache_finished_req(LIVE[id(c)], b),
                valid=(True,),
            ),
            sglang(
                "alloc_for_extend(priority)",
                lambda c, b: alloc_for_extend(c, SimpleReq("n", [1, 2], priority=b)),
                accepts_none=True,
                valid=(-1, 2**70),
            ),
            sglang(
                "alloc_for_extend(token)",
                lambda c, b: alloc_for_extend(c, SimpleReq("n", [1, b])),
            ),
            sglang(
                "alloc_for_extend(extra_key)",
                lambda c, b: alloc_for_extend(c, SimpleReq("n", [1, 2], extra_key=b)),
                accepts_none=True,
                valid=("3", -1, 2**70),
            ),
            bare(
                f"PrefixCache.create_simulated({name}, capacity_tokens)",
                lambda _, b, n=name: PrefixCache.create_simulated(n, b),
            ),
            bare(
                f"PrefixCache.create_simulated({name}, page_size)",
                lambda _, b, n=name: PrefixCache.create_simulated(n, 64, b),
                accepts_none=True,
            ),
        ]
    allocator = on("BlockAllocator", lambda: BlockAllocator(8), _free_ids)
    rows = on("", _rows_with_one, lambda r: (r.num_rows_in_use(), tuple(r.pages(0))))
    allocated = on("BlockAllocator", lambda: _allocator_with(3), _free_ids)
    engine = on(
        "Engine", lambda: Engine(EngineConfig(num_blocks=16)), lambda e: e.stats.num_requests
    )
    out += [
        bare("TokenKey(priority)", lambda _, b: TokenKey([1], priority=b), valid=(-1, 2**70)),
        bare("HashChainIndex(verify)", lambda _, b: HashChainIndex(4, verify=b), valid=(True,)),
        bare(
            "HashChainIndex(seed)",
            lambda _, b: HashChainIndex(4, seed=b if not isinstance(b, (int, str)) else 1.5),
            accepts_none=True,
        ),
        bare("RadixIndex(eviction)", lambda _, b: RadixIndex(1, eviction=b)),
        bare(
            "HashChainIndex(hash_algorithm)",
            lambda _, b: HashChainIndex(4, hash_algorithm=b),
            accepts_none=True,
        ),
        bare(
            "make_index(hash_chain, hash_algorithm)",
            lambda _, b: make_index("hash_chain", block_size=4, hash_algorithm=b),
        ),
        bare(
            "CacheManager(observers)",
            lambda _, b: CacheManager(RadixIndex(1), BlockAllocator(4), observers=b),
        ),
        bare("vllm.KVCacheManager(observers)", lambda _, b: KVCacheManager(observers=b)),
        bare("vllm.KVCacheManager(engine_types)", lambda _, b: KVCacheManager(engine_types=b)),
        bare(
            "PrefixCache.create_simulated(observers)",
            lambda _, b: PrefixCache.create_simulated("radix", 64, observers=b),
        ),
        bare(
            "PrefixCache.create_simulated(fold_lora)",
            lambda _, b: PrefixCache.create_simulated("radix", 64, fold_lora=b),
            valid=(True,),
        ),
        bare("BlockAllocator(num_blocks)", lambda _, b: BlockAllocator(b)),
        bare("vllm.KVCacheManager(num_blocks)", lambda _, b: KVCacheManager(num_blocks=b)),
        bare(
            "vllm.KVCacheManager(max_model_len)",
            lambda _, b: KVCacheManager(num_blocks=8, max_model_len=b),
            accepts_none=True,
            valid=(2**70,),
        ),
        bare("vllm.KVCacheManager(watermark)", lambda _, b: KVCacheManager(watermark=b)),
        bare(
            "PrefixCache.create_simulated(max_running_requests)",
            lambda _, b: PrefixCache.create_simulated("radix", 64, max_running_requests=b),
            accepts_none=True,
            valid=(2**70,),
        ),
        rows("PageRows.write(start)", lambda r, b: r.write(0, b, [1])),
        rows("PageRows.write(page_ids)", lambda r, b: r.write(0, 0, [b])),
        rows("PageRows.read(row)", lambda r, b: r.read(b, 0, 1)),
        rows("PageRows.read(start)", lambda r, b: r.read(0, b, 2)),
        rows("PageRows.read(stop)", lambda r, b: r.read(0, 0, b)),
        rows("PageRows.free(row)", lambda r, b: r.free(b)),
        allocator("allocate(num_blocks)", lambda a, b: a.allocate(b), valid=(2**70,)),
        allocated("free(ids)", lambda a, b: a.free(b), valid=([1],)),
        allocated("free(id)", lambda a, b: a.free([0, b])),
        allocator("owner_of(id)", lambda a, b: a.owner_of(b)),
        bare("token_slot(position)", lambda _, b: token_slot([0, 1], b, 4)),
        bare("token_slot(block_size)", lambda _, b: token_slot([0, 1], 1, b)),
        bare("slot_mapping(end)", lambda _, b: slot_mapping([0, 1], 0, b, 4)),
        bare("pad_block_tables(width)", lambda _, b: pad_block_tables([[0]], b), accepts_none=True),
        bare("PagedKVCache(num_layers)", lambda _, b: PagedKVCache(b, 2, 4, 4, 2)),
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
        bare("EngineConfig(num_blocks)", lambda _, b: EngineConfig(num_blocks=b)),
        engine("add_request(max_new_tokens)", lambda e, b: e.add_request([1, 2, 3], b)),
        engine("add_request(token)", lambda e, b: e.add_request([1, b], 2)),
    ]
    return out + _lab_entries(bare) + _transport_entries(bare)


def _profile(**coefficients: Any) -> CostProfile:
    return CostProfile("p", "m", "d", **{**dict.fromkeys(COEFFICIENTS, 1e-3), **coefficients})


def _calibration(**sizes: Any) -> object:
    """A calibration of one tiny shape on a model of ``sizes``: refused before it allocates."""
    config = EngineConfig(model=ModelConfig(**sizes))
    return measure_engine(config, prefill=((8, 0),), decode=(), mixed=(), repeats=1)


def _lab_entries(bare: Callable[..., Entry]) -> list[Entry]:
    """The numbers the lab's library layers take: profiles, faults, fleets, schedulers,
    arrival processes, calibration sizes. NaN, infinity and huge values included."""
    out = [
        bare(f"CostProfile({n})", lambda _, b, n=n: _profile(**{n: b}), valid=(1.5,))
        for n in COEFFICIENTS
    ]
    for n in ("drop", "drop_removals", "lose_completions"):
        out.append(bare(f"parse_faults({n}=)", lambda _, b, n=n: parse_faults(f"{n}={b}")))
        out.append(bare(f"FaultPlan({n})", lambda _, b, n=n: FaultPlan(**{n: b})))
    for n in ("delay", "jitter"):
        out.append(
            bare(
                f"parse_faults({n}=)", lambda _, b, n=n: parse_faults(f"{n}={b}"), valid=("3", 1.5)
            )
        )
        out.append(bare(f"FaultPlan({n})", lambda _, b, n=n: FaultPlan(**{n: b}), valid=(1.5,)))
    out += [
        bare("parse_faults(kill=0@T)", lambda _, b: parse_faults(f"kill=0@{b}"), valid=("3", 1.5)),
        bare("parse_faults(kill=R@1)", lambda _, b: parse_faults(f"kill={b}@1"), valid=("3",)),
        bare(
            "FaultPlan(timed at)",
            lambda _, b: FaultPlan(scheduled=(ScheduledFault("kill", b, 0),)),
            valid=(1.5,),
        ),
        bare(
            "FaultPlan(timed replica)",
            lambda _, b: FaultPlan(scheduled=(ScheduledFault("kill", 1.0, b),)),
            accepts_none=True,
        ),
    ]
    for n in ("num_replicas", "capacity_tokens", "block_size", "buffer_steps"):
        out.append(bare(f"ClusterSettings({n})", lambda _, b, n=n: ClusterSettings(**{n: b})))
    out += [
        bare(
            "ClusterSettings(reservation_ttl)",
            lambda _, b: ClusterSettings(reservation_ttl=b),
            valid=(1.5,),
        ),
        bare("ClusterSettings(seed)", lambda _, b: ClusterSettings(seed=b), valid=(-1, 2**70)),
        bare("SimSettings(max_num_seqs)", lambda _, b: SimSettings(max_num_seqs=b)),
        bare(
            "SimSettings(max_num_batched_tokens)",
            lambda _, b: SimSettings(max_num_batched_tokens=b),
        ),
        bare("poisson_arrivals(rate)", lambda _, b: poisson_arrivals(b), valid=(1.5,)),
        bare("fixed_rate_arrivals(rate)", lambda _, b: fixed_rate_arrivals(b), valid=(1.5,)),
        bare(
            "with_arrivals(request_rate)",
            lambda _, b: with_arrivals([], request_rate=b),
            accepts_none=True,
            valid=(1.5,),
        ),
        bare(
            "with_arrivals(time_scale)",
            lambda _, b: with_arrivals([], time_scale=b),
            accepts_none=True,
            valid=(1.5,),
        ),
        bare("measure_engine(head_dim)", lambda _, b: _calibration(head_dim=b)),
        bare("measure_engine(vocab_size)", lambda _, b: _calibration(vocab_size=b)),
        bare("measure_engine(num_layers)", lambda _, b: _calibration(num_layers=b)),
        bare(
            "measure_engine(repeats)",
            lambda _, b: measure_engine(prefill=((8, 0),), decode=(), mixed=(), repeats=b),
        ),
        bare(
            "measure_engine(shape)",
            lambda _, b: measure_engine(prefill=((b, 0),), decode=(), mixed=(), repeats=1),
        ),
    ]
    return out


def _publisher(**options: Any) -> object:
    """A publisher of bad options: refused before any socket opens (closed if not)."""
    pub = ZmqEventPublisher("inproc://sweep", **options)
    pub.shutdown()
    return pub


def _subscriber(**options: Any) -> object:
    sub = ZmqEventSubscriber("inproc://sweep", lambda s, b: None, **options)
    sub.close()
    return sub


def _transport_entries(bare: Callable[..., Entry]) -> list[Entry]:
    """The ZeroMQ publisher's and subscriber's options."""
    out = [
        bare(f"ZmqEventPublisher({n})", lambda _, b, n=n: _publisher(**{n: b}))
        for n in ("buffer_steps", "hwm", "max_queue_size", "data_parallel_rank")
    ]
    out += [
        bare(f"ZmqEventPublisher({n})", lambda _, b, n=n: _publisher(**{n: b}), valid=(1.5,))
        for n in ("publish_timeout", "replay_grace", "heartbeat")
    ]
    out += [
        bare(f"ZmqEventSubscriber({n})", lambda _, b, n=n: _subscriber(**{n: b}))
        for n in ("remember", "hwm", "max_payload_bytes")
    ]
    out += [
        bare(f"ZmqEventSubscriber({n})", lambda _, b, n=n: _subscriber(**{n: b}), valid=(1.5,))
        for n in ("replay_timeout", "heartbeat")
    ]
    out.append(
        bare(
            "ZmqEventSubscriber(probe_interval)",
            lambda _, b: _subscriber(probe_interval=b),
            accepts_none=True,
            valid=(1.5,),
        )
    )
    return out


def _rows_with_one() -> PageRows:
    r = PageRows()
    assert r.alloc() == 0
    r.write(0, 0, [3, 4])
    return r


def _allocator_with(n: int) -> BlockAllocator:
    a = BlockAllocator(8)
    a.allocate(n)
    return a


ENTRIES = _entries()
# Ids without addresses: pytest-xdist's workers must collect the same names.
CASES = [
    pytest.param(e, bad, id=f"{e.name}={'object()' if type(bad) is object else repr(bad)}"[:90])
    for e in ENTRIES
    for bad in wrong_for(e)
]


@pytest.mark.parametrize(("entry", "bad"), CASES)
def test_every_entry_point_refuses_every_wrong_value(entry: Entry, bad: Any) -> None:
    obj = entry.build()
    before = entry.state(obj)
    with pytest.raises(PrefixKVError):
        entry.call(obj, bad)
    assert entry.state(obj) == before, f"{entry.name}({bad!r}) changed the state"
