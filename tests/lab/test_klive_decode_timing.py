"""The vLLM seat's decode loop books its time whether or not a step hook runs.

The loop is timed once per request; ``allocate_decode`` holds the decode steps' time
and not a hook's, the hits and the cache are the same, and a hook is called once per
decode step.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.replay import KLive, driver_seat
from prefixkv.adapters.lab.traces import TraceRequest
from prefixkv.indexes import make_index


@settings(max_examples=30, deadline=None)
@given(
    outputs=st.lists(st.integers(0, 40), min_size=1, max_size=6),
    concurrency=st.integers(1, 3),
)
def test_decode_time_is_booked_with_and_without_a_step_hook(
    outputs: list[int], concurrency: int
) -> None:
    requests = [
        TraceRequest(f"r{i}", [1, 2, 3, 4, 5, 6, 7 + i], list(range(100, 100 + n)))
        for i, n in enumerate(outputs)
    ]
    results = []
    steps: list[int] = []
    for hook in (None, lambda: steps.append(1)):
        seat = driver_seat("vllm", make_index("hash_chain", 4, seed=0), 64)
        results.append(KLive(seat, concurrency, on_step=hook).run(requests))
    quiet, hooked = results
    decodes = sum(max(0, n - 1) for n in outputs)
    for result in results:
        assert "allocate_decode" in result.seconds_by_call  # booked per request, 0 steps too
        assert all(s >= 0.0 for s in result.seconds_by_call.values())
    assert quiet.hits == hooked.hits
    assert quiet.evicted_blocks == hooked.evicted_blocks
    assert quiet.peak_cached_blocks == hooked.peak_cached_blocks
    assert len(steps) == len(outputs) * 2 + decodes  # prefill, decodes, free


def test_a_step_hooks_own_time_is_not_booked_to_the_engine_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A clock that moves only inside the hook: every engine call books exactly 0 s,
    # the decode loop's too, though the hook runs inside it.
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])

    def hook() -> None:
        clock[0] += 100.0

    request = TraceRequest("r0", [1, 2, 3, 4, 5, 6, 7, 8], list(range(100, 110)))
    for driver, index in (("vllm", "hash_chain"), ("sglang", "radix"), ("manager", "radix")):
        seat = driver_seat(driver, make_index(index, 4), 64)  # type: ignore[arg-type]
        result = KLive(seat, 1, on_step=hook).run([request])
        assert result.seconds_by_call and set(result.seconds_by_call.values()) == {0.0}, driver
        assert result.wall_seconds > 0  # the hooks' time is the replay's


@pytest.mark.parametrize(("driver", "index"), [("vllm", "hash_chain"), ("sglang", "radix")])
def test_an_interrupt_inside_a_decode_loop_leaves_no_negative_engine_seconds(
    monkeypatch: pytest.MonkeyPatch, driver: str, index: str
) -> None:
    # The hook's time is taken back off the decode call while the loop runs; a Ctrl-C in
    # the hook must not leave that take-back without the call's own time beside it.
    clock = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    calls = [0]

    def hook() -> None:
        clock[0] += 1.0
        calls[0] += 1
        if calls[0] == 4:  # inside the first request's decode loop
            raise KeyboardInterrupt

    requests = [
        TraceRequest(f"r{i}", [1, 2, 3, 4, 5, 6, 7, 8 + i], list(range(100, 110))) for i in range(3)
    ]
    seat = driver_seat(driver, make_index(index, 4), 64)  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt) as info:
        KLive(seat, 1, on_step=hook).run(requests)
    partial = getattr(info.value, "result", None)
    assert partial is not None
    assert partial.seconds_by_call and min(partial.seconds_by_call.values()) >= 0.0
