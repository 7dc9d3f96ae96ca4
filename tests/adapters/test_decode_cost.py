"""A decode step costs O(new tokens), whatever the request's length (no quadratic paths).

Timing would be flaky on a shared machine, so the cost is counted: the Python lines
executed inside prefixkv for the decode steps of one long request, through each
engine class and backend. Doubling the number of steps must (about) double the count; a
path that walks the request's whole history each step (the radix tree's insert from
the root, or a lock move up to the root, over a chain of one-token nodes) quadruples it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import make_index

PACKAGE_DIRS = ("/indexes/", "/storage/", "/adapters/")


def count_lines(fn: Callable[[], object]) -> int:
    """Lines of prefixkv executed while ``fn`` runs."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if not any(d in frame.f_code.co_filename for d in PACKAGE_DIRS):
            return None
        if event == "line":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        fn()
    finally:
        sys.settrace(None)
    return count


def vllm_decode(name: str, bs: int, steps: int) -> int:
    f = KVCacheManager(make_index(name, block_size=bs), num_blocks=8193)
    req = SimpleRequest("r", list(range(1, 65)))
    blocks, hit, _ = f.get_computed_blocks(req)
    f.allocate_slots(req, req.num_tokens - hit, hit, blocks)
    req.num_computed_tokens = req.num_tokens
    req.append_output_token_ids(1)

    def run() -> None:
        for i in range(steps):
            assert f.allocate_slots(req, 1) is not None
            req.num_computed_tokens += 1
            req.append_output_token_ids(2 + i % 1000)

    return count_lines(run)


def sglang_decode(name: str, bs: int, steps: int) -> int:
    cache = PrefixCache.create_simulated(make_index(name, block_size=bs), capacity_tokens=8192)
    req = SimpleReq("r", list(range(1, 65)))
    alloc_for_extend(cache, req)
    req.output_ids.append(1)
    cache.cache_unfinished_req(req)

    def run() -> None:
        # SGLang's decode step touches the pools only; a checkpoint every 16 tokens
        # (as a chunked request's) is where the tree could walk the whole history.
        for i in range(steps):
            assert alloc_for_decode(cache, req)
            req.output_ids.append(2 + i % 1000)
            if i % 16 == 15:
                cache.cache_unfinished_req(req)

    return count_lines(run)


@pytest.mark.parametrize("decode", [vllm_decode, sglang_decode], ids=["vllm", "sglang"])
@pytest.mark.parametrize(("name", "bs"), [("hash_chain", 1), ("hash_chain", 16),
                                          ("radix", 1), ("radix", 16)])  # fmt: skip
def test_decode_steps_cost_linear_in_the_steps(
    decode: Callable[[str, int, int], int], name: str, bs: int
) -> None:
    short = decode(name, bs, 400)
    long = decode(name, bs, 1600)
    assert long <= 4.4 * short, f"{long} lines for 1600 steps, {short} for 400: not linear"
