"""SPEC BB-7, hit for hit: prefixkv against hits recorded from the real engines.

``tests/data/fidelity/expected.json`` holds, for two traces (a mixed synthetic one
and the head of Mooncake's conversation trace, blocks scaled 512 -> 16), the
per-request hit tokens that vLLM 0.33's ``KVCacheManager`` and SGLang 0.5.23's
``RadixCache`` gave when driven like their schedulers, for block sizes, K-live
concurrencies and pool sizes with and without eviction. They were recorded by
``tests/engines/recorders/make_fidelity_fixtures.py``; CI replays them without the engines.
"""

from __future__ import annotations

import json
import re

import pytest
from helpers import TEST_DATA

from prefixkv.adapters.lab.replay import replay
from prefixkv.adapters.lab.traces import TraceRequest, load_any
from prefixkv.indexes import make_index

DATA = TEST_DATA / "fidelity"
TRACES = {
    "mixed": ("mixed.jsonl.gz", {}),
    "mooncake_conversation_head": ("mooncake_conversation_head.jsonl", {"tokens_per_id": 16}),
}
EXPECTED: dict[str, dict[str, list[int]]] = json.loads((DATA / "expected.json").read_text())
_cache: dict[str, list[TraceRequest]] = {}


def trace(name: str) -> list[TraceRequest]:
    if name not in _cache:
        fname, opts = TRACES[name]
        _cache[name] = load_any(DATA / fname, **opts)  # type: ignore[arg-type]
    return _cache[name]


CASES = [(name, key) for name, runs in EXPECTED.items() for key in runs]


@pytest.mark.parametrize(("trace_name", "run"), CASES, ids=[f"{n}: {k}" for n, k in CASES])
def test_bb_07_hits_equal_the_real_engines(trace_name: str, run: str) -> None:
    m = re.fullmatch(r"(vllm|sglang) bs=(\d+) k=(\d+) (blocks|tokens)=(\d+)", run)
    assert m, run
    engine, bs, k, size = m[1], int(m[2]), int(m[3]), int(m[5])
    if engine == "vllm":
        index, driver, blocks = make_index("hash_chain", block_size=bs), "vllm", size
    else:
        index, driver, blocks = make_index("radix", block_size=bs), "sglang", size // bs
    result = replay(trace(trace_name), index, blocks, driver=driver, concurrency=k)  # type: ignore[arg-type]
    got = [h["hit_tokens"] for h in result.hits]
    want = EXPECTED[trace_name][run]
    assert len(got) == len(want)
    diff = [(i, want[i], got[i]) for i in range(len(want)) if want[i] != got[i]]
    assert not diff, f"{len(diff)} requests differ (index, engine, prefixkv): {diff[:5]}"
    index.check_invariants()


def test_fixtures_exercise_eviction() -> None:
    # Each tight pool must cost hits against its roomy twin, or the "with eviction"
    # half of the fixtures proves nothing.
    for name, runs in EXPECTED.items():
        totals: dict[str, list[int]] = {}
        for run, hits in runs.items():
            config = run.rsplit(" ", 1)[0]
            totals.setdefault(config, []).append(sum(hits))
        for config, sums in totals.items():
            assert len(sums) == 2 and min(sums) < max(sums), (name, config, sums)
