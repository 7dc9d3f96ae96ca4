"""Taking a request in: the engine's cost beyond the step model (``admit_s``), fitted
from lone requests' engine-side time and priced once a step that starts a request."""

from __future__ import annotations

import dataclasses
import math
from array import array
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim import CostProfile, ProfileError, SimRequest, simulate
from prefixkv.adapters.lab.sim.engine_decode import fit_admit_s
from prefixkv.adapters.lab.sim.serving_path import HopSample, engine_model
from prefixkv.indexes import make_index

BASE = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7)


def lone(engine: float | None, prompt: int = 8) -> HopSample:
    return HopSample(prompt, 1, 0.02, 0.0, engine_ttft_s=engine)


def test_admit_s_is_the_engines_time_for_a_lone_request_beyond_the_step_models_price() -> None:
    model = engine_model(BASE)
    first = model(8, 1)[0]  # step_s + 8 prefill tokens
    samples = [lone(first + e) for e in (0.003, 0.004, 0.010)]
    assert fit_admit_s(samples, model) == pytest.approx(0.004)  # the median
    # a server that does not say its engine side: not measured
    assert fit_admit_s([lone(None)] * 3, model) is None
    assert fit_admit_s([], model) is None
    # an engine quicker than the step model: nothing more to pay
    assert fit_admit_s([lone(first / 2)] * 3, model) == 0.0
    # samples without the engine side are left out, not counted as zero
    assert fit_admit_s([lone(None), lone(first + 0.002)], model) == pytest.approx(0.002)


def test_a_profile_reads_admit_s_as_zero_when_absent_and_refuses_a_bad_one() -> None:
    data = BASE.to_dict()
    assert data["admit_s"] == 0.0
    del data["admit_s"]
    assert CostProfile.from_dict(data).admit_s == 0.0
    assert CostProfile.from_dict({**data, "admit_s": 0.004}).admit_s == 0.004
    for bad in (-1e-3, math.nan, "4 ms", True):
        with pytest.raises(ProfileError, match="admit_s"):
            dataclasses.replace(BASE, admit_s=bad)


def _reqs(arrivals: list[float], prompt: int = 40, out: int = 4) -> list[SimRequest]:
    return [
        SimRequest(f"r{i}", array("I", range(1 + 100 * i, 1 + 100 * i + prompt)), out, t)
        for i, t in enumerate(arrivals)
    ]


def _run(profile: CostProfile, reqs: list[SimRequest]) -> Any:
    return simulate(reqs, lambda: make_index("hash_chain", 16), 1 << 14, profile=profile)


def test_a_lone_request_waits_admit_s_longer_for_its_first_token_and_no_longer_after() -> None:
    admit = dataclasses.replace(BASE, admit_s=0.004)
    reqs = _reqs([0.0, 10.0])  # each alone
    a, b = _run(BASE, reqs), _run(admit, reqs)
    for x, y in zip(a.requests, b.requests, strict=True):
        assert y.ttft_s == pytest.approx(x.ttft_s + 0.004)
        assert y.tpot_s == pytest.approx(x.tpot_s)  # its decode steps take nothing in
    assert b.run.busy_s == pytest.approx(a.run.busy_s + 2 * 0.004)


def test_requests_started_in_one_step_pay_admit_s_once() -> None:
    admit = dataclasses.replace(BASE, admit_s=0.004)
    reqs = _reqs([0.0, 0.0, 0.0])  # one step prefills all three
    a, b = _run(BASE, reqs), _run(admit, reqs)
    assert b.run.num_steps == a.run.num_steps
    assert b.run.busy_s == pytest.approx(a.run.busy_s + 0.004)


def test_a_request_arriving_during_a_decode_step_waits_for_its_end_then_pays_admit_s() -> None:
    admit = dataclasses.replace(BASE, admit_s=0.004)
    first = _reqs([0.0], out=40)
    alone = _run(admit, first).requests[0]
    # the second arrives mid-way through the first's third decode step
    t = alone.first_token_s + 2.5 * alone.tpot_s
    both = _run(admit, [*first, *_reqs([0.0, t])[1:]])
    second = both.requests[1]
    assert second.first_scheduled_s > t  # it waited for the running step to end
    assert second.first_scheduled_s - t < alone.tpot_s
    # its step decodes the first request and starts it: the step model's price of
    # both, plus taking it in once
    step = second.first_token_s - second.first_scheduled_s
    work = BASE.step_time(40, 40 * 41 // 2, 1, 40 + 3 + 1)
    assert step == pytest.approx(work + 0.004, rel=1e-6)


@given(
    admit_s=st.floats(0.0, 0.05),
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=8),
    out=st.integers(1, 8),
)
def test_admit_s_adds_itself_once_to_each_step_that_starts_a_request(
    admit_s: float, gaps: list[float], out: int
) -> None:
    arrivals = [sum(gaps[: i + 1]) for i in range(len(gaps))]
    reqs = _reqs(arrivals, out=out)
    res = _run(dataclasses.replace(BASE, admit_s=admit_s), reqs)
    plain = _run(BASE, reqs)

    def starts(run: Any) -> list[list[str]]:
        """The requests each starting step started, in order."""
        by: dict[float, list[str]] = {}
        for m in run.requests:
            by.setdefault(m.first_scheduled_s, []).append(m.request_id)
        return [by[t] for t in sorted(by)]

    # where the schedule is the same (the dearer steps let no more arrivals join one),
    # the run is the step model's work plus admit_s for each step that started any
    if starts(res) == starts(plain) and res.run.num_steps == plain.run.num_steps:
        assert res.run.busy_s == pytest.approx(
            plain.run.busy_s + admit_s * len(starts(res)), rel=1e-9, abs=1e-12
        )
    for m in res.requests:  # every request paid it before its first token
        assert m.ttft_s >= BASE.step_s + admit_s - 1e-12
