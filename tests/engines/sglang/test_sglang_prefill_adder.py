"""prefixkv's ``PrefillAdder`` admits exactly what SGLang 0.5.23's own admits.

Both adders weigh the same queue over the same cache (prefixkv's ``PrefixCache`` on
SGLang's real CPU pools, warmed by SGLang's scheduler-side helpers): a running batch
whose remaining decode is reserved, an optional unfinished chunked request, then
waiting requests (some resumed after a retraction, with output) in order, as
``Scheduler._get_new_batch_prefill_raw`` drives SGLang's class. The admissions (id,
prefix, extend, chunked), each ``AddReqResult`` and the budgets left must be equal,
over seeded random queues (the engine environment has no hypothesis).
"""

from __future__ import annotations

import random
from array import array
from types import SimpleNamespace
from typing import Any

import pytest
import sglang_oracle  # the oracle installs the torchvision stand-in
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.schedule_policy import AddReqResult as SglAddReqResult
from sglang.srt.managers.schedule_policy import PrefillAdder as SglPrefillAdder
from sglang.srt.sampling.sampling_params import SamplingParams

from prefixkv.adapters.sglang.plugin import PrefixKVPrefixCache
from prefixkv.adapters.sglang.prefill_adder import AddReqResult, PrefillAdder, RunningReq
from prefixkv.indexes import make_index

CONTEXT = 512


def _cache(page_size: int, capacity: int, rng: random.Random) -> tuple[PrefixKVPrefixCache, Any]:
    params = sglang_oracle.build_pools(page_size, capacity, 8, CONTEXT)
    cache = PrefixKVPrefixCache(params, make_index("radix", block_size=page_size))
    warm = [
        {
            "id": f"w{i}",
            "tokens": [1 + i % 3] * rng.randrange(4, min(60, capacity // 2)),
            "output": [9] * 3,
        }
        for i in range(rng.randrange(0, 6))
    ]
    sglang_oracle.SGLangReplay(cache, params).run(warm, 1)
    return cache, params.token_to_kv_pool_allocator


def _req(rid: str, tokens: list[int], max_new: int, num_output: int) -> Any:
    params = SamplingParams(temperature=0, max_new_tokens=max_new, ignore_eos=True)
    params.normalize(None)
    req = Req(
        rid=rid, origin_input_text="", origin_input_ids=array("q", tokens), sampling_params=params
    )
    req.output_ids.extend([5] * num_output)  # resumed after a retraction
    return req


def _sglang(
    cache: Any,
    allocator: Any,
    case: dict[str, Any],
) -> tuple[list[tuple[str, int, int, bool]], list[str], tuple[float, int, int | None]]:
    running = SimpleNamespace(
        reqs=[
            SimpleNamespace(
                sampling_params=SimpleNamespace(max_new_tokens=m, ignore_eos=e),
                output_ids=[0] * o,
            )
            for m, o, e in case["running"]
        ]
    )
    adder = SglPrefillAdder(
        cache.page_size,
        cache,
        allocator,
        running,
        case["ratio"],
        case["rem_input"],
        case["rem_chunk"],
    )
    got, results = [], []
    chunked = case["chunked"]
    if chunked is not None:
        rid, tokens, max_new, prefix = chunked
        req = _req(rid, tokens, max_new, 0)
        req.init_next_round_input()
        req.prefix_len = prefix
        left = adder.add_chunked_req(req)
        got.append((rid, prefix, req.extend_len, left is not None))
    for rid, tokens, max_new, out in case["waiting"]:
        if adder.budget_state() == SglAddReqResult.OTHER:
            break
        req = _req(rid, tokens, max_new, out)
        req.init_next_round_input(cache)
        res = adder.add_one_req(
            req, has_chunked_req=chunked is not None, truncation_align_size=None
        )
        if adder.can_run_list and adder.can_run_list[-1] is req:
            got.append((rid, req.prefix_len, req.extend_len, adder.new_chunked_req is req))
            cache.unlock(req.lock)
        results.append(res.name)
        if res != SglAddReqResult.CONTINUE:
            break
    return got, results, (adder.rem_total_tokens, adder.rem_input_tokens, adder.rem_chunk_tokens)


def _prefixkv(
    cache: Any, case: dict[str, Any]
) -> tuple[list[tuple[str, int, int, bool]], list[str], tuple[float, int, int | None]]:
    adder = PrefillAdder(
        cache,
        [RunningReq(m, o, e) for m, o, e in case["running"]],
        new_token_ratio=case["ratio"],
        rem_input_tokens=case["rem_input"],
        rem_chunk_tokens=case["rem_chunk"],
    )
    results = []
    if case["chunked"] is not None:
        rid, tokens, max_new, prefix = case["chunked"]
        adder.add_chunked_req(rid, len(tokens), prefix, max_new)
    for rid, tokens, max_new, out in case["waiting"]:
        if adder.budget_state() is AddReqResult.OTHER:
            break
        req = _req(rid, tokens, max_new, out)
        req.init_next_round_input(cache)  # the match, as SGLang makes it
        fill = len(req.full_untruncated_fill_ids)
        res = adder.add_one_req(rid, fill, req.prefix_len, req.last_node, max_new, out)
        results.append(res.name)
        if res is not AddReqResult.CONTINUE:
            break
    got = [(a.rid, a.prefix_len, a.extend_len, a.is_chunked) for a in adder.can_run_list]
    adder.release()
    return got, results, (adder.rem_total_tokens, adder.rem_input_tokens, adder.rem_chunk_tokens)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("seed", range(60))
def test_prefixkv_admits_what_sglangs_prefill_adder_admits(seed: int, page_size: int) -> None:
    rng = random.Random(seed)
    capacity = rng.randrange(8, 40) * page_size * 4
    cache, allocator = _cache(page_size, capacity, rng)
    rem_chunk = rng.choice([None, rng.randrange(1, 200)])
    fresh = rng.random() < 0.3  # no hits: the input budget can be hit exactly
    waiting = []
    for i in range(rng.randrange(2, 8)):
        tokens = [100 + i if fresh else 1 + rng.randrange(3)] * rng.randrange(2, 150)
        out = rng.choice([0, 0, rng.randrange(1, 20)])
        waiting.append((f"r{i}", tokens, rng.randrange(out, out + 300), out))
    rem_input = rng.randrange(1, 400)
    if fresh:  # the second request's paged extend equals what the first leaves
        paged = [-(-(len(w[1]) + w[3]) // page_size) * page_size for w in waiting[:2]]
        rem_input = sum(paged) + rng.choice([0, 0, 1])
    chunked = None
    if rem_chunk is not None and rng.random() < 0.4:
        tokens = [7] * rng.randrange(2, 300)
        chunked = ("c", tokens, rng.randrange(0, 5000), rng.randrange(0, len(tokens) - 1))
    case = {
        "running": [
            (m, rng.randrange(0, m + 1), rng.random() < 0.5)
            for m in (rng.randrange(1, 6000) for _ in range(rng.randrange(0, 4)))
        ],
        "ratio": rng.choice([1.0, 0.7, rng.random()]),
        "rem_input": rem_input,
        "rem_chunk": rem_chunk,
        "chunked": chunked,
        "waiting": waiting,
    }
    expected = _sglang(cache, allocator, case)
    assert cache.protected_size() == 0
    assert _prefixkv(cache, case) == expected
    assert cache.protected_size() == 0
