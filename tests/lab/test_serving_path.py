"""The serving path: the fit on timings with a known answer, the simulator's use of
it, and ``calibrate --server`` measuring it from a (mock) server's ``/metrics``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim import CostProfile, ProfileError, SimRequest, StepSample, simulate
from prefixkv.adapters.lab.sim.calibration import fit_profile
from prefixkv.adapters.lab.sim.profile import COEFFICIENTS
from prefixkv.adapters.lab.sim.serving_path import (
    IDLE_PAUSES_S,
    METRICS,
    HopSample,
    HopSamples,
    SharePair,
    engine_model,
    fit_serving_path,
    metric_totals,
)
from prefixkv.indexes import make_index

BASE = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7)


def hop(
    *,
    http: float,
    front: float,
    engine: float,
    k: int = 1,
    decode: float = 0.0,
    cpu: float | None = None,
    client_cpu: float = 0.0,
    prompt: int = 8,
) -> HopSample:
    """A request whose hops took ``http`` (client <-> API server), ``front`` (API
    server <-> engine core) and ``engine`` (queue + prefill) seconds."""
    return HopSample(
        prompt_tokens=prompt,
        num_tokens=k,
        client_ttft_s=http + front + engine,
        client_decode_s=decode,
        server_ttft_s=front + engine,
        engine_ttft_s=engine,
        engine_decode_s=decode if k > 1 else 0.0,
        frontend_cpu_s=cpu,
        client_cpu_s=client_cpu,
    )


# ------------------------------------------------------------------ the fit


@given(
    http=st.floats(1e-4, 0.05),
    front=st.floats(1e-4, 0.05),
    engines=st.lists(st.floats(1e-3, 0.2), min_size=1, max_size=7),
    cpu_request=st.floats(0.0, 0.02),
    cpu_token=st.floats(0.0, 0.002),
    k=st.integers(2, 64),
)
def test_the_fit_recovers_known_hops_and_front_end_cpu(
    http: float,
    front: float,
    engines: list[float],
    cpu_request: float,
    cpu_token: float,
    k: int,
) -> None:
    # Whatever the engine's own time, the fixed cost is what lies outside it, less the
    # first token's streaming (priced apart, by stream_token_s).
    short = [hop(http=http, front=front, engine=e, cpu=cpu_request + cpu_token) for e in engines]
    long = [
        hop(http=http, front=front, engine=e, k=k, decode=0.01 * k, cpu=cpu_request + k * cpu_token)
        for e in engines
    ]
    path = fit_serving_path(short, long)
    assert path.request_s == pytest.approx(max(0.0, http + front - cpu_token), rel=1e-6, abs=1e-12)
    assert path.hops["http"] == pytest.approx(http, rel=1e-6, abs=1e-12)
    assert path.hops["frontend"] == pytest.approx(front, rel=1e-6, abs=1e-12)
    assert path.stream_token_s == pytest.approx(cpu_token, rel=1e-6, abs=1e-12)
    assert path.frontend_request_cpu_s == pytest.approx(cpu_request, rel=1e-6, abs=1e-12)
    assert path.engine_side == "metrics" and path.frontend_cpu_share is None
    assert path.known() == {"request_s": path.request_s, "stream_token_s": path.stream_token_s}


def test_without_the_servers_histograms_the_step_model_stands_for_the_engine() -> None:
    model = engine_model(BASE)
    engine_ttft, _ = model(8, 1)
    assert engine_ttft == pytest.approx(BASE.step_time(8, 36, 0, 0))
    bare = HopSample(8, 1, client_ttft_s=engine_ttft + 0.03, client_decode_s=0.0)
    path = fit_serving_path([bare, bare], [], engine_model=model)
    assert path.request_s == pytest.approx(0.03)
    assert path.engine_side == "step model" and set(path.hops) == {"client_ttft", "engine"}
    assert path.stream_token_s is None and path.known() == {"request_s": path.request_s}
    with pytest.raises(ValueError, match="engine model"):
        fit_serving_path([bare], [])
    with pytest.raises(ValueError, match="short"):
        fit_serving_path([], [])


@pytest.mark.parametrize(("lost", "share"), [(0.004, 0.4), (0.0, 0.0), (0.05, 1.0), (-1.0, 0.0)])
def test_the_share_is_step_time_lost_per_cpu_second_of_other_work(
    lost: float, share: float
) -> None:
    alone = hop(http=0.01, front=0.01, engine=0.02, k=32, decode=0.3, cpu=0.01, client_cpu=0.002)
    # the API server spent 6 ms more, the client 4 ms more: 10 ms of other work
    loaded = alone._replace(engine_decode_s=0.3 + lost, frontend_cpu_s=0.016, client_cpu_s=0.006)
    path = fit_serving_path([alone], [alone], [SharePair(alone, loaded)])
    assert path.frontend_cpu_share == pytest.approx(share)  # clamped to [0, 1]
    nothing_more = alone._replace(engine_decode_s=0.4)
    unloaded = fit_serving_path([alone], [alone], [SharePair(alone, nothing_more)])
    assert unloaded.frontend_cpu_share is None


def test_metric_totals_sums_label_sets_and_skips_what_is_absent() -> None:
    text = (
        "# HELP vllm:request_queue_time_seconds ...\n"
        'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 0.25\n'
        'vllm:request_queue_time_seconds_sum{engine="1",model_name="m"} 0.5\n'
        'vllm:request_queue_time_seconds_bucket{le="0.3"} 7\n'
        "process_cpu_seconds_total 12.5\n"
        "vllm:request_prefill_time_seconds_count 3.0\n"
    )
    got = metric_totals(text)
    assert got == {
        METRICS["queue"]: 0.75,
        METRICS["cpu"]: 12.5,
        METRICS["done"]: 3.0,
    }


# ------------------------------------------------------------------ the profile fit


def test_a_measured_request_cost_is_taken_off_before_the_step_fit() -> None:
    truth = dataclasses.replace(BASE, request_s=0.03, stream_token_s=0.0005)
    outside = truth.request_s + truth.stream_token_s
    samples = [
        StepSample(q, 0, 0, 0, outside + truth.step_time(q, 0, 0, 0), 1, 1, 1)
        for q in (16, 256, 1024, 2048)
    ]
    for b in (1, 8):
        samples += [StepSample(0, 0, b, b * c, truth.step_time(0, 0, b, b * c)) for c in (64, 900)]
    known = {"request_s": 0.03, "stream_token_s": 0.0005}
    fitted = fit_profile(samples, name="f", model="m", device="d", source="s", known=known)
    assert fitted.request_s == 0.03 and fitted.stream_token_s == 0.0005
    assert fitted.step_s == pytest.approx(truth.step_s, rel=1e-6)
    assert fitted.prefill_token_s == pytest.approx(truth.prefill_token_s, rel=1e-6)
    assert fitted.fit["relative_error_max"] < 1e-6
    with pytest.raises(ValueError, match="known"):
        fit_profile(samples, name="f", model="m", device="d", source="s", known={"step_s": 1.0})


def test_profiles_without_the_terms_read_as_zero_and_bad_terms_are_refused() -> None:
    doc = BASE.to_dict()
    for key in ("frontend_request_cpu_s", "frontend_cpu_share", "request_s", "stream_token_s"):
        doc.pop(key)
    old = CostProfile.from_dict(doc)
    assert old.frontend_cpu_share == 0.0 and old.frontend_request_cpu_s == 0.0
    both = dataclasses.replace(BASE, frontend_request_cpu_s=0.01, frontend_cpu_share=0.5)
    assert CostProfile.from_dict(both.to_dict()) == both
    for bad in (1.5, -0.1, float("nan"), True):
        with pytest.raises(ProfileError, match="frontend_cpu_share"):
            dataclasses.replace(BASE, frontend_cpu_share=bad)


# ------------------------------------------------------------------ the simulator


def _reqs(n: int, gap: float, out: int = 4) -> list[SimRequest]:
    return [
        SimRequest(f"r{i}", array("I", range(1 + 50 * i, 51 + 50 * i)), out, gap * i)
        for i in range(n)
    ]


def _run(profile: CostProfile, reqs: list[SimRequest]) -> Any:
    return simulate(reqs, lambda: make_index("hash_chain", 16), 4096, profile=profile)


def test_a_front_end_sharing_the_cores_slows_the_steps_by_its_share() -> None:
    shared = dataclasses.replace(
        BASE, stream_token_s=0.0005, frontend_request_cpu_s=0.001, frontend_cpu_share=0.5
    )
    apart = dataclasses.replace(shared, frontend_cpu_share=0.0)
    reqs = _reqs(3, 0.0)
    a, b = _run(apart, reqs), _run(shared, reqs)
    # The front end keeps up (its work fits in each step): step 1 prefills the three
    # while it takes them in (3 x 1 ms, half lost); each later step loses half of the
    # 3 tokens the step before streamed (3 x 0.5 ms).
    steps = a.run.num_steps
    assert b.run.num_steps == steps == 4
    assert b.run.busy_s == pytest.approx(a.run.busy_s + 0.5 * 0.003 + (steps - 1) * 0.5 * 0.0015)
    assert b.requests[0].ttft_s == pytest.approx(a.requests[0].ttft_s + 0.0015)
    # Without the terms (the default) a profile prices steps as before.
    assert _run(BASE, reqs).run.busy_s == _run(apart, reqs).run.busy_s


@given(
    share=st.floats(0.0, 1.0),
    cpu_request=st.floats(0.0, 0.05),
    cpu_token=st.floats(0.0, 0.01),
    n=st.integers(1, 6),
    gap=st.floats(0.0, 0.02),
    out=st.integers(1, 6),
)
def test_the_front_end_slows_a_step_only_while_busy_and_at_most_by_its_share_of_it(
    share: float, cpu_request: float, cpu_token: float, n: int, gap: float, out: int
) -> None:
    served = dataclasses.replace(
        BASE, stream_token_s=cpu_token, frontend_request_cpu_s=cpu_request,
        frontend_cpu_share=share,
    )  # fmt: skip
    apart = dataclasses.replace(served, frontend_cpu_share=0.0)
    reqs = _reqs(n, gap, out)
    a, b = _run(apart, reqs), _run(served, reqs)
    plain = _run(BASE, reqs)
    # a front end on cores of its own (share 0) never slows a step, however busy
    assert a.run.busy_s == pytest.approx(plain.run.busy_s, rel=1e-12)
    if a.run.num_steps == b.run.num_steps:
        extra = b.run.busy_s - a.run.busy_s
        front_end_work = n * cpu_request + n * out * cpu_token
        # each step at most share x its own length longer, and never more than the
        # front end's work in all
        assert -1e-12 <= extra <= share * a.run.busy_s + 1e-12
        assert extra <= share * front_end_work + 1e-12
    for m in b.requests:  # a token reaches its client no sooner than it is streamed
        assert m.ttft_s >= served.request_s + BASE.step_s - 1e-12


def test_a_front_end_that_cannot_keep_up_delivers_tokens_at_its_own_pace() -> None:
    # 4 requests decoding together: a step of ~3 ms, but 10 ms of streaming a token
    slow = dataclasses.replace(BASE, stream_token_s=0.010)
    res = _run(slow, _reqs(4, 0.0, out=20))
    for m in res.requests:
        # each step's 4 tokens take the front end 40 ms: the clients see its pace
        assert m.tpot_s == pytest.approx(0.040, rel=0.05)
    # the steps themselves are not slowed (share 0): the engine's clock is its own
    assert res.run.busy_s == pytest.approx(_run(BASE, _reqs(4, 0.0, out=20)).run.busy_s)


def test_front_end_time_spent_while_the_engine_idles_costs_no_step() -> None:
    shared = dataclasses.replace(BASE, stream_token_s=0.001, frontend_cpu_share=1.0)
    apart = dataclasses.replace(shared, frontend_cpu_share=0.0)
    reqs = _reqs(2, 10.0, out=1)  # each alone: one step, then idle for seconds
    a, b = _run(apart, reqs), _run(shared, reqs)
    assert b.run.busy_s == pytest.approx(a.run.busy_s)


# ------------------------------------------------------------------ calibrate --server


class MetricsServer:
    """A completions server over httpx.MockTransport whose ``/metrics`` says what each
    request cost the engine core (fixed figures) and the API server's CPU."""

    ENGINE_TTFT = 0.004
    DECODE = 0.001
    TOKEN_GAP = 0.0002

    def __init__(self) -> None:
        self.done = 0
        self.cpu = 1.0
        self.tokens = 0

    async def __call__(self, request: Any) -> Any:
        import httpx

        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "tiny", "max_model_len": 4096}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if path == "/metrics":
            self.cpu += 0.0005
            n = self.done
            text = (
                'vllm:cache_config_info{block_size="32",num_gpu_blocks="4096"} 1.0\n'
                f"vllm:request_queue_time_seconds_sum {n * 0.001}\n"
                f"vllm:request_prefill_time_seconds_sum {n * (self.ENGINE_TTFT - 0.001)}\n"
                f"vllm:request_prefill_time_seconds_count {n}\n"
                f"vllm:request_decode_time_seconds_sum {self.tokens * self.DECODE}\n"
                f"vllm:time_to_first_token_seconds_sum {n * self.ENGINE_TTFT}\n"
                f"process_cpu_seconds_total {self.cpu}\n"
            )
            return httpx.Response(200, text=text)
        body = json.loads(request.content)
        n = body["max_tokens"]
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip

        async def stream() -> Any:
            for k in range(n):
                # tokens after the first come at least TOKEN_GAP apart, as a served
                # stream's do (a burst read is the client's stall)
                await asyncio.sleep(self.TOKEN_GAP if k else 0)
                yield b'data: {"choices": [{"text": ""}]}\n\n'
            self.done += 1
            self.tokens += n - 1
            self.cpu += 0.002 + 0.0001 * n
            yield ("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n").encode()
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=stream())


