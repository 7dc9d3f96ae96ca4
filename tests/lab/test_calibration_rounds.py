"""Calibration rounds of one server pooled into one profile (``calibration_rounds``):
rounds of a known step model, some slowed as a whole or in one shape."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from make_sim_to_real_fixture import hops, samples

from prefixkv.adapters.lab.sim import CostProfile, ProfileError, StepSample
from prefixkv.adapters.lab.sim.calibration_rounds import pool_rounds, round_speeds
from prefixkv.adapters.lab.sim.server_calibration import fit_server, refit_server_profile

DESCRIBED = {
    "name": "served",
    "model": "m",
    "device": "d",
    "source": "s",
    "measured_on": {"block_size": "32"},
    "kv_cache_tokens": 1 << 20,
}


def a_round(scale: float = 1.0, *, held: int | None = None) -> CostProfile:
    """A calibration of the fixture's known server, every sample ``scale`` times as
    long; sample ``held`` (an index) six times as long besides (a burst that held it)."""
    out = []
    for k, s in enumerate(samples()):
        factor = scale * (6.0 if k == held else 1.0)
        out.append(s._replace(seconds=s.seconds * factor))
    return fit_server(out, hops(), **DESCRIBED)  # type: ignore[arg-type]


def test_the_speeds_say_which_round_ran_slower() -> None:
    rounds = [[s._replace(seconds=s.seconds * f) for s in samples()] for f in (1.0, 1.0, 2.0)]
    speeds = round_speeds(rounds)
    assert speeds[:2] == [0.0, 0.0] and speeds[2] == pytest.approx(0.6931, abs=1e-4)


def test_a_round_far_from_the_others_is_dropped_and_said() -> None:
    pooled = pool_rounds([a_round(), a_round(1.02), a_round(0.99), a_round(1.6)])
    rounds = pooled.fit["rounds"]
    assert (rounds["count"], rounds["kept"]) == (4, 3)
    assert [bool(r["dropped"]) for r in rounds["per_round"]] == [False, False, False, True]
    assert "outlier" in rounds["per_round"][3]["dropped"]
    # the three kept: each shape's median is the 1.0 round's
    assert pooled.step_s == pytest.approx(a_round().step_s, rel=1e-9)
    assert rounds["shape_spread_median"] == pytest.approx(0.03, abs=1e-9)


def test_rounds_that_agree_within_ten_percent_all_count() -> None:
    pooled = pool_rounds([a_round(), a_round(1.08), a_round(0.95)])
    assert pooled.fit["rounds"]["kept"] == 3


def test_two_rounds_are_never_judged_without_a_majority() -> None:
    assert pool_rounds([a_round(), a_round(3.0)]).fit["rounds"]["kept"] == 2


def test_a_shape_one_round_held_is_outvoted_by_the_others() -> None:
    # the 8-request decode run over 512 tokens, held 6x in one of three rounds
    held = len(samples()) - 1
    pooled = pool_rounds([a_round(), a_round(held=held), a_round()])
    one = a_round()
    for key in ("step_s", "prefill_token_s", "decode_seq_s", "decode_context_s"):
        assert getattr(pooled, key) == pytest.approx(getattr(one, key), rel=1e-9, abs=1e-15)


def test_the_serving_path_samples_are_pooled() -> None:
    pooled = pool_rounds([a_round(), a_round(), a_round()])
    kept = pooled.fit["serving_path"]["samples"]
    assert len(kept["short"]) == 3 * len(hops().short)
    assert len(kept["long"]) == 3 * len(hops().long)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4))
def test_pooling_copies_of_one_round_fits_that_round(k: int) -> None:
    one = a_round()
    pooled = pool_rounds([one] * k)
    again = refit_server_profile(one)
    for key in ("step_s", "prefill_token_s", "decode_seq_s", "request_s", "admit_s"):
        assert getattr(pooled, key) == pytest.approx(getattr(again, key), rel=1e-9, abs=1e-15)


@settings(max_examples=15, deadline=None)
@given(st.permutations([1.0, 1.05, 0.97, 1.7]))
def test_the_order_of_the_rounds_does_not_matter(scales: list[float]) -> None:
    pooled = pool_rounds([a_round(f) for f in scales])
    assert pooled.fit["rounds"]["kept"] == 3
    # each shape's median over the three kept is the 1.0 round's
    assert pooled.step_s == pytest.approx(a_round().step_s, rel=1e-9)


def test_rounds_of_other_servers_or_without_samples_are_refused() -> None:
    with pytest.raises(ProfileError, match="no calibration rounds"):
        pool_rounds([])
    other = dataclasses.replace(a_round(), kv_cache_tokens=1 << 10)
    with pytest.raises(ProfileError, match="another pool or block size"):
        pool_rounds([a_round(), other])
    bare = CostProfile("bare", "m", "d", 0.001, 0.0, 0.0, 0.0, 0.0)
    with pytest.raises(ProfileError, match="keeps no calibration samples"):
        pool_rounds([bare])
    bad = dataclasses.replace(
        a_round(), fit={"samples": [{**StepSample(1, 1, 0, 0, -1.0)._asdict()}]}
    )
    with pytest.raises(ProfileError, match="bad value"):
        pool_rounds([bad])
