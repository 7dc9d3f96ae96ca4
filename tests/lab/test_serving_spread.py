"""The serving path's spread: quantile tables, the per-request draw, the simulator's
use of the idle and busy tables, and ``calibrate --server`` measuring both."""

from __future__ import annotations

import dataclasses
import math
import statistics
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim import CostProfile, ProfileError, SimRequest, simulate
from prefixkv.adapters.lab.sim.serving_spread import (
    QUANTILES,
    draw_fraction,
    quantile_table,
    serving_delay,
    spread_at,
)
from prefixkv.indexes import make_index

BASE = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7)


def flat(seconds: float) -> tuple[float, ...]:
    return (seconds,) * len(QUANTILES)


# ------------------------------------------------------------------ tables and draws


def test_a_quantile_table_reads_back_its_samples() -> None:
    table = quantile_table([0.004, 0.002, 0.003])  # out of order
    assert len(table) == len(QUANTILES)
    assert table[0] == 0.002 and table[10] == pytest.approx(0.003) and table[-1] == 0.004
    assert spread_at(table, 0.25) == pytest.approx(0.0025)
    assert quantile_table([]) == ()
    assert quantile_table([-1.0, 0.5])[0] == 0.0  # a time is never negative
    with pytest.raises(ValueError, match="quantiles"):
        spread_at((0.1, 0.2), 0.5)


@given(
    values=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=50),
    u=st.floats(0.0, 1.0),
    v=st.floats(0.0, 1.0),
)
def test_a_draw_lies_within_the_samples_and_grows_with_its_fraction(
    values: list[float], u: float, v: float
) -> None:
    table = quantile_table(values)
    assert list(table) == sorted(table)
    a, b = spread_at(table, min(u, v)), spread_at(table, max(u, v))
    assert min(values) - 1e-12 <= a <= b <= max(values) + 1e-12


def test_the_draw_is_fixed_by_the_request_id_and_uniform_over_ids() -> None:
    assert draw_fraction("chat-4-0") == draw_fraction("chat-4-0")
    fractions = [draw_fraction(f"chat-{i}-{j}") for i in range(100) for j in range(20)]
    assert all(0.0 <= f < 1.0 for f in fractions)
    assert statistics.fmean(fractions) == pytest.approx(0.5, abs=0.03)
    assert sum(f < 0.9 for f in fractions) / len(fractions) == pytest.approx(0.9, abs=0.03)


def test_a_request_draws_from_its_engines_state_table_or_falls_back() -> None:
    plain = serving_delay(0.005)
    assert plain("r", True, True) == plain("r", False, False) == 0.005
    idle_only = serving_delay(0.005, flat(0.002))
    # busy falls back to idle, and so does a decoding request sent to an idle engine
    assert idle_only("r", False, True) == idle_only("r", True, False) == 0.002
    both = serving_delay(0.005, flat(0.002), flat(0.030))
    assert both("r", False, False) == 0.002 and both("r", True, True) == 0.030
    # the decoding table: only a request that goes on decoding, sent to an idle engine
    three = serving_delay(0.005, flat(0.002), flat(0.030), flat(0.004))
    assert three("r", False, True) == 0.004
    assert three("r", False, False) == 0.002 and three("r", True, True) == 0.030


def test_a_profile_keeps_its_spread_tables_and_refuses_bad_ones() -> None:
    p = dataclasses.replace(BASE, request_spread_s=list(flat(0.003)))
    assert p.request_spread_s == flat(0.003) and p.busy_request_spread_s == ()
    again = CostProfile.from_dict(p.to_dict())
    assert again.request_spread_s == p.request_spread_s
    data = p.to_dict()
    del data["request_spread_s"], data["busy_request_spread_s"]
    assert CostProfile.from_dict(data).request_spread_s == ()  # older profiles: none
    falling = tuple(reversed(quantile_table([0.001, 0.002])))
    for bad in ((0.1,), falling, (*flat(0.001)[:-1], math.nan), flat(-1.0), "0.1",
                (True,) * len(QUANTILES)):  # fmt: skip
        with pytest.raises(ProfileError, match="busy_request_spread_s"):
            dataclasses.replace(BASE, busy_request_spread_s=bad)


# ------------------------------------------------------------------ the simulator


def _reqs(arrivals: list[float], out: int = 4) -> list[SimRequest]:
    return [
        SimRequest(f"r{i}", array("I", range(1 + 100 * i, 41 + 100 * i)), out, t)
        for i, t in enumerate(arrivals)
    ]


