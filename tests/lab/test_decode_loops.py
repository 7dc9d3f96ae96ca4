"""The seats' decode loops without a step hook (``decode_loops``, compiled in the
compiled build) step exactly as the hooked loops do, one engine call per step.

Without a hook the vLLM and SGLang seats hand a request's remaining output to
``vllm_decode`` / ``sglang_decode``; with one they step in Python and call the hook
after each step. Both must leave the engine class in the same state: the same hits,
evictions and peak, and, where a decode step does not fit, the same failure at the same
request.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.replay import Driver, KLive, ReplayError, ReplayResult, driver_seat
from prefixkv.adapters.lab.traces import TraceRequest
from prefixkv.indexes import make_index
from prefixkv.indexes.base import PrefixIndex

INDEXES: dict[Driver, tuple[str, int]] = {"vllm": ("hash_chain", 4), "sglang": ("radix", 2)}


def _index(driver: Driver) -> PrefixIndex:
    name, size = INDEXES[driver]
    return make_index(name, size, **({"seed": 0} if name == "hash_chain" else {}))


def _run(
    driver: Driver, requests: list[TraceRequest], num_blocks: int, concurrency: int, hooked: bool
) -> tuple[ReplayResult | None, str | None, int]:
    seat = driver_seat(driver, _index(driver), num_blocks)
    steps: list[int] = []
    hook = (lambda: steps.append(1)) if hooked else None
    try:
        result = KLive(seat, concurrency, on_step=hook).run(requests)
    except ReplayError as exc:
        return None, str(exc), seat.index.stats().num_cached_blocks
    return result, None, seat.index.stats().num_cached_blocks


@settings(max_examples=40, deadline=None)
@given(
    driver=st.sampled_from(sorted(INDEXES)),
    shapes=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 12), st.integers(0, 30), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    concurrency=st.integers(1, 3),
    num_blocks=st.integers(4, 40),
)
def test_the_loop_without_a_hook_steps_as_the_hooked_one(
    driver: Driver, shapes: list[tuple[int, int, int, bool]], concurrency: int, num_blocks: int
) -> None:
    # Prompts share a prefix by family, or continue the previous request's prompt and
    # output (a next turn: its hit reaches into what the decode steps cached); small
    # pools make decode steps evict or not fit.
    requests: list[TraceRequest] = []
    for i, (family, tail, out, turn) in enumerate(shapes):
        head = [family + 1] * 6
        if turn and requests:
            head = [*requests[-1].tokens, *requests[-1].output]
        output = [100 + 7 * i + k for k in range(out)]
        requests.append(TraceRequest(f"r{i}", head + list(range(50, 50 + tail)), output))
    quiet = _run(driver, requests, num_blocks, concurrency, hooked=False)
    hooked = _run(driver, requests, num_blocks, concurrency, hooked=True)
    assert quiet[1] == hooked[1]  # the same failure (message), or none
    assert quiet[2] == hooked[2]
    if quiet[0] is not None and hooked[0] is not None:
        assert quiet[0].hits == hooked[0].hits
        assert quiet[0].evicted_blocks == hooked[0].evicted_blocks
        assert quiet[0].peak_cached_blocks == hooked[0].peak_cached_blocks
        decode = "allocate_decode" if driver == "vllm" else "alloc_for_decode"
        assert decode in quiet[0].seconds_by_call or all(o <= 1 for _, _, o, _ in shapes)


@pytest.mark.parametrize("driver", sorted(INDEXES))
def test_a_decode_step_that_does_not_fit_stops_the_loop(driver: Driver) -> None:
    # one request alone in a pool just big enough for its prompt: its decode runs out
    seat = driver_seat(driver, _index(driver), 3)
    request = TraceRequest("r0", list(range(1, 7)), list(range(100, 140)))
    with pytest.raises(ReplayError, match="decode step of request 'r0'"):
        KLive(seat, 1).run([request])


@pytest.mark.parametrize("driver", sorted(INDEXES))
def test_a_next_turn_hits_what_the_decode_steps_cached(driver: Driver) -> None:
    first = TraceRequest("r0", list(range(1, 9)), list(range(100, 120)))
    turn = TraceRequest("r1", [*first.tokens, *first.output, 7, 7], [5, 6])
    quiet, _, _ = _run(driver, [first, turn], 64, 1, hooked=False)
    hooked, _, _ = _run(driver, [first, turn], 64, 1, hooked=True)
    assert quiet is not None and hooked is not None
    assert quiet.hits == hooked.hits
    # the second prompt's hit reaches past the first prompt, into its decoded output
    assert quiet.hit_tokens[1] > len(first.tokens) + 8
