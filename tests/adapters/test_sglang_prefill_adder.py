"""SGLang's ``PrefillAdder`` arithmetic over ``PrefixCache`` (``adapters.sglang.prefill_adder``).

Each test pins one line of SGLang 0.5.23's ``schedule_policy.py`` / ``prefill_budget.py``:
the strict ``<`` of ``check_prefill``, the page a request adds, the page rounding of the
promised extend, the whole clipped decode promised at admission, the running requests'
remaining decode times the ratio, the page-aligned chunk cut, the chunked request's
decode promised with its last chunk, the first request past ``max_prefill_tokens``, the
hit locked while weighed. ``tests/engines/sglang`` checks the same admissions against
SGLang's own class.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.errors import EngineSettingsError
from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.prefill_adder import (
    CLIP_MAX_NEW_TOKENS,
    AddReqResult,
    PrefillAdder,
    RunningReq,
    init_req_max_new_tokens,
)
from prefixkv.adapters.sglang.simulated import alloc_for_extend

CONTINUE, NO_TOKEN, OTHER = AddReqResult.CONTINUE, AddReqResult.NO_TOKEN, AddReqResult.OTHER


def _cache(capacity: int, page_size: int = 1) -> PrefixCache:
    return PrefixCache.create_simulated("radix", capacity, page_size)


def _adder(
    cache: PrefixCache,
    running: tuple[RunningReq, ...] = (),
    *,
    ratio: float = 1.0,
    rem_input: int = 1 << 20,
    rem_chunk: int | None = None,
) -> PrefillAdder:
    return PrefillAdder(
        cache,
        running,
        new_token_ratio=ratio,
        rem_input_tokens=rem_input,
        rem_chunk_tokens=rem_chunk,
    )


def _add(adder: PrefillAdder, rid: str, fill_len: int, max_new: int, out: int = 0) -> AddReqResult:
    return adder.add_one_req(rid, fill_len, 0, adder.cache.root_node, max_new, out)


def test_a_request_fits_only_strictly_below_what_is_left() -> None:
    # check_prefill: total_tokens < remaining_total, total = extend + decode + a page.
    assert _add(_adder(_cache(100)), "a", 60, 39) is NO_TOKEN  # 60 + 39 + 1 == 100
    adder = _adder(_cache(100))
    assert _add(adder, "a", 60, 38) is CONTINUE
    assert [a.rid for a in adder.can_run_list] == ["a"]


def test_admission_promises_the_page_rounded_extend_a_page_and_the_whole_clipped_decode() -> None:
    adder = _adder(_cache(1 << 14, page_size=16))
    # A resumed request: 2 of its 10 tokens decoded, yet all 10 are promised (SGLang
    # reserves min(max_new_tokens, CLIP), not what is left of it).
    assert _add(adder, "a", 33, 10, out=2) is CONTINUE
    assert adder.total_offset == 48 + 16 + 10
    assert adder.current_offset == 48 + 16
    assert adder.rem_input_tokens == (1 << 20) - 48  # the compute budget: paged, too
    assert _add(adder, "b", 1, 10**6) is CONTINUE
    assert adder.total_offset == 74 + 16 + 16 + CLIP_MAX_NEW_TOKENS


def test_running_requests_reserve_their_remaining_clipped_decode_times_the_ratio() -> None:
    running = (
        RunningReq(100, 40),  # ignore_eos: 60, whole
        RunningReq(100, 40, ignore_eos=False),  # 60 * 0.5
        RunningReq(10**6, 0),  # clipped
    )
    adder = _adder(_cache(1 << 16), running, ratio=0.5)
    assert adder.total_offset == 60 + 30 + CLIP_MAX_NEW_TOKENS
    assert adder.rem_total_tokens == (1 << 16) - adder.total_offset
    assert adder.cur_rem_tokens == 1 << 16  # decode is no promise for this step


def test_a_prompt_past_the_chunk_budget_is_cut_at_a_page_boundary_and_promises_no_decode() -> None:
    cache = _cache(1 << 12, page_size=4)
    prompt = list(range(1, 13))
    warm = SimpleReq("w", prompt)
    assert alloc_for_extend(cache, warm) == 0
    cache.cache_finished_req(warm)  # 8 tokens cached (the match stops short of the last)
    adder = _adder(cache, rem_chunk=10)
    m = cache.match_prefix(prompt + list(range(50, 70)), max_prefix_len=31)
    assert m.prefix_len == 12
    res = adder.add_one_req("a", 32, m.prefix_len, m.last_node, 100)
    (adm,) = adder.can_run_list
    # 10 // 4 * 4 = 8 tokens, ending at 20 (a page boundary): 8 extended, no decode.
    assert (adm.prefix_len, adm.extend_len, adm.is_chunked) == (12, 8, True)
    assert adder.new_chunked_req == adm
    assert adder.total_offset == 8 + 4
    assert adder.rem_chunk_tokens == 2
    assert res is CONTINUE
    adder.release()
    # The cut ends on a page boundary whatever the prefix (6 + 8 -> 12: 6 tokens).
    adder = _adder(cache, rem_chunk=10)
    adder.add_one_req("b", 40, 6, cache.root_node, 100)
    assert adder.can_run_list[0].extend_len == 6


def test_a_chunk_cut_to_nothing_is_refused() -> None:
    adder = _adder(_cache(1 << 12, page_size=4), rem_chunk=3)  # under a page
    assert _add(adder, "a", 20, 1) is OTHER
    assert not adder.can_run_list and adder.total_offset == 0


def test_the_chunked_request_takes_what_the_pool_allows_its_decode_with_its_last_chunk() -> None:
    adder = _adder(_cache(100), (RunningReq(80, 0),), rem_chunk=64)
    adm = adder.add_chunked_req("c", 200, 64, 30)  # 20 tokens left unpromised
    assert (adm.extend_len, adm.is_chunked) == (20, True)
    assert adder.total_offset == 80 + 21  # no decode while chunked
    adder = _adder(_cache(100), rem_chunk=64)
    adm = adder.add_chunked_req("c", 100, 64, 30)  # the last 36 tokens
    assert (adm.extend_len, adm.is_chunked) == (36, False)
    assert adder.total_offset == 36 + 1 + 30
    # Nothing left: the chunk budget still moves it (it must progress to release).
    adder = _adder(_cache(100), (RunningReq(200, 0),), rem_chunk=64)
    assert adder.add_chunked_req("c", 200, 64, 30).extend_len == 64


def test_without_chunking_only_the_first_request_may_pass_max_prefill_tokens() -> None:
    adder = _adder(_cache(1 << 12), rem_input=16)
    assert _add(adder, "a", 40, 1) is OTHER  # admitted; the input budget is spent
    assert [a.rid for a in adder.can_run_list] == ["a"]
    adder = _adder(_cache(1 << 12), rem_input=16)
    assert _add(adder, "a", 8, 1) is CONTINUE
    assert _add(adder, "b", 8, 1) is OTHER  # 8 >= 16 - 8: the >= of SGLang
    assert [a.rid for a in adder.can_run_list] == ["a"]


def test_the_hit_is_locked_while_weighed_and_while_admitted() -> None:
    cache = _cache(16)
    prompt = list(range(1, 13))
    warm = SimpleReq("w", prompt)
    assert alloc_for_extend(cache, warm) == 0
    cache.cache_finished_req(warm)
    assert cache.evictable_size() == 12 and cache.available_size() == 4
    m = cache.match_prefix(prompt + [7, 7], max_prefix_len=13)
    adder = _adder(cache)
    # Unlocked, 2 + 1 + 1 < 16 would pass; the locked hit leaves 4.
    assert adder.add_one_req("a", 14, m.prefix_len, m.last_node, 1) is NO_TOKEN
    assert cache.evictable_size() == 12  # the pin is dropped on refusal
    assert adder.add_one_req("a", 14, m.prefix_len, m.last_node, 0) is CONTINUE
    assert cache.evictable_size() == 0  # admitted: pinned until release
    adder.release()
    assert cache.evictable_size() == 12
    assert all(a.lock is None for a in adder.can_run_list)
    cache.check_invariants()


def test_budget_state_names_what_ran_out() -> None:
    adder = _adder(_cache(64), rem_chunk=8)
    assert adder.budget_state() is CONTINUE
    adder.rem_chunk_tokens = 0
    assert adder.budget_state() is OTHER
    adder = _adder(_cache(64), (RunningReq(64, 0),))
    assert adder.budget_state() is NO_TOKEN


def test_arrival_clip_leaves_a_request_room_alone_on_the_pool() -> None:
    # max_req_len - input - 1, then what the pool holds beside the paged prompt and a page.
    assert init_req_max_new_tokens(10, 1000, page_size=1, max_total_num_tokens=100) == 88
    assert init_req_max_new_tokens(10, 1000, page_size=16, max_total_num_tokens=100) == 67
    assert init_req_max_new_tokens(10, 5, page_size=16, max_total_num_tokens=100) == 5
    assert init_req_max_new_tokens(99, 5, page_size=16, max_total_num_tokens=100) == 0


@settings(max_examples=60, deadline=None)
@given(
    page_size=st.sampled_from([1, 4, 16]),
    pages=st.integers(4, 64),
    prompt_len=st.integers(1, 1024),
    max_new=st.integers(0, 2048),
)
def test_a_clipped_request_alone_on_an_empty_pool_is_always_admitted(
    page_size: int, pages: int, prompt_len: int, max_new: int
) -> None:
    capacity = pages * page_size
    if prompt_len + 1 >= capacity:  # SGLang refuses such a prompt on arrival
        return
    clipped = init_req_max_new_tokens(
        prompt_len, max_new, page_size=page_size, max_total_num_tokens=capacity
    )
    adder = _adder(_cache(capacity, page_size))
    assert _add(adder, "a", prompt_len, clipped) is not NO_TOKEN
    assert len(adder.can_run_list) == 1


@settings(max_examples=40, deadline=None)
@given(
    page_size=st.sampled_from([1, 4]),
    lens=st.lists(st.tuples(st.integers(1, 40), st.integers(0, 40)), min_size=1, max_size=8),
    cached=st.integers(0, 6),
)
def test_what_a_pass_admits_can_be_allocated(
    page_size: int, lens: list[tuple[int, int]], cached: int
) -> None:
    # The promise is what the allocation will take: allocating every admission after
    # the pass (alloc_for_extend, evicting) never falls short, whatever is cached.
    cache = _cache(128 * page_size // 4 * 4, page_size)
    for i in range(cached):
        w = SimpleReq(f"w{i}", [i + 1] * (10 + 3 * i))
        if alloc_for_extend(cache, w) is not None:
            cache.cache_finished_req(w)
    adder = _adder(cache)
    reqs = []
    for i, (n, max_new) in enumerate(lens):
        req = SimpleReq(f"r{i}", [(i % 3) + 1] * n)
        m = cache.match_prefix(req.origin_input_ids, max_prefix_len=n - 1)
        res = adder.add_one_req(req.rid, n, m.prefix_len, m.last_node, max_new)
        if len(adder.can_run_list) > len(reqs):
            reqs.append(req)
        if res is not CONTINUE:
            break
    for req, adm in zip(reqs, adder.can_run_list, strict=True):
        assert alloc_for_extend(cache, req) == adm.prefix_len
    adder.release()
    cache.check_invariants(reqs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"new_token_ratio": 1.5}, "new_token_ratio"),
        ({"new_token_ratio": "1"}, "new_token_ratio"),
        ({"rem_input_tokens": 0}, "rem_input_tokens"),
        ({"rem_input_tokens": True}, "rem_input_tokens"),
        ({"rem_chunk_tokens": -1}, "rem_chunk_tokens"),
    ],
)
def test_bad_settings_get_a_named_error(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "new_token_ratio": 1.0,
        "rem_input_tokens": 16,
        "rem_chunk_tokens": 8,
        **kwargs,
    }
    with pytest.raises(EngineSettingsError, match=match):
        PrefillAdder(_cache(16), (), **args)  # type: ignore[arg-type]


def test_a_chunked_request_needs_a_chunk_budget() -> None:
    with pytest.raises(EngineSettingsError, match="chunked"):
        _adder(_cache(16)).add_chunked_req("c", 10, 4, 1)
