"""The simulator's parts: requests, arrival processes, cost profiles, percentiles, and
calibration's fit (the timed measurement runs once, on tiny shapes)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import subprocess
import sys
from array import array
from pathlib import Path
from typing import Any

import pytest

from prefixkv.adapters.lab.cluster.sim_replica import replica_seat
from prefixkv.adapters.lab.sim import (
    COEFFICIENTS,
    DEFAULT_PROFILE,
    CostProfile,
    ProfileError,
    SimInputError,
    SimRequest,
    SimSettingsError,
    attention_pairs,
    available_profiles,
    fixed_rate_arrivals,
    from_trace,
    load_profile,
    percentile,
    poisson_arrivals,
    save_profile,
    with_arrivals,
)
from prefixkv.adapters.lab.sim.calibration import StepSample, calibrate, fit_profile
from prefixkv.adapters.lab.sim.replica import pool_seat
from prefixkv.adapters.lab.traces import TraceRequest
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.indexes import InvalidTokenError
from prefixkv.indexes.registry import make_index

# --------------------------------------------------------------------- requests


def _one(prompt: list[int], output: list[int], **options: bool) -> SimRequest:
    (r,) = from_trace([TraceRequest("a", prompt, output, 1.5)], **options)
    return r


def test_a_trace_request_becomes_a_sim_request() -> None:
    r = _one([3, 4, 5], [7, 8])
    assert r.prompt == array("I", [3, 4, 5]) and r.output_len == 2 and r.output_token(1) == 8
    assert r.arrival == 1.5 and r.after is None
    filler = _one([1], [7, 8, 9, 10, 11], output_tokens=False)
    assert filler.output is None and filler.output_len == 5 and filler.output_token(4) == 0
    assert _one([1], []).output_len == 1  # an engine always samples one
    prefill = _one([1], [7, 8], prefill_only=True)
    assert prefill.output_len == 1 and prefill.output is None
    with pytest.raises(SimInputError, match="prompt"):
        _one([], [3])
    with pytest.raises(InvalidTokenError):
        _one([1, -2], [3])


def test_closed_loop_links_each_turn_to_the_one_before() -> None:
    turns = [
        TraceRequest("s1-1", [1], [2], 0.0, session="s1"),
        TraceRequest("s2-1", [1], [2], 0.1, session="s2"),
        TraceRequest("s1-2", [1, 2, 3], [4], 0.2, session="s1", think_s=2.0),
        TraceRequest("x", [9], [9], 0.3, parent="s2-1"),
    ]
    links = [(r.after, r.think_s) for r in from_trace(turns, closed_loop=True)]
    assert links == [(None, 0.0), (None, 0.0), ("s1-1", 2.0), ("s2-1", 0.0)]
    assert all(r.after is None for r in from_trace(turns))


def test_sim_request_validates() -> None:
    for arrival in (-1.0, math.nan, math.inf, True):
        with pytest.raises(SimInputError, match="arrival"):
            SimRequest("i", array("I", [1]), 1, arrival)
    for think in (-1.0, math.nan, math.inf, True):
        with pytest.raises(SimInputError, match="think_s"):
            SimRequest("t", array("I", [1]), 1, 0.0, after="s", think_s=think)
    with pytest.raises(SimInputError, match="after"):
        SimRequest("s", array("I", [1]), 1, after="s")
    with pytest.raises(SimInputError, match="output_len"):
        SimRequest("j", array("I", [1]), 2, None, array("I", [1]))
    with pytest.raises(SimInputError, match="array"):
        SimRequest("k", [1], 1)  # type: ignore[arg-type]


def test_a_pool_that_holds_no_block_is_refused_with_each_rooms_error() -> None:
    def factory() -> Any:
        return make_index("hash_chain", 16)

    for bad in (0, -16, 16.0, True):
        with pytest.raises(SimSettingsError, match="positive int"):
            pool_seat("mixed", factory, bad)  # type: ignore[arg-type]
    with pytest.raises(SimSettingsError, match="15 holds no block of 16 tokens"):
        pool_seat("prefill_first", factory, 15)
    with pytest.raises(ClusterSettingsError, match="15 holds no block of 16 tokens"):
        replica_seat(factory, 15, "mixed", events=True)
    index, seat = pool_seat("mixed", factory, 32)
    assert index.block_size == 16 and seat.num_blocks == 2


# --------------------------------------------------------------------- arrivals


def test_poisson_arrivals_are_seeded_with_the_requested_rate() -> None:
    a = list(itertools.islice(poisson_arrivals(4.0, seed=3), 20_000))
    b = list(itertools.islice(poisson_arrivals(4.0, seed=3), 20_000))
    c = list(itertools.islice(poisson_arrivals(4.0, seed=4), 100))
    assert a == b and a[:100] != c and a[0] == 0.0
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.03)  # exponential: sd = mean


def test_fixed_rate_arrivals() -> None:
    assert list(itertools.islice(fixed_rate_arrivals(4.0), 4)) == [0.0, 0.25, 0.5, 0.75]


def _reqs(arrivals: list[float | None]) -> list[SimRequest]:
    return [SimRequest(str(i), array("I", [1]), 1, t) for i, t in enumerate(arrivals)]


def test_with_arrivals_rate_scale_or_as_they_are() -> None:
    stamped = list(with_arrivals(_reqs([None] * 3), request_rate=2.0, process="fixed"))
    assert [r.arrival for r in stamped] == [0.0, 0.5, 1.0]
    scaled = list(with_arrivals(_reqs([5.0, 6.0, 8.0]), time_scale=2.0))
    assert [r.arrival for r in scaled] == [0.0, 2.0, 6.0]
    same = list(with_arrivals(_reqs([5.0, 6.0])))
    assert [r.arrival for r in same] == [5.0, 6.0]
    with pytest.raises(SimInputError, match="no arrival"):
        list(with_arrivals(_reqs([None]), time_scale=1.0))
    with pytest.raises(SimSettingsError, match="not both"):
        with_arrivals([], request_rate=1.0, time_scale=1.0)
    with pytest.raises(SimSettingsError, match="process"):
        with_arrivals([], request_rate=1.0, process="bursty")  # type: ignore[arg-type]
    for bad in (0, -1.0, math.inf, "2"):
        with pytest.raises(SimSettingsError):
            with_arrivals([], request_rate=bad)  # type: ignore[arg-type]
        with pytest.raises(SimSettingsError):
            with_arrivals([], time_scale=bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------- profiles


def test_prefill_cost_is_additive_over_chunks_and_decreasing_in_the_hit() -> None:
    p = load_profile()
    assert attention_pairs(3, 0) == 1 + 2 + 3 and attention_pairs(2, 5) == 6 + 7
    whole = p.prefill_s(1000, 24)
    assert p.prefill_s(300, 24) + p.prefill_s(700, 324) == pytest.approx(whole)
    costs = [p.prefill_s(1000 - h, h) for h in range(0, 1000, 50)]
    assert costs == sorted(costs, reverse=True)
    assert p.step_time(0, 0, 0, 0) == p.step_s


def test_default_profile_is_shipped_and_cites_its_source() -> None:
    assert DEFAULT_PROFILE in available_profiles()
    p = load_profile(DEFAULT_PROFILE)
    assert "Vidur" in p.source and "microsoft/vidur" in p.source
    assert "A100" in p.device and "Llama-2-70b" in p.model
    # A 70B model on two A100s: tens of ms a decode step, about a second for 4K tokens.
    assert 0.03 < p.step_s + p.decode_s(1, 1000) < 0.1
    assert 1.0 < p.step_s + p.prefill_s(4096) < 2.0


def test_profile_round_trip_and_bad_profiles(tmp_path: Path) -> None:
    p = CostProfile("mine", "m", "d", 0.01, 1e-4, 1e-8, 1e-3, 1e-7, source="s", fit={"x": 1})
    path = tmp_path / "mine.json"
    save_profile(p, path)
    assert load_profile(path) == p
    assert load_profile(str(path)) == p
    data = json.loads(path.read_text())
    del data["coefficients"]["step_s"]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match="step_s"):
        load_profile(path)
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        load_profile(path)
    with pytest.raises(ProfileError, match="no profile"):
        load_profile(tmp_path / "missing.json")
    for k in COEFFICIENTS:
        negative: dict[str, Any] = {k: -1.0}
        with pytest.raises(ProfileError, match=k):
            dataclasses.replace(p, **negative)
    with pytest.raises(ProfileError, match="zero"):
        CostProfile("zero", "m", "d", 0, 0, 0, 0, 0)


# ------------------------------------------------------------------ percentiles


def test_percentile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    values = [0.3, 5.0, 1.0, 2.5, 9.0, 4.0, 0.1]
    for q in (1, 50, 90, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([2.0], 90) == 2.0
    assert math.isnan(percentile([], 50))


# ------------------------------------------------------------------ calibration


def test_fit_recovers_known_coefficients() -> None:
    truth = CostProfile("t", "m", "d", 2e-3, 3e-5, 4e-9, 5e-4, 6e-8)
    shapes = [
        (q, attention_pairs(q, s), b, b * (c + 1))
        for q, s, b, c in [
            (16, 0, 0, 0), (512, 0, 0, 0), (256, 1024, 0, 0), (2048, 0, 0, 0),
            (0, 0, 1, 64), (0, 0, 32, 512), (0, 0, 8, 4096), (64, 0, 8, 256),
        ]
    ]  # fmt: skip
    samples = [StepSample(*w, truth.step_time(*w)) for w in shapes]
    fitted = fit_profile(samples, name="f", model="m", device="d", source="s")
    for k in COEFFICIENTS:
        assert getattr(fitted, k) == pytest.approx(getattr(truth, k), rel=1e-6)
    assert fitted.fit["relative_error_max"] < 1e-6
    with pytest.raises(ValueError, match="at least"):
        fit_profile(samples[:3], name="f", model="m", device="d", source="s")


def test_calibrate_measures_the_reference_engine(tmp_path: Path) -> None:
    profile = calibrate(
        repeats=1,
        prefill=[(8, 0), (32, 0), (32, 64), (64, 32)],
        decode=[(1, 16), (4, 32), (8, 8)],
        mixed=[(16, 0, 2, 16)],
    )
    assert profile.name == "reference-engine-cpu" and "TinyTransformer" in profile.model
    assert profile.fit["num_samples"] == 8
    assert profile.step_time(64, attention_pairs(64, 0), 0, 0) > 0
    save_profile(profile, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == profile


def test_calibrate_refuses_a_model_it_cannot_hold_before_allocating_it() -> None:
    from prefixkv.adapters.engine import EngineConfig, ModelConfig
    from prefixkv.adapters.lab.sim.calibration import measure_engine

    huge = EngineConfig(model=ModelConfig(head_dim=10**9))
    with pytest.raises(
        SimSettingsError, match=r"head.*1000000000.*GiB, over the limit of 8\.0 GiB"
    ):
        measure_engine(huge, prefill=[(8, 0)], decode=[], mixed=[], repeats=1)
    with pytest.raises(SimSettingsError, match="over the limit"):
        measure_engine(prefill=[(8, 0)], decode=[], mixed=[], repeats=1, max_bytes=1000)
    with pytest.raises(SimSettingsError, match="prefill shape"):
        measure_engine(prefill=[(0, 0)], decode=[], mixed=[], repeats=1)


def test_a_profile_with_coefficients_no_step_could_take_is_refused(tmp_path: Path) -> None:
    p = CostProfile("mine", "m", "d", 0.01, 1e-4, 1e-8, 1e-3, 1e-7)
    for k in COEFFICIENTS:
        data = p.to_dict()
        data["coefficients"][k] = 1e308  # every step time would overflow to infinity
        path = tmp_path / f"{k}.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ProfileError, match=rf"{k} must be a number of seconds in \[0, 1000\]"):
            load_profile(path)
        for bad in (math.nan, math.inf, 1001.0):
            with pytest.raises(ProfileError, match=k):
                dataclasses.replace(p, **{k: bad})


def test_the_simulator_needs_none_of_its_optional_dependencies_to_import() -> None:
    heavy = ("torch", "numpy", "scipy", "matplotlib", "pandas", "pyarrow")
    code = (
        "import sys, prefixkv.adapters.lab.sim; "
        f"loaded = [m for m in {heavy!r} if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
