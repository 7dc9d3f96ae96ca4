"""The simulator's seats: the shipped engine classes answer every admission.

A seat keeps no rule of its own: vLLM's ``KVCacheManager`` applies its whole-sequence
gate, SGLang's ``PrefixCache`` its free-plus-evictable room, and a refusal changes
nothing.
"""

from __future__ import annotations

from prefixkv.adapters.lab.sim.seats import SglangSeat, VllmSeat, make_seat
from prefixkv.indexes import make_index


def test_vllm_seat_admits_only_what_the_whole_sequence_fits() -> None:
    seat = VllmSeat(make_index("hash_chain", 4), 4)  # 4 usable blocks, the null block apart
    free = seat.kv.manager.allocator.num_free_blocks
    # 20 tokens need 5 blocks: the first 8-token chunk would fit, the sequence does not.
    assert seat.admit("a", list(range(1, 21)), 8, chunked=True, scheduled=False) is None
    assert seat.kv.manager.allocator.num_free_blocks == free and not seat.kv.manager.running()
    assert seat.totals.num_rejected == 1
    assert seat.admit("b", list(range(1, 17)), 8, chunked=True, scheduled=False) == (0, 8)
    assert seat.num_held_blocks() == 2  # the chunk's blocks only


def test_vllm_seat_leaves_a_prompt_past_the_budget_waiting_without_chunking() -> None:
    seat = VllmSeat(make_index("hash_chain", 4), 8)
    assert seat.admit("a", list(range(1, 13)), 8, chunked=False, scheduled=False) is None
    assert not seat.kv.manager.running()


def test_sglang_seat_room_is_free_plus_evictable_less_the_locked_hit() -> None:
    seat = SglangSeat(make_index("radix", 4), 4)  # 16 tokens of pages
    prompt = list(range(1, 13))
    assert seat.admit("a", prompt) == 0
    seat.sampled("a", 99)
    seat.prefilled("a", 12)
    seat.finish("a", 12)  # 3 pages cached, evictable; 1 free
    uncached, room = seat.room(prompt + [7, 7, 7, 7])
    assert (uncached, room) == (16 - 12, 16 - 12)  # the hit's own pages are locked
    uncached, room = seat.room([50, 51, 52, 53])
    assert (uncached, room) == (4, 16)
    seat.check_invariants()


def test_make_seat_picks_the_class_of_the_batching() -> None:
    assert isinstance(make_seat("mixed", make_index("radix", 4), 4), VllmSeat)
    assert isinstance(make_seat("prefill_first", make_index("radix", 4), 4), SglangSeat)
