"""What KV events cost: a request's lifecycle with and without a recorder on the index.

The same lifecycle as ``test_index_ops.test_request_lifecycle`` (admit, commit, 16
decode tokens, finish; half the prompt shared, a pool small enough to evict), with the
events taken once per step as an engine does. ``off`` is the no-sink path every index
pays by default; ``on`` adds the recorder (for the radix tree, SGLang's page digests:
one sha256 per page). The hash chain is run with xxh3_128 (its default) and with
vLLM's sha256_cbor (what a vLLM-compatible publisher uses).

    make bench      # or: .venv/bin/python -m pytest benchmarks/test_event_ops.py --benchmark-only
"""

from __future__ import annotations

import pytest
from conftest import PROMPT_LENS, tokens
from pytest_benchmark.fixture import BenchmarkFixture

from prefixkv.adapters import CacheManager
from prefixkv.adapters.events import attach_event_recorder
from prefixkv.indexes import make_index
from prefixkv.indexes.registry import pool_owned_options
from prefixkv.storage import BlockAllocator

BACKENDS = [
    ("hash_chain", 16, "xxh3_128"),
    ("hash_chain", 16, "sha256_cbor"),
    ("radix", 1, None),
    ("radix", 16, None),
]


@pytest.mark.parametrize("events", ["off", "on"])
@pytest.mark.parametrize("prompt_len", PROMPT_LENS[:4])
@pytest.mark.parametrize(
    ("name", "bs", "algo"), BACKENDS, ids=[f"{n}-{b}-{a or 'sglang'}" for n, b, a in BACKENDS]
)
def test_lifecycle_with_events(
    benchmark: BenchmarkFixture, name: str, bs: int, algo: str | None, prompt_len: int, events: str
) -> None:
    options = pool_owned_options(name)
    if algo is not None:
        options.update(hash_algorithm=algo, seed=0)
    index = make_index(name, block_size=bs, **options)
    recorder = attach_event_recorder(index) if events == "on" else None
    shared = tokens(prompt_len // 2, seed=9)
    # two requests' worth of blocks: every admission evicts the previous request's tail
    m = CacheManager(index, BlockAllocator(2 * (prompt_len + 64) // bs + 8))
    counter = iter(range(10**9))
    taken = [0]

    def step() -> None:
        if recorder is not None:
            taken[0] += len(recorder.take_events())

    def one() -> None:
        rid = next(counter)
        prompt = shared + tokens(prompt_len - len(shared), seed=rid)
        m.admit(rid, prompt)
        m.commit(rid, len(prompt))
        step()
        for t in range(16):
            m.append(rid, [t + 1])
            m.commit(rid, len(prompt) + t + 1)
            step()
        m.finish(rid)
        step()

    benchmark(one)
    m.check_invariants()
    assert (taken[0] > 0) == (events == "on")
