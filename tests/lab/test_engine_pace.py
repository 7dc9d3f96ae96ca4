"""The engine's pace over time: read from the serving path's lone decodes, kept by
``calibrate --server``, and applied by the simulator to each step."""

from __future__ import annotations

import dataclasses
import math
import statistics
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim import CostProfile, SimRequest, simulate
from prefixkv.adapters.lab.sim.serving_path import HopSample
from prefixkv.adapters.lab.sim.serving_spread import (
    QUANTILES,
    pace_ratios,
    pace_table,
    pace_window,
    quantile_table,
    step_pace,
)
from prefixkv.indexes import make_index

BASE = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7)


def lone(decode_s: float, k: int = 32, prompt: int = 8) -> HopSample:
    return HopSample(prompt, k, 0.01, decode_s, engine_ttft_s=0.005, engine_decode_s=decode_s)


def test_each_request_s_pace_is_over_the_median_of_its_shape() -> None:
    # two shapes, each with its own median; a one-token request and one the server
    # did not time say nothing of the pace
    samples = [lone(0.1), lone(0.2), lone(0.3), lone(0.02, k=8), lone(0.04, k=8),
               HopSample(8, 1, 0.01, 0.0, engine_decode_s=0.0),
               HopSample(8, 32, 0.01, 0.2)]  # fmt: skip
    assert sorted(pace_ratios(samples)) == pytest.approx([0.5, 2 / 3, 1.0, 4 / 3, 1.5])
    assert pace_window(samples) == pytest.approx(0.1)  # the median of the five
    assert pace_table(samples) == pytest.approx(quantile_table(pace_ratios(samples)))
    assert pace_table(samples[:2]) == ()  # two requests: no spread to speak of
    assert pace_window([]) == 0.0


def test_without_a_table_or_a_window_the_pace_is_one() -> None:
    table = quantile_table([0.5, 2.0])
    for pace in (step_pace((), 0.1), step_pace(table, 0.0), step_pace(table, math.nan)):
        assert {pace(t) for t in (0.0, 0.05, 3.7, 1e6)} == {1.0}


@given(t=st.floats(0.0, 1e5), window=st.floats(1e-3, 10.0))
def test_the_pace_holds_over_a_window_and_lies_within_the_table(t: float, window: float) -> None:
    table = quantile_table([0.6, 1.0, 1.7])
    pace = step_pace(table, window)
    start = math.floor(t / window) * window
    assert table[0] <= pace(t) <= table[-1]
    assert pace(t) == pace(start + 0.5 * window) == step_pace(table, window)(t)


def test_windows_draw_over_the_whole_table() -> None:
    table = quantile_table([0.5, 1.5])
    paces = [step_pace(table, 1.0)(k + 0.5) for k in range(400)]
    assert min(paces) < 0.6 and max(paces) > 1.4
    assert statistics.median(paces) == pytest.approx(1.0, abs=0.1)


def _reqs(n: int, gap: float, out: int = 20) -> list[SimRequest]:
    return [
        SimRequest(f"r{i}", array("I", range(1 + 100 * i, 41 + 100 * i)), out, gap * i)
        for i in range(n)
    ]


def _tpots(profile: CostProfile, reqs: list[SimRequest]) -> list[float]:
    res = simulate(reqs, lambda: make_index("hash_chain", block_size=16), 4096, profile=profile)
    return [m.tpot_s for m in res.requests]


def test_the_simulator_runs_each_step_at_the_pace_of_its_window() -> None:
    reqs = _reqs(6, 1.0)  # one at a time: each request's steps are its own
    plain = _tpots(BASE, reqs)
    # a flat table: every step takes twice its priced time
    doubled = dataclasses.replace(BASE, pace_spread=(2.0,) * len(QUANTILES), pace_window_s=0.5)
    assert _tpots(doubled, reqs) == pytest.approx([2 * t for t in plain], rel=1e-9)
    # a spread table: requests in different windows run at different paces, and a
    # run is a pure function of its inputs
    spread = dataclasses.replace(BASE, pace_spread=quantile_table([0.5, 1.5]), pace_window_s=10.0)
    paced = _tpots(spread, _reqs(12, 10.0))
    assert max(paced) / min(paced) > 1.5
    assert paced == _tpots(spread, _reqs(12, 10.0))
    fixed = _tpots(BASE, _reqs(12, 10.0))
    assert max(fixed) / min(fixed) == pytest.approx(1.0)


def test_a_profile_keeps_its_pace_and_refuses_a_bad_one() -> None:
    from prefixkv.adapters.lab.sim import ProfileError

    p = dataclasses.replace(BASE, pace_spread=quantile_table([0.8, 1.3]), pace_window_s=0.15)
    again = CostProfile.from_dict(p.to_dict())
    assert again.pace_spread == p.pace_spread and again.pace_window_s == 0.15
    older = p.to_dict()
    del older["pace_spread"], older["pace_window_s"]
    assert CostProfile.from_dict(older).pace_spread == ()
    with pytest.raises(ProfileError, match="pace_spread"):
        dataclasses.replace(BASE, pace_spread=(1.2, 0.8) * 10 + (1.0,))  # not non-decreasing
    with pytest.raises(ProfileError, match="pace_window_s"):
        dataclasses.replace(BASE, pace_window_s=-1.0)


def test_calibrate_server_keeps_the_pace_of_its_lone_decodes() -> None:
    from test_serving_path import calibrated_on_a_mock

    from prefixkv.adapters.lab.sim.server_calibration import (
        KEPT_FIELDS,
        fit_server,
        kept_samples,
    )

    p = calibrated_on_a_mock(seed=5, serving_repeats=3)
    steps, hops = kept_samples(p)
    assert hops is not None and hops.long
    # the mock decodes at one fixed pace: every ratio is 1
    assert p.pace_spread == pytest.approx((1.0,) * len(QUANTILES))
    assert p.pace_window_s == pytest.approx(pace_window(hops.long))
    # lone decodes at other paces: the table is theirs, fitted again from the samples
    slow = [s._replace(engine_decode_s=s.engine_decode_s * f)  # type: ignore[operator]
            for s, f in zip(hops.long, (0.8, 1.0, 1.5), strict=True)]  # fmt: skip
    again = fit_server(steps, hops._replace(long=slow), **{k: getattr(p, k) for k in KEPT_FIELDS})
    assert again.pace_spread == pytest.approx(pace_table(slow))
    assert again.pace_spread[0] < 1.0 < again.pace_spread[-1]
