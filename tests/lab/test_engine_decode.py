"""What a server's fit takes from the engine core's own clock: the lone requests' decode
(a step sample the fit goes through), ``admit_s`` from the requests sent back to back,
and the idle spread from the requests sent after a pause; and how runs weigh a sample."""

from __future__ import annotations

import pytest
from make_sim_to_real_fixture import TRUTH, hops, samples

from prefixkv.adapters.lab.sim import StepSample
from prefixkv.adapters.lab.sim.calibration import fit_profile
from prefixkv.adapters.lab.sim.engine_decode import decode_samples
from prefixkv.adapters.lab.sim.server_calibration import fit_server
from prefixkv.adapters.lab.sim.serving_path import HopSample, HopSamples

DESCRIBED = {"name": "served", "model": "m", "device": "d", "source": "s"}


def long(decode: float, prompt: int = 8, k: int = 32) -> HopSample:
    return HopSample(prompt, k, 0.011, decode, 0.008, 0.0055, decode, 0.018, 0.001)


def test_a_lone_requests_engine_decode_is_its_decode_steps_median() -> None:
    got = decode_samples([long(0.10), long(0.30), long(0.11), long(0.2, k=1), long(0.05, 64)])
    assert len(got) == 2  # one per (prompt, tokens); one-token requests decode nothing
    first = got[0]
    assert (first.num_steps, first.num_decode, first.prefill_tokens) == (31, 31, 0)
    assert first.decode_context == 31 * 8 + 31 * 32 // 2  # row j reads 8 + j tokens
    assert first.seconds == pytest.approx(0.11) and first.runs == 3
    assert (first.num_requests, first.num_streamed) == (0, 0)  # the engine's own clock
    no_engine = long(0.1)._replace(engine_decode_s=None)
    assert decode_samples([no_engine]) == []


def test_the_fit_goes_through_the_engines_lone_decode_where_the_client_timed_it_slow() -> None:
    # The sweep's decode runs, timed at the client, held 3x by stalls; the engine core
    # says what one-row decode steps of the known model took.
    slowed = [s._replace(seconds=s.seconds * 3) if s.num_decode else s for s in samples()]
    truth = sum(TRUTH.step_time(0, 0, 1, 8 + j) for j in range(1, 32))
    h = hops()
    clean = HopSamples(h.short, [long(truth), long(truth)], h.share)
    p = fit_server(slowed, clean, **DESCRIBED)  # type: ignore[arg-type]
    priced = sum(p.step_time(0, 0, 1, 8 + j) for j in range(1, 32))
    assert priced == pytest.approx(truth, rel=0.01)


def test_a_sample_many_runs_agree_on_counts_for_more() -> None:
    # two prefill samples of the same work disagree; the one of more runs wins
    base = [StepSample(q, q * (q + 1) // 2, 0, 0, 1e-3 + 1e-5 * q) for q in (16, 64, 256, 1024)]
    base += [StepSample(0, 0, b, b * 100, 1e-3 + 1e-4 * b) for b in (1, 4, 16)]
    a = StepSample(128, 128 * 129 // 2, 0, 0, 0.004, runs=100)
    b = a._replace(seconds=0.002, runs=1)
    p = fit_profile([*base, a, b], **DESCRIBED)  # type: ignore[arg-type]
    q = fit_profile([*base, a._replace(runs=1), b._replace(runs=100)], **DESCRIBED)  # type: ignore[arg-type]
    price = (128, 128 * 129 // 2, 0, 0)
    assert p.step_time(*price) > q.step_time(*price)


def _hop(engine: float, outside: float, idle_s: float = 0.0) -> HopSample:
    return HopSample(8, 1, engine + outside, 0.0, engine + outside / 2, engine, 0.0, 0.003,
                     0.001, idle_s)  # fmt: skip


def test_admit_s_comes_from_back_to_back_requests_and_the_idle_spread_from_paused_ones() -> None:
    h = hops()
    short = [_hop(0.0055, 0.004)] * 10
    # after a pause the engine core took 3 ms more (waking) and the rest 2 ms more
    idle = [_hop(0.0085, 0.006, p) for p in (0.05, 0.1, 0.2, 0.5) for _ in range(2)]
    p = fit_server(samples(), HopSamples(short, h.long, h.share, idle), **DESCRIBED)  # type: ignore[arg-type]
    back_to_back = fit_server(samples(), HopSamples(short, h.long, h.share), **DESCRIBED)  # type: ignore[arg-type]
    assert p.admit_s == pytest.approx(back_to_back.admit_s, abs=1e-12)
    assert p.wake_s == pytest.approx(0.003)
    # the paused ones' outside, less the first token's streaming (priced apart)
    assert p.request_spread_s[10] == pytest.approx(0.006 - p.stream_token_s)
    assert back_to_back.request_spread_s[10] == pytest.approx(0.004 - p.stream_token_s)
    assert p.stream_token_s > 0


def test_the_simulator_prices_its_calibrations_own_lone_request_at_its_measured_ttft() -> None:
    # The fixture's serving path (front end streaming 0.5 ms a token, 2 ms of CPU a
    # request, sharing the cores), its one-token requests all alike: simulated alone on
    # an idle engine, such a request takes what the calibration measured for it, to the
    # client. Neither the first token's streaming nor the front end's share of the step
    # that takes it in counts twice.
    from array import array

    from prefixkv.adapters.lab.sim import SimRequest, simulate
    from prefixkv.indexes import make_index

    h = hops()
    short = [h.short[0]] * 4
    p = fit_server(samples(), HopSamples(short, h.long, h.share), **DESCRIBED)  # type: ignore[arg-type]
    assert p.stream_token_s > 0 and p.frontend_cpu_share > 0 and p.frontend_request_cpu_s > 0
    lone = SimRequest("lone", array("I", range(100, 108)), 1, 0.0)
    res = simulate([lone], lambda: make_index("hash_chain", 16), 1 << 14, profile=p)
    assert res.requests[0].ttft_s == pytest.approx(short[0].client_ttft_s, rel=1e-9)
