"""prefixkv inside SGLang 0.5.23: ``--radix-cache-backend prefixkv-radix|prefixkv-hash-chain``.

SGLang's scheduler-side cache flow (``sglang_oracle.SGLangReplay``: SGLang's own match,
lock, allocation, checkpoint and release helpers on its real CPU pools) drives
SGLang's ``RadixCache`` and prefixkv's cache over the same traces: the radix tree must
give ``RadixCache``'s hits request for request; the hash chain (a combination SGLang
does not offer) runs with pool conservation checked after every step.
"""

from __future__ import annotations

from typing import Any

import pytest
import sglang_oracle  # the oracle installs the torchvision stand-in
from sglang.srt.mem_cache.registry import (
    TreeCacheBuildContext,
    create_tree_cache,
    get_radix_cache_factory,
)

from prefixkv.adapters.errors import UnsupportedEngineFeatureError
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.sglang.plugin import BACKENDS, PrefixKVPrefixCache, register
from prefixkv.indexes import make_index

# (page size, K live requests, pool tokens per longest request: roomy or tight)
CONFIGS = [(ps, k, cap) for ps in (1, 16) for k in (1, 4) for cap in ("roomy", "tight")]


def capacity(reqs: list[dict[str, Any]], k: int, kind: str) -> int:
    longest = max(len(r["tokens"]) + len(r["output"]) for r in reqs)
    return 100 * longest if kind == "roomy" else k * longest + longest // 2


