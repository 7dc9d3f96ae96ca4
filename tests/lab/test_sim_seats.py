"""The simulator's seats and its replica runner: the shipped engine classes answer
every admission, and a replica prices each step on its clock.

A seat keeps no rule of its own: vLLM's ``KVCacheManager`` applies its whole-sequence
gate, SGLang's ``PrefillAdder`` reads ``PrefixCache``'s free-plus-evictable room, and a
refusal changes nothing.
"""

from __future__ import annotations

from array import array

import pytest

from prefixkv.adapters.lab.sim import CostProfile, SimRequest, SimSettings
from prefixkv.adapters.lab.sim.errors import SimUnservableError
from prefixkv.adapters.lab.sim.replica import Replica
from prefixkv.adapters.lab.sim.seats import SglangSeat, VllmSeat, make_seat
from prefixkv.adapters.sglang.prefill_adder import AddReqResult
from prefixkv.indexes import make_index


def test_vllm_seat_admits_only_what_the_whole_sequence_fits() -> None:
    seat = make_seat("mixed", make_index("hash_chain", 4), 4)  # 4 usable, the null block apart
    assert isinstance(seat, VllmSeat)
    free = seat.kv.manager.allocator.num_free_blocks
    # 20 tokens need 5 blocks: the first 8-token chunk would fit, the sequence does not.
    assert seat.admit("a", list(range(1, 21)), 8, chunked=True, scheduled=False) is None
    assert seat.kv.manager.allocator.num_free_blocks == free and not seat.kv.manager.running()
    assert seat.totals.num_rejected == 1
    assert seat.admit("b", list(range(1, 17)), 8, chunked=True, scheduled=False) == (0, 8)
    assert seat.num_held_blocks() == 2  # the chunk's blocks only


def test_vllm_seat_leaves_a_prompt_past_the_budget_waiting_without_chunking() -> None:
    seat = make_seat("mixed", make_index("hash_chain", 4), 8)
    assert isinstance(seat, VllmSeat)
    assert seat.admit("a", list(range(1, 13)), 8, chunked=False, scheduled=False) is None
    assert not seat.kv.manager.running()


def test_sglang_seat_asks_the_prefill_adder_over_free_plus_evictable_less_the_locked_hit() -> None:
    seat = make_seat("prefill_first", make_index("radix", 4), 4)  # 16 tokens of pages
    assert isinstance(seat, SglangSeat)
    prompt = list(range(1, 13))
    assert seat.admit("a", prompt) == 0
    seat.sampled("a", 99)
    seat.prefilled("a", 12)
    seat.finish("a", 12)  # 3 pages cached, evictable; 1 free
    adder = seat.prefill_adder([], rem_input_tokens=64, rem_chunk_tokens=64)
    assert adder.rem_total_tokens == 16
    # The 12-token hit is locked while it is weighed: 4 uncached + a page >= 16 - 12.
    res = seat.add_one_req(adder, "b", prompt + [7, 7, 7, 7], 0, 0)
    assert res is AddReqResult.NO_TOKEN and not adder.can_run_list
    assert seat.cache.evictable_size() == 12  # the pin was dropped
    # Unrelated: 4 + 7 to decode + a page < 16; admitted, its 15 tokens promised.
    assert seat.add_one_req(adder, "c", [50, 51, 52, 53], 7, 0) is AddReqResult.CONTINUE
    assert [a.rid for a in adder.can_run_list] == ["c"] and adder.rem_total_tokens == 1
    adder.release()
    # SGLang clips max_new_tokens on arrival to what the pool holds beside the prompt.
    assert seat.max_new_tokens(4, 100) == 16 - 4 - 4 - 1
    seat.check_invariants()


def test_make_seat_picks_the_class_of_the_batching() -> None:
    assert isinstance(make_seat("mixed", make_index("radix", 4), 4), VllmSeat)
    assert isinstance(make_seat("prefill_first", make_index("radix", 4), 4), SglangSeat)


def test_a_replica_prices_each_step_and_streams_its_tokens_after_it() -> None:
    profile = CostProfile("t", "m", "d", 0.5, 0.25, 0.0, 0.0, 0.0, stream_token_s=0.125)
    for stream, lag in ((True, 0.125), (False, 0.0)):
        cfg = SimSettings(batching="mixed")
        replica = Replica(
            make_seat("mixed", make_index("radix", 4), 8), cfg, profile, stream=stream
        )
        prompt = array("I", [1, 2, 3, 4])
        replica.add(SimRequest("a", prompt, 2, 0.0), 0.0)
        step = replica.run(replica.plan())  # the prefill: 0.5 + 4 x 0.25 seconds
        assert (step.start, step.end, step.delivered) == (0.0, 1.5, 1.5 + lag)
        step = replica.run(replica.plan())  # the decode step finishes it
        assert step.end == 2.0 and [s.request.id for s in step.finished] == ["a"]
        assert (replica.busy_s, replica.num_steps, replica.has_unfinished()) == (2.0, 2, False)
        replica.seat.check_invariants()


def test_a_replica_refuses_a_request_it_can_never_run_and_changes_nothing() -> None:
    profile = CostProfile("t", "m", "d", 0.5, 0.25, 0.0, 0.0, 0.0)
    for batching in ("mixed", "prefill_first"):
        index = make_index("radix", 4)
        replica = Replica(make_seat(batching, index, 2), SimSettings(batching=batching), profile)
        too_long = SimRequest("big", array("I", range(8)), 2, 0.0)  # 9 tokens: 3 blocks of 4
        with pytest.raises(SimUnservableError, match="'big' needs 3 blocks"):
            replica.add(too_long, 0.0)
        assert not replica.has_unfinished() and replica.num_steps == 0
        replica.add(SimRequest("ok", array("I", range(4)), 2, 0.0), 0.0)  # 5 tokens fit
        assert replica.has_unfinished()
