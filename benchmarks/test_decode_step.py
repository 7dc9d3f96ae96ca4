"""One decode step through each engine class, called the way the engines' schedulers call it.

vLLM's scheduler calls ``allocate_slots(request, 1)`` for every running request on
every step and SGLang's allocates a slot (here ``alloc_for_decode(cache, req)``, the
scheduler-side step in ``prefixkv.adapters.sglang.simulated``). A round decodes ``STEPS``
tokens of one admitted request (a new block every ``block_size`` steps, registered
as the engines do), so the mean step includes its share of block additions. The
``driver`` rows run the same loop around a call that does nothing: subtract them to
get the engine class's own time per step (issue 17's goal: <= 0.5 µs).

    make bench                                     # the compiled build (the wheel)
    PREFIXKV_BUILD=pure make bench                 # the pure-Python package
    python -m pytest benchmarks/test_decode_step.py --benchmark-only
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import SCALE, tokens
from pytest_benchmark.fixture import BenchmarkFixture

from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest

STEPS = 16 if SCALE == "smoke" else 1024
ROUNDS = 2 if SCALE == "smoke" else 50
PROMPT = tokens(1000, seed=17)
OUTPUT = tokens(STEPS + 1, seed=18)


Setup = Callable[[], tuple[tuple[Any], dict[str, Any]]]


def vllm_rounds(kv_cache_manager: KVCacheManager | None, done: list[SimpleRequest]) -> Setup:
    """Setup of each round: the last round's request freed, a new one admitted."""
    counter = iter(range(10**9))

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        req = SimpleRequest(f"r{next(counter)}", list(PROMPT))
        if kv_cache_manager is not None:
            while done:
                kv_cache_manager.free(done.pop())
            blocks, hit, _ = kv_cache_manager.get_computed_blocks(req)
            kv_cache_manager.allocate_slots(req, req.num_tokens - hit, hit, blocks)
        req.num_computed_tokens = req.num_tokens
        req.append_output_token_ids(OUTPUT[0])
        done.append(req)
        return (req,), {}

    return setup


def sglang_rounds(cache: PrefixCache | None, done: list[SimpleReq]) -> Setup:
    """Setup of each round: the last round's request finished, a new one admitted."""
    counter = iter(range(10**9))

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        req = SimpleReq(f"r{next(counter)}", PROMPT)
        if cache is not None:
            while done:
                cache.cache_finished_req(done.pop())
            alloc_for_extend(cache, req)
        req.output_ids.append(OUTPUT[0])
        if cache is not None:
            cache.cache_unfinished_req(req)
        done.append(req)
        return (req,), {}

    return setup


def per_step(benchmark: BenchmarkFixture) -> None:
    """Record the mean time per decode step (nothing when benchmarks are disabled)."""
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info["us_per_step"] = stats["mean"] / STEPS * 1e6


@pytest.mark.parametrize(("index", "bs"), [("hash_chain", 16), ("radix", 16), ("driver", 16)])
def test_vllm_allocate_slots_decode_step(benchmark: BenchmarkFixture, index: str, bs: int) -> None:
    """``allocate_slots(request, 1)`` after the request's sampled token is appended."""
    num_blocks = (ROUNDS + 2) * (len(PROMPT) + STEPS + 1) // bs + 9  # the null block too
    kv_cache_manager = None if index == "driver" else KVCacheManager(index, num_blocks, bs)
    allocate = (
        kv_cache_manager.allocate_slots if kv_cache_manager is not None else lambda r, n: None
    )

    def decode(req: SimpleRequest) -> None:
        tokens_ = req.all_token_ids
        for k in range(1, STEPS + 1):
            allocate(req, 1)
            req.num_computed_tokens += 1
            tokens_.append(OUTPUT[k])

    done: list[SimpleRequest] = []
    benchmark.pedantic(decode, setup=vllm_rounds(kv_cache_manager, done), rounds=ROUNDS)
    per_step(benchmark)
    if kv_cache_manager is not None:
        kv_cache_manager.free(done.pop())
        kv_cache_manager.manager.check_invariants()


@pytest.mark.parametrize(("index", "page"), [("radix", 1), ("hash_chain", 16), ("driver", 1)])
def test_sglang_alloc_for_decode_step(benchmark: BenchmarkFixture, index: str, page: int) -> None:
    """``alloc_for_decode(cache, req)`` before the step's token is sampled."""
    capacity = (ROUNDS + 2) * (len(PROMPT) + STEPS + 16)
    cache = None if index == "driver" else PrefixCache.create_simulated(index, capacity, page)
    alloc = alloc_for_decode if cache is not None else lambda c, r: True

    def decode(req: SimpleReq) -> None:
        out = req.output_ids
        for k in range(1, STEPS + 1):
            alloc(cache, req)
            out.append(OUTPUT[k])

    done: list[SimpleReq] = []
    benchmark.pedantic(decode, setup=sglang_rounds(cache, done), rounds=ROUNDS)
    per_step(benchmark)
    if cache is not None:
        cache.cache_finished_req(done.pop())
        cache.check_invariants(running=[])