class Conserved:
    """After every step: every page is free, cached by the index, or privately held by a
    live request. The index's own structure is checked every ``every`` steps (O(cache))."""

    def __init__(self, every: int = 64) -> None:
        self.every = every
        self.steps = 0

    def __call__(self, rp: sglang_oracle.SGLangReplay) -> None:
        ps, cache = rp.page_size, rp.cache
        private = 0
        for req, _ in rp.live:
            allocated = -(-req.kv.kv_allocated_len // ps) * ps
            private += allocated - req.kv.cache_protected_len
        for req in rp.prefilling:  # its matched prefix is the tree's
            private += -(-req.kv.kv_allocated_len // ps) * ps - req.prefix_len
        free = rp.allocator.available_size()
        total = rp.allocator.size // ps * ps  # whole pages
        assert free + cache.total_size() + private == total, (free, cache.total_size(), private)
        self.steps += 1
        if isinstance(cache, PrefixKVPrefixCache) and self.steps % self.every == 0:
            cache.check_invariants()


def replay(
    reqs: list[dict[str, Any]], ps: int, k: int, cap: int, index: str | None, check: bool
) -> tuple[list[int], Any]:
    context = max(len(r["tokens"]) + len(r["output"]) + 2 for r in reqs)
    params = sglang_oracle.build_pools(ps, cap, k + 1, context)
    cache = (
        sglang_oracle.make_cache("radix", params)
        if index is None
        else PrefixKVPrefixCache(params, make_index(index, block_size=ps))
    )
    rp = sglang_oracle.SGLangReplay(cache, params, after_step=Conserved() if check else None)
    rp.run(reqs, k)
    assert cache.protected_size() == 0
    Conserved(every=1)(rp)
    return [h["hit_tokens"] for h in rp.hits], cache


@pytest.mark.parametrize(("ps", "k", "cap"), CONFIGS)
@pytest.mark.parametrize("trace", ["synthetic", "mixed", "mooncake"])
def test_radix_inside_sglang_equals_radix_cache(traces, report, trace, ps, k, cap) -> None:
    reqs = traces[trace]
    tokens = capacity(reqs, k, cap)
    native, _ = replay(reqs, ps, k, tokens, None, check=False)
    ours, _ = replay(reqs, ps, k, tokens, "radix", check=True)
    chain, _ = replay(reqs, ps, k, tokens, "hash_chain", check=True)
    diff = [i for i, (a, b) in enumerate(zip(native, ours, strict=True)) if a != b]
    report.add(
        engine="sglang",
        trace=trace,
        page_size=ps,
        k=k,
        pool=cap,
        capacity=tokens,
        requests=len(reqs),
        prompt_tokens=sum(len(r["tokens"]) for r in reqs),
        hits_radix_cache=sum(native),
        hits_prefixkv_radix=sum(ours),
        hits_prefixkv_hash_chain=sum(chain),
        differences=len(diff),
    )
    assert not diff, f"{len(diff)} requests differ, first {diff[:5]}"
    if cap == "roomy":
        # Without eviction the hash chain at the page size hits what the tree does.
        assert chain == native


def events_of(reqs: list[dict[str, Any]], ps: int, k: int, cap: int, index: str | None) -> Any:
    context = max(len(r["tokens"]) + len(r["output"]) + 2 for r in reqs)
    params = sglang_oracle.build_pools(ps, cap, k + 1, context)
    params.enable_kv_cache_events = True
    cache = (
        sglang_oracle.make_cache("radix", params)
        if index is None
        else PrefixKVPrefixCache(params, make_index(index, block_size=ps))
    )
    steps: list[Any] = []

    def after_step(rp: sglang_oracle.SGLangReplay) -> None:
        events = rp.cache.take_events()
        if events:
            steps.append(events)

    sglang_oracle.SGLangReplay(cache, params, after_step=after_step).run(reqs, k)
    return steps


@pytest.mark.parametrize("ps", [1, 16])
def test_kv_events_inside_sglang_equal_radix_caches(traces, ps) -> None:
    # SGLang's scheduler takes the tree's events after each step: with prefixkv's radix
    # tree they equal RadixCache's (page hashes, merged stores, per-node removals),
    # through eviction, as SGLang's own structs.
    reqs = traces["mixed"][:60]
    cap = capacity(reqs, 4, "tight")
    native = events_of(reqs, ps, 4, cap, None)
    ours = events_of(reqs, ps, 4, cap, "radix")
    assert sum(map(len, native)) > 50
    assert any(type(e).__name__ == "BlockRemoved" for step in native for e in step)
    assert ours == native


def test_backends_registered_by_sglangs_plugin_loader() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()  # reads the sglang.srt.plugins entry point of the installed prefixkv
    for name in BACKENDS:
        assert get_radix_cache_factory(name) is not None, name
    register()  # idempotent


def _context(params: Any, **flags: bool) -> TreeCacheBuildContext:
    from sglang.srt.server_args import ServerArgs

    base = dict(
        is_hybrid_swa=False,
        is_hybrid_ssm=False,
        enable_hierarchical_cache=False,
        disable_radix_cache=False,
    )
    return TreeCacheBuildContext(
        server_args=ServerArgs(model_path="dummy", device="cpu"),
        params=params,
        tp_worker=None,
        model_config=None,
        tp_size=1,
        tp_rank=0,
        tp_group=None,
        **{**base, **flags},
    )


@pytest.mark.parametrize(("name", "index"), sorted(BACKENDS.items()))
def test_radix_cache_backend_flag_builds_the_plugin(name, index) -> None:
    from sglang.srt.runtime_context import get_memory

    register()
    params = sglang_oracle.build_pools(16, 4096, 2, 512)
    memory = get_memory()
    saved = memory.radix_cache_backend
    object.__setattr__(memory, "radix_cache_backend", name)
    try:
        cache = create_tree_cache(_context(params))
    finally:
        object.__setattr__(memory, "radix_cache_backend", saved)
    assert isinstance(cache, PrefixKVPrefixCache)
    names = {"radix": "RadixIndex", "hash_chain": "HashChainIndex"}
    assert type(cache.index).__name__ == names[index]
    assert cache.page_size == 16


@pytest.mark.parametrize(
    ("flag", "feature"),
    [
        ("is_hybrid_swa", "sliding-window"),
        ("is_hybrid_ssm", "Mamba"),
        ("enable_hierarchical_cache", "hierarchical"),
    ],
)
def test_unsupported_features_refused_by_name(flag, feature) -> None:
    register()
    params = sglang_oracle.build_pools(1, 1024, 2, 512)
    factory = get_radix_cache_factory("prefixkv-radix")
    with pytest.raises(UnsupportedEngineFeatureError, match=feature):
        factory(_context(params, **{flag: True}))


@pytest.mark.parametrize("ps", [1, 16])
@pytest.mark.parametrize("index", [None, "radix", "hash_chain"])
def test_batched_prefills_free_duplicate_slots(ps, index) -> None:
    """Requests matched and allocated in one batch before any checkpoint compute the same
    prefix twice: the tree keeps one copy and the later request's slots go back to the
    pool (SPEC SG-3), exactly as many as with RadixCache; the hash chain keeps both."""
    shared = list(range(100, 100 + 3 * 16 + 5))
    reqs = [{"id": f"b{i}", "tokens": shared + [7 + i] * 9, "output": [1, 2, 3]} for i in range(3)]
    params = sglang_oracle.build_pools(ps, 4096, 4, 256)
    cache = (sglang_oracle.make_cache("radix", params) if index is None
             else PrefixKVPrefixCache(params, make_index(index, block_size=ps)))  # fmt: skip
    check = Conserved(every=1)
    rp = sglang_oracle.SGLangReplay(cache, params, after_step=check)
    started = [rp.start_prefill(r) for r in reqs]  # one prefill batch: all miss
    assert [h["hit_tokens"] for h in rp.hits] == [0, 0, 0]
    for req, sampled in started:
        rp.end_prefill(req, sampled)
    shared_tokens = len(shared) // ps * ps
    per_request = -(-(len(reqs[0]["tokens"])) // ps) * ps
    duplicates = 0 if index == "hash_chain" else 2 * shared_tokens
    assert rp.allocator.available_size() == 4096 // ps * ps - 3 * per_request + duplicates
    while rp.live:
        rp.finish_oldest()
    assert cache.protected_size() == 0


def _built(name: str, params: Any, **flags: bool) -> Any:
    """The cache SGLang builds for ``--radix-cache-backend name``."""
    from sglang.srt.runtime_context import get_memory

    register()
    memory = get_memory()
    saved = memory.radix_cache_backend
    object.__setattr__(memory, "radix_cache_backend", name)
    try:
        return create_tree_cache(_context(params, **flags))
    finally:
        object.__setattr__(memory, "radix_cache_backend", saved)


def test_the_cache_sglang_builds_is_the_class_make_test_replays() -> None:
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

    cache = _built("prefixkv-radix", sglang_oracle.build_pools(1, 1024, 2, 256))
    assert isinstance(cache, PrefixCache) and isinstance(cache, BasePrefixCache)
    # Only SGLang's typed entry points are the subclass's own: everything else
    # (checkpoint logic, locks, sizes, reset) runs PrefixCache's code.
    own = {n for n in vars(PrefixKVPrefixCache) if not n.startswith("_")}
    assert own == {"match_prefix", "touch_prefix", "inc_lock_ref", "dec_lock_ref",
                   "checkpoint", "evict", "take_events", "path_device_indices",
                   "dfs_weight_order"}  # fmt: skip
    for name in ("lock", "unlock", "reset", "evictable_size", "on_release", "total_size"):
        assert getattr(PrefixKVPrefixCache, name) is getattr(PrefixCache, name), name


def test_disable_radix_cache_gives_a_cache_that_shares_nothing() -> None:
    reqs = [{"id": f"r{i}", "tokens": [5, 6, 7, 8, 9, 10] + [i], "output": [1, 2]}
            for i in range(4)]  # fmt: skip
    params = sglang_oracle.build_pools(1, 256, 3, 64)
    cache = _built("prefixkv-radix", params, disable_radix_cache=True)
    assert isinstance(cache, PrefixKVPrefixCache)
    assert cache.disable and not cache.supports_prefix_sharing()
    rp = sglang_oracle.SGLangReplay(cache, params, after_step=Conserved(every=1))
    rp.run(reqs, 2)
    assert [h["hit_tokens"] for h in rp.hits] == [0, 0, 0, 0]
    assert cache.total_size() == 0 and rp.allocator.available_size() == 256


class _Metrics:
    """SGLang's ``RadixCacheMetricsCollector`` calls the cache makes on eviction."""

    def __init__(self) -> None:
        self.tokens = 0
        self.durations: list[float] = []

    def observe_eviction_duration(self, seconds: float) -> None:
        self.durations.append(seconds)

    def increment_eviction_num_tokens(self, n: int) -> None:
        self.tokens += n


@pytest.mark.parametrize("ps", [1, 16])
def test_evictions_reach_sglangs_eviction_metrics(ps: int) -> None:
    reqs = [{"id": f"r{i}", "tokens": [100 * i + t for t in range(40)], "output": [1, 2, 3]}
            for i in range(8)]  # fmt: skip
    params = sglang_oracle.build_pools(ps, 160, 2, 64)
    cache = PrefixKVPrefixCache(params, make_index("radix", block_size=ps))
    metrics = _Metrics()
    cache.metrics_collector = metrics
    sglang_oracle.SGLangReplay(cache, params, after_step=Conserved(every=1)).run(reqs, 1)
    evicted = cache.index.stats().num_evicted_blocks * ps
    assert evicted > 0 and metrics.tokens == evicted
    assert metrics.durations and all(d >= 0 for d in metrics.durations)


@pytest.mark.parametrize(
    ("flags", "params", "feature"),
    [
        ({"is_dsa": True}, {}, "sparse attention"),
        ({}, {"is_eagle": True}, "EAGLE"),
        ({}, {"eviction_policy": "lfu"}, "--radix-eviction-policy lfu"),
    ],
)
def test_more_features_refused_by_name(flags: Any, params: Any, feature: str) -> None:
    register()
    pools = sglang_oracle.build_pools(1, 1024, 2, 512)
    for k, v in params.items():
        setattr(pools, k, v)
    factory = get_radix_cache_factory("prefixkv-hash-chain")
    with pytest.raises(UnsupportedEngineFeatureError, match=feature):
        factory(_context(pools, **flags))


def test_the_build_the_run_names_is_the_build_sglang_runs() -> None:
    # The cache SGLang's factory builds runs on the build prefixkv reports (its
    # PrefixCache compiled exactly when the index core is), and, where the run names one
    # (PREFIXKV_EXPECT_BUILD=compiled with the compiled site first on PYTHONPATH), that
    # build: the suite then ran on the class SGLang loads, compiled.
    import os
    import sys

    from prefixkv.indexes.buildinfo import build_kind, compiled_modules

    register()
    cache = get_radix_cache_factory("prefixkv-radix")(
        _context(sglang_oracle.build_pools(1, 1024, 2, 512))
    )
    engine_class = next(c for c in type(cache).__mro__ if c.__name__ == "PrefixCache")
    runs = sys.modules[engine_class.__module__]
    kind = build_kind()
    compiled = runs.__name__ in compiled_modules()
    assert runs.__name__ == "prefixkv.adapters.sglang.prefix_cache"
    assert compiled == (kind == "compiled"), (runs.__spec__, kind)
    assert kind == os.environ.get("PREFIXKV_EXPECT_BUILD", kind)


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("index", [None, "radix"])
def test_touching_a_waiting_prefix_makes_lru_evict_it_last(ps: int, index: str | None) -> None:
    # SGLang's scheduler touches waiting requests' prefixes (touch_waiting_prefix, on by
    # default with LRU): the touched prefix outlives a newer untouched one.
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    a, b = list(range(10, 30)), list(range(40, 60))
    reqs = [{"id": "a", "tokens": a, "output": [1]}, {"id": "b", "tokens": b, "output": [1]}]
    params = sglang_oracle.build_pools(ps, 1024, 2, 64)
    cache = (sglang_oracle.make_cache("radix", params) if index is None
             else PrefixKVPrefixCache(params, make_index(index, block_size=ps)))  # fmt: skip
    sglang_oracle.SGLangReplay(cache, params).run(reqs, 1)  # a, then b: b is newer
    cache.touch_prefix(RadixKey(array("q", a)))
    cache.evict(EvictParams(num_tokens=1))  # one leaf: the least recently used

    def hit(tokens: list[int]) -> int:
        key = RadixKey(array("q", tokens + [99]))
        return int(cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len)

    assert (hit(a), hit(b)) == (20, 0)
