"""The K-live schedule over each seat: the steps an engine takes its KV events at.

vLLM and the generic manager: a prefill, each decode token and the free of a finished
request are steps. SGLang: a request whose only output token is sampled at prefill
finishes in that step; the step that samples the last token releases the request.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.replay import DRIVERS, Driver, KLive, driver_seat
from prefixkv.adapters.lab.traces import TraceRequest
from prefixkv.indexes import make_index


def steps_per_request(driver: Driver, num_output: int) -> int:
    if driver == "sglang":
        return max(1, num_output)
    return 2 + max(0, num_output - 1)  # prefill, decodes, free


@settings(max_examples=40, deadline=None)
@given(
    outputs=st.lists(st.integers(0, 5), min_size=1, max_size=8),
    concurrency=st.integers(1, 4),
    driver=st.sampled_from(DRIVERS),
)
def test_each_seat_steps_as_its_engine_and_ends_empty(
    outputs: list[int], concurrency: int, driver: Driver
) -> None:
    requests = [
        TraceRequest(f"r{i}", [1, 2, 3, 4, 5 + i], list(range(100, 100 + n)))
        for i, n in enumerate(outputs)
    ]
    index = make_index("hash_chain" if driver == "vllm" else "radix", 2)
    seat = driver_seat(driver, index, 64)
    steps: list[int] = []
    result = KLive(seat, concurrency, on_step=lambda: steps.append(1)).run(requests)
    assert len(steps) == sum(steps_per_request(driver, n) for n in outputs)
    assert result.num_requests == len(outputs)
    assert result.total_prompt_tokens == 5 * len(outputs)
    # every request released: nothing held, the cache whole
    free, total = seat.pool_size()
    assert free + index.stats().num_evictable_blocks == total - (driver == "vllm")
    index.check_invariants()