def test_calibrate_server_measures_the_serving_path_from_the_servers_metrics(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine
    from prefixkv.adapters.lab.sim.server_calibration import QUICK_SWEEP, calibrate_server

    server = MetricsServer()
    engine = ServedEngine("http://fake", transport=httpx.MockTransport(server))
    sweep = dataclasses.replace(
        QUICK_SWEEP, seed=3, serving_repeats=3, decoding_pauses_s=(0.0, 0.01)
    )
    p = calibrate_server("http://fake", sweep=sweep, engine=engine)
    path = p.fit["serving_path"]
    # the decoding requests: 3 of each pause, in turn, each streaming the long ones' tokens
    decoding = path["samples"]["decoding"]
    assert [s["idle_s"] for s in decoding] == [0.0, 0.01] * 3
    assert {s["num_tokens"] for s in decoding} == {path["samples"]["long"][0]["num_tokens"]}
    assert path["decoding_samples_kept"] == 6 and len(p.decoding_request_spread_s) == 21
    assert path["engine_side"] == "metrics"
    assert path["hops"]["engine"] == pytest.approx(MetricsServer.ENGINE_TTFT)
    assert path["hops"]["frontend"] == pytest.approx(0.0, abs=1e-12)
    # the API server's CPU: 2 ms a request and 0.1 ms a token (one read's 0.5 ms taken off)
    assert path["frontend_request_cpu_s"] == pytest.approx(0.002, rel=1e-6)
    assert path["stream_token_s"] == pytest.approx(0.0001, rel=1e-6)
    assert p.stream_token_s == path["stream_token_s"] and p.request_s == path["request_s"]
    assert p.frontend_request_cpu_s == pytest.approx(0.002, rel=1e-6)
    # the engine's decode time does not grow under load here: nothing is lost
    assert p.frontend_cpu_share == pytest.approx(0.0, abs=1e-9)
    # taking a request in: the engine's 4 ms for a lone request beyond the fitted
    # step model's price of its step
    first, _ = engine_model(p)(8, 1)
    assert p.admit_s == path["admit_s"] == pytest.approx(max(0.0, 0.004 - first))
    from prefixkv.adapters.lab.cli.calibrate import _print_fit

    _print_fit(p, Path("p.json"))
    said = capsys.readouterr().out.splitlines()
    (line,) = [x for x in said if x.startswith("serving path (engine side from metrics): ")]
    assert "stream_token_s 0.100 ms" in line and "engine 4.0 ms" in line
    assert said[-3].startswith("outside the engine, sent to an idle server: p50 ")
    assert said[-2].startswith("outside the engine, sent to a busy server: p50 ")
    assert said[-1].startswith(
        "a decoding request's first token beyond its step, sent to an idle server: p50 "
    )
    # the mock decodes at one pace: every lone decode at 1x the median
    assert said[-4].startswith("engine pace from request to request (lone decodes, x their "
                               "median): p10 1.00, p50 1.00, p90 1.00, over ")  # fmt: skip
    off = calibrate_server(
        "http://fake", sweep=dataclasses.replace(sweep, serving_repeats=0), engine=engine
    )
    assert "serving_path" not in off.fit


# ------------------------------------------------------------------ request_s and refit


def test_request_s_lies_outside_the_engines_own_time_where_the_server_says_it() -> None:
    model = engine_model(BASE)
    # vLLM's queue + prefill (5 ms) is the engine side of a request: request_s is what
    # lies outside it, with or without a step model (the model stands in only where a
    # sample lacks the server's histograms)
    short = [hop(http=0.003, front=0.002, engine=0.005)] * 3
    long = [hop(http=0.003, front=0.002, engine=0.005, k=32, decode=0.1)._replace(
        client_ttft_s=0.014)] * 3  # fmt: skip
    idle = [hop(http=0.003, front=0.002, engine=0.005)._replace(client_ttft_s=0.013)] * 3
    for path in (fit_serving_path(short, long, engine_model=model, idle=idle),
                 fit_serving_path(short, long)):  # fmt: skip
        assert path.request_s == pytest.approx(0.010 - 0.005)
        assert path.request_s_outside == "engine metrics"
        assert path.hops["client_ttft"] == pytest.approx(0.010)
        assert path.hops["client_ttft_decoding"] == pytest.approx(0.014)
        assert path.hops["engine"] == pytest.approx(0.005)
    with_model = fit_serving_path(short, long, engine_model=model, idle=idle)
    assert with_model.hops["client_ttft_after_idle"] == pytest.approx(0.013)


def calibrated_on_a_mock(seed: int, serving_repeats: int) -> CostProfile:
    """``calibrate --server``'s quick sweep against :class:`MetricsServer`."""
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine
    from prefixkv.adapters.lab.sim.server_calibration import QUICK_SWEEP, calibrate_server

    engine = ServedEngine("http://fake", transport=httpx.MockTransport(MetricsServer()))
    sweep = dataclasses.replace(QUICK_SWEEP, seed=seed, serving_repeats=serving_repeats)
    return calibrate_server("http://fake", sweep=sweep, engine=engine)


def test_the_profile_keeps_its_samples_and_refits_to_itself() -> None:
    from prefixkv.adapters.lab.sim.server_calibration import is_under_streams, refit_server_profile

    p = calibrated_on_a_mock(seed=5, serving_repeats=2)
    kept = p.fit["serving_path"]["samples"]
    # the sweep's samples but its TTFTs under streams (kept, not fitted) and the long
    # requests' decode as the engine core timed it (one shape: their median)
    under = sum(is_under_streams(StepSample(**s)) for s in p.fit["samples"])
    assert under == 1 and len(p.fit["samples"]) - under + 1 == p.fit["num_samples"]
    assert len(kept["short"]) == 2 and len(kept["idle"]) == 2 * len(IDLE_PAUSES_S)
    assert "client_ttft_after_idle" in p.fit["serving_path"]["hops"]
    # samples kept before the idle requests were sent read as none
    older = HopSamples.from_json({k: v for k, v in kept.items() if k != "idle"})
    assert older.idle == [] and len(older.short) == 2
    again = refit_server_profile(CostProfile.from_dict(json.loads(json.dumps(p.to_dict()))))
    for key in ("step_s", "decode_seq_s", "request_s", "stream_token_s", "frontend_cpu_share",
                "wake_s", "wake_after_s", "admit_s"):  # fmt: skip
        assert getattr(again, key) == pytest.approx(getattr(p, key), rel=1e-9, abs=1e-15)
    assert again.name == p.name and again.measured_on == p.measured_on


def test_a_ttft_under_streams_does_not_move_the_step_fit() -> None:
    """The client's wait for a core in a TTFT under streams (1.17 s on a 2-core CPU
    server) once set every per-token coefficient to 0; the busy table prices it."""
    from prefixkv.adapters.lab.sim.server_calibration import (
        KEPT_FIELDS,
        fit_server,
        is_under_streams,
        kept_samples,
    )

    p = calibrated_on_a_mock(seed=5, serving_repeats=2)
    samples, hops = kept_samples(p)
    stalled = [s._replace(seconds=1.17) if is_under_streams(s) else s for s in samples]
    assert stalled != samples
    described = {k: getattr(p, k) for k in KEPT_FIELDS}
    a, b = fit_server(samples, hops, **described), fit_server(stalled, hops, **described)
    assert [getattr(a, k) for k in COEFFICIENTS] == [getattr(b, k) for k in COEFFICIENTS]
    assert a.fit["num_samples"] == b.fit["num_samples"]


def test_a_profile_without_samples_refits_request_s_from_its_medians_or_says_it_cannot() -> None:
    from prefixkv.adapters.lab.sim.server_calibration import refit_server_profile
    from prefixkv.adapters.lab.sim.serving_path import PROMPT_TOKENS

    hops = {"client_ttft": 0.012, "engine": 0.006, "http": 0.003, "frontend": 0.002}
    old = dataclasses.replace(
        BASE, request_s=0.0057, fit={"serving_path": {"request_s": 0.0057, "hops": hops}}
    )
    again = refit_server_profile(old)
    assert again.request_s == pytest.approx(0.012 - 0.006)  # outside the engine's time
    no_engine = {k: v for k, v in hops.items() if k != "engine"}
    first, _ = engine_model(BASE)(PROMPT_TOKENS, 1)
    old = dataclasses.replace(old, fit={"serving_path": {"request_s": 0.0057, "hops": no_engine}})
    assert refit_server_profile(old).request_s == pytest.approx(0.012 - first)
    assert again.step_s == BASE.step_s and "no samples kept" in again.fit["refit"]
    # the first token's streaming is priced apart, not in request_s as well
    streams = dataclasses.replace(old, stream_token_s=0.0005)
    assert refit_server_profile(streams).request_s == pytest.approx(0.012 - first - 0.0005)
    for bare in (BASE, dataclasses.replace(BASE, fit={"samples": [{"seconds": 1}]})):
        with pytest.raises(ProfileError, match=r"calibrate --server again|not a step sample"):
            refit_server_profile(bare)


# ------------------------------------------------------------------ waking an idle server


def test_the_wake_cost_is_what_the_engine_core_takes_more_after_the_longest_pause() -> None:
    short = [hop(http=0.003, front=0.002, engine=0.005)] * 3  # 10 ms back to back
    pauses = ((0.05, 0.0005), (0.1, 0.001), (0.2, 0.004), (0.5, 0.005))
    # the engine core's queue + prefill grows after a pause: the step pays it
    idle = [
        hop(http=0.003, front=0.002, engine=0.005 + e)._replace(idle_s=p)
        for p, e in pauses
        for _ in range(3)
    ]
    path = fit_serving_path(short, [], idle=idle)
    assert path.wake_s == pytest.approx(0.005)
    assert path.wake_after_s == 0.2  # the first pause that costs over half of it
    assert path.hops["client_ttft_after_idle"] == pytest.approx(0.015)
    assert fit_serving_path(short, []).wake_s is None
    quicker = [s._replace(engine_ttft_s=0.004) for s in idle]  # no dearer after a pause
    calm = fit_serving_path(short, [], idle=quicker)
    assert calm.wake_s == 0.0 and calm.wake_after_s == 0.5


def test_waking_outside_the_engine_core_is_left_to_the_idle_spread_not_the_step() -> None:
    short = [hop(http=0.003, front=0.002, engine=0.005)] * 3
    # only the HTTP side grows after a pause: the engine core took no longer
    idle = [
        hop(http=0.003 + e, front=0.002, engine=0.005)._replace(idle_s=p)
        for p, e in ((0.05, 0.0), (0.5, 0.005))
        for _ in range(3)
    ]
    assert fit_serving_path(short, [], idle=idle).wake_s == 0.0
    # a server that does not say its engine side: the client's TTFT is all there is
    blind = [s._replace(engine_ttft_s=None, server_ttft_s=None) for s in idle]
    bare = [s._replace(engine_ttft_s=None, server_ttft_s=None) for s in short]
    assert fit_serving_path(bare, [], engine_model=engine_model(BASE), idle=blind).wake_s == (
        pytest.approx(0.005)
    )


def test_a_step_that_wakes_an_idle_engine_pays_the_wake_cost() -> None:
    woken = dataclasses.replace(BASE, wake_s=0.004, wake_after_s=0.1)
    sparse, dense = _reqs(3, 10.0, out=2), _reqs(3, 0.05, out=1)
    # 10 s apart: the second and third requests each wake the engine; the first comes
    # as the run starts (nothing idled)
    a, b = _run(BASE, sparse), _run(woken, sparse)
    assert [y.ttft_s - x.ttft_s for x, y in zip(a.requests, b.requests, strict=True)] == (
        pytest.approx([0.0, 0.004, 0.004])
    )
    assert b.run.busy_s == pytest.approx(a.run.busy_s + 2 * 0.004)
    # 50 ms apart, under wake_after_s: nothing to wake
    assert _run(woken, dense).run.busy_s == pytest.approx(_run(BASE, dense).run.busy_s)


@given(
    excess=st.floats(0.0, 0.02),
    step=st.floats(1e-4, 0.02),
    cpu=st.floats(0.0, 0.01),
    share=st.floats(0.0, 1.0),
)
def test_admit_s_leaves_out_the_front_ends_share_the_simulator_charges_that_step(
    excess: float, step: float, cpu: float, share: float
) -> None:
    from prefixkv.adapters.lab.sim.server_calibration import _admit_beyond_share
    from prefixkv.adapters.lab.sim.serving_path import ServingPath

    def model(prompt: int, num_tokens: int) -> tuple[float, float]:
        return step, 0.0

    lone = HopSample(8, 1, 0.02, 0.0, engine_ttft_s=step + excess)
    path = ServingPath(0.005, frontend_request_cpu_s=cpu, frontend_cpu_share=share)
    admit = _admit_beyond_share([lone], model, path)
    assert admit is not None and admit >= 0.0
    # what the simulator prices the step at beyond the step model: admit_s, and the
    # front end's share of its busy time (cpu) during the step, at most the step
    priced = admit + share * min(cpu, step + admit)
    if admit > 0:
        assert priced == pytest.approx(excess, rel=1e-9, abs=1e-12)
    else:  # nothing left to admit: the share alone covers the engine's time
        assert share * min(cpu, step) >= excess - 1e-12
    # a server that does not say its engine side: not measured
    assert _admit_beyond_share([lone._replace(engine_ttft_s=None)], model, path) is None


class OverlapServer(MetricsServer):
    """:class:`MetricsServer` that records, for each completion, its ``max_tokens``, how
    many streams were open when it came and the fewest tokens any of them had sent."""

    def __init__(self) -> None:
        super().__init__()
        self.open: dict[int, int] = {}  # stream -> tokens sent so far
        self.arrivals: list[tuple[int, int, int]] = []

    async def __call__(self, request: Any) -> Any:
        import httpx

        response = await super().__call__(request)
        if request.url.path != "/v1/completions":
            return response
        n = json.loads(request.content)["max_tokens"]
        self.arrivals.append((n, len(self.open), min(self.open.values(), default=0)))
        key = len(self.arrivals)
        self.open[key] = 0
        inner = response.stream

        async def counted() -> Any:
            async for chunk in inner:
                if b'"text"' in chunk:
                    self.open[key] += 1
                elif b"[DONE]" in chunk:
                    del self.open[key]  # the stream's end: the client reads no further
                yield chunk

        return httpx.Response(200, content=counted())


def test_each_busy_request_meets_a_young_stream_of_its_own_at_its_point() -> None:
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine
    from prefixkv.adapters.lab.sim.serving_path import (
        BUSY_BACKGROUND_TOKENS,
        BUSY_PER_REPEAT,
        busy_into,
        measure_serving_path,
    )

    server = OverlapServer()
    engine = ServedEngine("http://fake", transport=httpx.MockTransport(server))
    ids = iter(range(10**6))

    async def run() -> list[HopSample]:
        async with engine.client() as client:
            hops = await measure_serving_path(
                engine, client, lambda n: [next(ids) % 900 + 1 for _ in range(n)],
                repeats=3, long_tokens=32, idle_pauses_s=(), decoding_pauses_s=(),
            )  # fmt: skip
        return list(hops.busy)

    busy = asyncio.run(run())
    n = BUSY_PER_REPEAT * 3
    assert len(busy) == n
    # one background each, sent to a server with nothing else on it
    backgrounds = [a for a in server.arrivals if a[0] == BUSY_BACKGROUND_TOKENS]
    assert len(backgrounds) == n and all(opened == 0 for _, opened, _ in backgrounds)
    # each busy request came while its background alone streamed, once it had sent
    # the tokens its turn says
    met = [a for a in server.arrivals if a[0] == 32 and a[1] > 0]
    assert [opened for _, opened, _ in met] == [1] * n
    points = [busy_into(k, BUSY_BACKGROUND_TOKENS, 32) for k in range(n)]
    assert all(sent >= into for (_, _, sent), into in zip(met, points, strict=True))


def test_busy_requests_are_sent_at_several_points_each_ending_before_its_background() -> None:
    from prefixkv.adapters.lab.sim.serving_path import BUSY_INTO_STEPS, busy_into

    points = [busy_into(k, 96, 32) for k in range(2 * BUSY_INTO_STEPS)]
    assert points[:BUSY_INTO_STEPS] == points[BUSY_INTO_STEPS:]  # in turn
    assert len(set(points)) == BUSY_INTO_STEPS and min(points) == 1
    assert max(points) + 32 <= 96 // 2 + 32 < 96
    # a background too short to hold one still gives a point within it
    assert all(1 <= busy_into(k, 4, 32) <= 4 for k in range(BUSY_INTO_STEPS))


class ClockedServer(MetricsServer):
    """:class:`MetricsServer` noting when each ``/metrics`` read and each completion
    came (the client's monotonic clock: the same process)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int, float]] = []

    async def __call__(self, request: Any) -> Any:
        import time

        tokens = json.loads(request.content)["max_tokens"] if request.method == "POST" else 0
        self.seen.append((request.url.path, tokens, time.monotonic()))
        return await super().__call__(request)


def test_a_paused_request_is_what_wakes_the_server_not_the_metrics_read_before_it() -> None:
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine
    from prefixkv.adapters.lab.sim.serving_path import measure_serving_path

    server = ClockedServer()
    engine = ServedEngine("http://fake", transport=httpx.MockTransport(server))
    ids = iter(range(10**6))

    async def run() -> HopSamples:
        async with engine.client() as client:
            return await measure_serving_path(
                engine, client, lambda n: [next(ids) % 900 + 1 for _ in range(n)],
                repeats=1, long_tokens=16, idle_pauses_s=(0.03,), decoding_pauses_s=(0.04,),
                busy_background_tokens=0,
            )  # fmt: skip

    hops = asyncio.run(run())
    assert [s.idle_s for s in hops.idle] == [0.03] and [s.idle_s for s in hops.decoding] == [0.04]
    # the idle and the decoding request: the last two completions; between the read
    # just before each and the request itself the server idled its pause
    posts = [k for k, (path, _, _) in enumerate(server.seen) if path == "/v1/completions"]
    for k, pause in zip(posts[-2:], (0.03, 0.04), strict=True):
        assert server.seen[k - 1][0] == "/metrics"
        assert server.seen[k][2] - server.seen[k - 1][2] >= pause - 1e-3
    assert server.seen[posts[-1]][1] == 16  # the decoding request decodes on
