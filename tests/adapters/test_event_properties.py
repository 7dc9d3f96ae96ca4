"""A consumer fed only by the events knows exactly what the index holds, after every step.

Both backends behind both engine classes, pools so small that nearly every admission evicts,
shared prefixes, duplicates, namespaces (salts, LoRA, SGLang's extra key), resets and
(vLLM's KV-connector path) ``evict_blocks``: after each scheduler step the step's
events are applied to an :class:`EventIndex`, whose blocks (with their copies) must
equal the entries the index holds, in the wire form of the index's dialect.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kv_event_drivers import Driver, SGLangDriver, VllmDriver, attach_recorder

from prefixkv.adapters.events import EventIndex
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.vllm import KVCacheManager
from prefixkv.indexes import make_index
from prefixkv.indexes.registry import pool_owned_options
from prefixkv.indexes.sglang_hashing import to_event_hash
from prefixkv.indexes.vllm_hashing import to_external_block_hash

WIRE = {"vllm": to_external_block_hash, "sglang": to_event_hash}
PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 9], [7, 8]]
NAMESPACES: list[dict[str, Any]] = [
    {},
    {},
    {"cache_salt": "a"},
    {"lora": {"name": "sql", "id": 1, "path": "/sql"}, "extra_key": "sql"},
    {"extra_key": "x"},
]

requests = st.lists(
    st.tuples(
        st.integers(0, len(PREFIXES) - 1),
        st.lists(st.integers(1, 4), max_size=5),  # the request's own suffix
        st.integers(0, 4),  # output tokens
        st.integers(0, len(NAMESPACES) - 1),
        st.sampled_from(["admit", "admit", "admit", "reset", "evict_blocks"]),
        st.lists(st.integers(0, 15), max_size=3),  # evict_blocks' ids
    ),
    min_size=1,
    max_size=14,
)


def check(index: Any, recorder: Any, consumer: EventIndex) -> None:
    batch = recorder.take_batch(0.0)
    if batch is not None:
        consumer.apply(batch, "replica")
    wire = WIRE[index.kv_event_dialect]
    held = Counter(wire(d) for d in index.cached_block_hashes())
    known: Counter[int | bytes] = Counter()
    for source in consumer.sources():
        known.update(consumer.blocks(source))
    assert known == held


class Run(NamedTuple):
    """One replay: the trace and its schedule, block size and pool (blocks)."""

    trace: list[tuple[int, list[int], int, int, str, list[int]]]
    concurrency: int
    block_size: int
    pool: int


@pytest.mark.parametrize("engine_class", ["vllm", "sglang"])
@pytest.mark.parametrize("backend", ["hash_chain", "radix"])
@given(
    run=st.builds(
        Run,
        trace=requests,
        concurrency=st.integers(1, 3),
        block_size=st.sampled_from([1, 2]),
        pool=st.integers(7, 12),
    )
)
def test_event_consumer_mirrors_the_index_after_every_step(
    backend: str, engine_class: str, run: Run
) -> None:
    replay_checked(backend, engine_class, run)


def replay_checked(backend: str, engine_class: str, run: Run) -> int:
    """Replay ``run``, checking the consumer after every step; returns blocks evicted."""
    trace, concurrency, block_size, pool = run
    index = make_index(backend, block_size=block_size, **pool_owned_options(backend))
    consumer = EventIndex()
    driver: Driver
    if engine_class == "vllm":
        vllm = KVCacheManager(index, pool + 1, enable_kv_cache_events=True)
        recorder = attach_recorder(vllm)
        driver = VllmDriver(vllm, lambda: check(index, recorder, consumer))
    else:
        sglang = PrefixCache.create_simulated(index, pool * block_size, enable_kv_cache_events=True)
        recorder = attach_recorder(sglang)
        driver = SGLangDriver(sglang, lambda: check(index, recorder, consumer))
    check(index, recorder, consumer)
    for i, (prefix, suffix, num_out, ns, op, ids) in enumerate(trace):
        if op == "reset":
            while driver.live:
                driver.finish_oldest()
            assert driver.reset()
            continue
        if op == "evict_blocks" and engine_class == "vllm" and backend == "hash_chain":
            assert isinstance(driver, VllmDriver)
            driver.cache.evict_blocks([b for b in ids if b < pool])
            check(index, recorder, consumer)
            continue
        while len(driver.live) >= concurrency:
            driver.finish_oldest()
        tokens = PREFIXES[prefix] + suffix
        output = [(i + k) % 5 + 1 for k in range(num_out)]
        driver.admit({"id": f"r{i}", "tokens": tokens, "output": output, **NAMESPACES[ns]})
    while driver.live:
        driver.finish_oldest()
    return index.stats().num_evicted_blocks


@pytest.mark.parametrize("engine_class", ["vllm", "sglang"])
@pytest.mark.parametrize("backend", ["hash_chain", "radix"])
def test_the_pools_evict_constantly(backend: str, engine_class: str) -> None:
    # The property's pools are tiny: a plain run of distinct requests keeps evicting.
    trace = [(i % 3, [i % 4 + 1, i % 3 + 1], 3, i % 5, "admit", []) for i in range(30)]
    assert replay_checked(backend, engine_class, Run(trace, 2, 2, 8)) >= 20