def _run(profile: CostProfile, reqs: list[SimRequest]) -> Any:
    return simulate(reqs, lambda: make_index("hash_chain", 16), 1 << 14, profile=profile)


def test_a_request_sent_to_a_busy_engine_draws_from_the_busy_table() -> None:
    spread = dataclasses.replace(
        BASE, request_s=0.5, request_spread_s=flat(0.001), busy_request_spread_s=flat(0.030)
    )
    plain = dataclasses.replace(BASE, request_s=0.001)
    first = _run(plain, _reqs([0.0], out=200)).requests[0]  # decodes for ~0.5 s
    reqs = _reqs([0.0, first.first_token_s + 0.1, 5.0])  # idle, busy, idle again
    res = _run(spread, [*_reqs([0.0], out=200), *reqs[1:]])
    lone, busy, later = res.requests
    assert lone.ttft_s == pytest.approx(first.ttft_s)  # 1 ms outside, as request_s was
    assert busy.first_scheduled_s >= busy.arrival_s + 0.030  # reached the engine 30 ms on
    assert later.ttft_s == pytest.approx(first.ttft_s)  # idle again: the idle table
    # without tables every request takes request_s (0.5 s) outside
    assert _run(dataclasses.replace(spread, request_spread_s=(), busy_request_spread_s=()),
                reqs[:1]).requests[0].first_scheduled_s == pytest.approx(0.5)  # fmt: skip


@given(
    low=st.floats(0.0, 0.01),
    width=st.floats(0.0, 0.05),
    gaps=st.lists(st.floats(0.0, 0.1), min_size=1, max_size=6),
)
def test_each_request_reaches_the_engine_within_its_tables_bounds(
    low: float, width: float, gaps: list[float]
) -> None:
    idle = quantile_table([low, low + width / 2, low + width])
    busy = quantile_table([2 * low, 2 * (low + width)])
    profile = dataclasses.replace(BASE, request_spread_s=idle, busy_request_spread_s=busy)
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    for m in _run(profile, _reqs(arrivals)).requests:
        waited = m.first_scheduled_s - m.arrival_s
        assert waited >= min(idle[0], busy[0]) - 1e-12
        assert m.ttft_s >= waited + BASE.step_s - 1e-12


# ------------------------------------------------------------------ calibrate --server


def test_calibrate_server_keeps_the_idle_and_busy_spread_of_the_serving_path() -> None:
    from test_serving_path import MetricsServer, calibrated_on_a_mock

    from prefixkv.adapters.lab.sim.server_calibration import refit_server_profile
    from prefixkv.adapters.lab.sim.serving_path import BUSY_PER_REPEAT, HopSamples

    p = calibrated_on_a_mock(seed=7, serving_repeats=3)
    kept = HopSamples.from_json(p.fit["serving_path"]["samples"])
    assert len(kept.busy) == BUSY_PER_REPEAT * 3
    # outside the engine core, less the first token's streaming (priced apart)
    stream = p.stream_token_s
    outside = [
        s.client_ttft_s - s.engine_ttft_s - stream for s in kept.busy if s.engine_ttft_s is not None
    ]
    assert outside and p.fit["serving_path"]["busy_samples_kept"] == len(outside)
    assert p.busy_request_spread_s == pytest.approx(quantile_table(outside))
    lone = kept.idle  # sent after a pause (the short ones only where none were)
    assert p.request_spread_s == pytest.approx(
        quantile_table([s.client_ttft_s - MetricsServer.ENGINE_TTFT - stream for s in lone])
    )
    again = refit_server_profile(p)
    assert again.request_spread_s == p.request_spread_s
    assert again.busy_request_spread_s == p.busy_request_spread_s
    # samples kept before the busy requests were sent read as none: no busy table
    older = {k: v for k, v in p.fit["serving_path"]["samples"].items() if k != "busy"}
    assert HopSamples.from_json(older).busy == []


def test_a_request_never_reaches_the_engine_before_one_sent_before_it() -> None:
    # two requests sent together: the first draws a longer time outside the engine
    # than the second, which still reaches the engine (and starts) no sooner
    ids = sorted((f"q{k}" for k in range(50)), key=draw_fraction)
    late, early = ids[-1], ids[0]
    profile = dataclasses.replace(BASE, request_spread_s=quantile_table([0.0, 0.05]))
    reqs = [
        SimRequest(rid, array("I", range(1 + 100 * i, 41 + 100 * i)), 2, 0.0)
        for i, rid in enumerate((late, early))
    ]
    first, second = sorted(_run(profile, reqs).requests, key=lambda m: m.request_id != late)
    reach = 0.05 * draw_fraction(late)
    assert first.first_scheduled_s == pytest.approx(reach)
    assert second.first_scheduled_s >= first.first_scheduled_s


