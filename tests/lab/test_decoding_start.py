"""A lone request that goes on decoding, sent to an idle server: the calibration's
decoding requests, what their first token takes beyond what the simulator charges
(:func:`~prefixkv.adapters.lab.sim.server_calibration.decoding_excess`), and the
simulator drawing a continuing request's first token from them."""

from __future__ import annotations

import dataclasses
import json
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st
from make_sim_to_real_fixture import hops, samples

from prefixkv.adapters.lab.sim import CostProfile, ProfileError, SimRequest, simulate
from prefixkv.adapters.lab.sim.server_calibration import (
    decoding_excess,
    fit_server,
    refit_server_profile,
)
from prefixkv.adapters.lab.sim.serving_path import HopSample, HopSamples, engine_model
from prefixkv.indexes import make_index

DESCRIBED = {"name": "served", "model": "m", "device": "d", "source": "s"}
BASE = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7)


def decoding(client: float, idle_s: float, *, tokens: int = 32, burst: bool = False) -> HopSample:
    """A 32-token request of 8 prompt tokens sent after ``idle_s``, its first token at
    the client ``client`` seconds on (its stream read in one burst: ``burst``)."""
    decode = 1e-4 if burst else 0.08
    return HopSample(8, tokens, client, decode, client - 0.003, client - 0.005, 0.08, 0.018,
                     0.001, idle_s)  # fmt: skip


@given(
    client=st.floats(0.0, 0.05),
    wake=st.floats(0.0, 0.005),
    admit=st.floats(0.0, 0.005),
    stream=st.floats(0.0, 0.002),
    cpu=st.floats(0.0, 0.005),
    share=st.floats(0.0, 1.0),
    idle_s=st.sampled_from([0.3, 1.2]),
)
def test_the_excess_is_the_client_ttft_less_each_term_the_simulator_charges(
    client: float, wake: float, admit: float, stream: float, cpu: float, share: float,
    idle_s: float,
) -> None:  # fmt: skip
    p = dataclasses.replace(
        BASE, wake_s=wake, wake_after_s=1.0, admit_s=admit, stream_token_s=stream,
        frontend_request_cpu_s=cpu, frontend_cpu_share=share,
    )  # fmt: skip
    step = engine_model(BASE)(8, 1)[0] + admit + (wake if idle_s >= 1.0 else 0.0)
    charged = step + share * min(cpu, step) + stream
    (got,) = decoding_excess([decoding(client, idle_s)], engine_model(BASE), p)
    assert got == pytest.approx(client - charged, abs=1e-12)
    # a stream the client read in one burst is its own stall: no sample
    assert decoding_excess([decoding(client, idle_s, burst=True)], engine_model(BASE), p) == []


def _fitted(decoding_samples: list[HopSample]) -> CostProfile:
    h = hops()
    idle = [s._replace(idle_s=p) for s in h.short for p in (0.05, 0.5)]
    return fit_server(
        samples(), HopSamples(h.short, h.long, h.share, idle, (), decoding_samples), **DESCRIBED
    )  # type: ignore[arg-type]


def _lone_after_idle(p: CostProfile, out: int) -> float:
    """The TTFT of a request of 8 prompt tokens decoding ``out``, sent 10 s after the
    run's first request (the engine idled in between)."""
    reqs = [
        SimRequest("first", array("I", range(1, 9)), 2, 0.0),
        SimRequest("lone", array("I", range(100, 108)), out, 10.0),
    ]
    res = simulate(reqs, lambda: make_index("hash_chain", 16), 1 << 14, profile=p)
    return res.requests[1].ttft_s


def test_the_simulator_prices_a_decoding_requests_first_token_at_what_the_calibration_measured(
) -> None:  # fmt: skip
    # every decoding request took 19 ms to its first token, at both pauses
    p = _fitted([decoding(0.019, pause) for pause in (0.3, 1.2) for _ in range(3)])
    assert p.decoding_request_spread_s and p.fit["serving_path"]["decoding_samples_kept"] == 6
    # simulated alone on an idle engine, such a request takes what the calibration
    # measured, to the client: no term of its first step or streaming counted twice
    assert _lone_after_idle(p, 32) == pytest.approx(0.019, rel=1e-9)
    # a one-token request draws from the idle one-token table as before
    without = _fitted([])
    assert without.decoding_request_spread_s == ()
    assert _lone_after_idle(p, 1) == pytest.approx(_lone_after_idle(without, 1), rel=1e-12)
    # without decoding samples (profiles made before they were sent) a decoding request
    # is priced as a one-token one was
    assert _lone_after_idle(without, 32) < 0.019


def test_the_decoding_table_keeps_the_spread_leaves_out_bursts_and_refits_to_itself() -> None:
    slow = [decoding(0.010 + 0.001 * k, 0.3 if k % 2 else 1.2) for k in range(10)]
    p = _fitted([*slow, decoding(0.09, 0.3, burst=True)])
    path = p.fit["serving_path"]
    assert (path["decoding_samples_kept"], path["decoding_bursts"]) == (10, 1)
    table = p.decoding_request_spread_s
    assert table[20] - table[0] == pytest.approx(0.009, abs=1e-9)  # the burst left out
    again = refit_server_profile(CostProfile.from_dict(json.loads(json.dumps(p.to_dict()))))
    assert again.decoding_request_spread_s == pytest.approx(table, abs=1e-15)
    # samples kept before the decoding requests were sent read as none
    kept = {k: v for k, v in path["samples"].items() if k != "decoding"}
    assert HopSamples.from_json(kept).decoding == []
    data = p.to_dict()
    del data["decoding_request_spread_s"]
    assert CostProfile.from_dict(data).decoding_request_spread_s == ()


def test_a_sweep_refuses_pauses_that_are_not_seconds() -> None:
    from prefixkv.adapters.lab.sim.server_calibration import ServerSweep

    for bad in ((-0.1,), (float("nan"),), (True,), ("1",), (61.0,)):
        with pytest.raises(ProfileError, match="decoding_pauses_s"):
            ServerSweep(decoding_pauses_s=bad)  # type: ignore[arg-type]
    assert ServerSweep(decoding_pauses_s=()).decoding_pauses_s == ()