@given(gaps=st.lists(st.floats(0.0, 0.01), min_size=2, max_size=8))
def test_requests_start_in_the_order_they_were_sent(gaps: list[float]) -> None:
    profile = dataclasses.replace(
        BASE,
        request_spread_s=quantile_table([0.0, 0.02]),
        busy_request_spread_s=quantile_table([0.0, 0.05]),
    )
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    records = _run(profile, _reqs(arrivals)).requests
    by_send = sorted(records, key=lambda m: int(m.request_id[1:]))  # r0, r1, ...
    starts = [m.first_scheduled_s for m in by_send]
    assert starts == sorted(starts)


def test_a_busy_request_the_server_drops_is_no_sample_and_most_dropped_is_its_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio

    from prefixkv.adapters.lab.sim import serving_path
    from prefixkv.adapters.lab.sim.served import ServerError
    from prefixkv.adapters.lab.sim.serving_path import HopSample

    class Background:
        """Streams its ``n`` tokens (one a loop turn), or fails at once (``fails``)."""

        fails = False

        async def complete(self, client: Any, prompt: Any, n: int, on_token: Any = None) -> None:
            if self.fails:
                raise ServerError("http://fake/v1/completions: RemoteProtocolError: ")
            for k in range(n):
                await asyncio.sleep(0)
                if on_token is not None:
                    on_token(k + 1)

    def probes(fails: set[int]) -> Any:
        calls = iter(range(100))

        async def timed(*args: Any, **kwargs: Any) -> HopSample:
            if next(calls) in fails:
                raise ServerError("http://fake/v1/completions: ReadError: ")
            return HopSample(8, 1, 0.02, 0.0, engine_ttft_s=0.01)

        return timed

    def busy(fails: set[int]) -> list[HopSample]:
        monkeypatch.setattr(serving_path._Sender, "timed", probes(fails))
        sender = serving_path._Sender(Background(), None, lambda: [5] * 8, 0.0, None)  # type: ignore[arg-type]
        run = serving_path._busy(sender, 6, 100)
        return asyncio.run(run)

    assert len(busy(set())) == 6
    assert len(busy({1})) == 5  # dropped, the others kept
    assert len(busy({0, 2, 4})) == 3
    with pytest.raises(ServerError, match="ReadError"):
        busy({0, 1, 2, 3})
    # a background the server drops is no sample either
    Background.fails = True
    with pytest.raises(ServerError, match="RemoteProtocolError"):
        busy(set())


def test_the_busy_requests_stream_like_a_sweeps_and_a_burst_read_is_left_out() -> None:
    from test_serving_path import calibrated_on_a_mock

    from prefixkv.adapters.lab.sim.server_calibration import (
        KEPT_FIELDS,
        fit_server,
        kept_samples,
    )
    from prefixkv.adapters.lab.sim.serving_path import HopSample
    from prefixkv.adapters.lab.sim.serving_spread import BURST_TPOT_S, is_burst

    p = calibrated_on_a_mock(seed=11, serving_repeats=3)
    steps, hops = kept_samples(p)
    assert hops is not None and hops.busy
    # each busy request streams as many tokens as the long ones, while another streams
    long_tokens = {s.num_tokens for s in hops.long}
    assert {s.num_tokens for s in hops.busy} == long_tokens and min(long_tokens) > 1
    assert p.fit["serving_path"]["busy_tokens"] == min(long_tokens)
    assert p.fit["serving_path"]["busy_bursts"] == 0
    # one stream the client read in one burst (its first token 100 s late): left
    # out of the busy table, counted
    first = hops.busy[0]
    burst = first._replace(client_ttft_s=100.0, client_decode_s=1e-6)
    assert is_burst(burst) and not is_burst(first)
    assert not is_burst(HopSample(8, 1, 0.2, 0.0))  # one token: no stream to burst
    assert not is_burst(first._replace(client_decode_s=2 * BURST_TPOT_S * first.num_tokens))
    busy = [burst, *hops.busy[1:]]
    again = fit_server(steps, hops._replace(busy=busy), **{k: getattr(p, k) for k in KEPT_FIELDS})
    assert again.fit["serving_path"]["busy_bursts"] == 1
    assert again.fit["serving_path"]["busy_samples_kept"] == len(hops.busy) - 1
    assert max(again.busy_request_spread_s) < 50.0
