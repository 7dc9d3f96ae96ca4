"""benchmarks/sim_to_real.py's rate sweep: how runs become one table line a rate and
the verdict each line gets (no server: the runs are made up with known answers)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
import sim_to_real
import sim_to_real_verdict
from hypothesis import given
from hypothesis import strategies as st


def run(
    *,
    ttft: list[float],
    ttft_sim: list[float],
    tpot: list[float] | None = None,
    tpot_sim: list[float] | None = None,
    achieved: float = 1.0,
    busy: float = 0.3,
    load: tuple[float, float] = (0.2, 0.4),
) -> dict[str, Any]:
    n = len(ttft)
    return {
        "requests": n,
        "cached_exact": n,
        "load_before": load[0],
        "load_after": load[1],
        "achieved_rps": achieved,
        "utilization_sim": busy,
        "throughput_measured": 100.0,
        "throughput_sim": 95.0,
        "ttft_measured": ttft,
        "ttft_sim": ttft_sim,
        "tpot_measured": tpot if tpot is not None else [0.01] * n,
        "tpot_sim": tpot_sim if tpot_sim is not None else [0.01] * n,
    }


def test_runs_are_pooled_and_the_percentiles_compared_side_by_side() -> None:
    a = run(ttft=[0.01, 0.02, 0.03], ttft_sim=[0.01, 0.02, 0.03], load=(0.1, 0.5))
    b = run(ttft=[0.04, 0.05], ttft_sim=[0.04, 0.05], load=(0.3, 0.9), achieved=0.9)
    row = sim_to_real.summarize_rate(1.0, [a, b])
    # pooled: 10..50 ms, p50 30 ms; p90 by linear ranks: 46 ms
    assert row["ttft_p50_measured_s"] == pytest.approx(0.03)
    assert row["ttft_p90_measured_s"] == pytest.approx(0.046)
    assert row["ttft_p50_error"] == pytest.approx(0.0, abs=1e-12)
    assert (row["runs"], row["requests"], row["cached_exact"]) == (2, 5, 5)
    assert (row["load_min"], row["load_max"]) == (0.1, 0.9)
    assert row["achieved_rps"] == pytest.approx(0.95)
    assert row["verdict"] == "TTFT within 10%; TPOT within 10%"
    table = sim_to_real.sweep_table([row])
    head, rule, line = table.splitlines()
    assert head.count("|") == rule.count("|") == line.count("|")
    assert "| 1 | 0.95 | 30% | 0.10-0.90 | 2 x 2 | 5/5 | 0 | 30.0 / 30.0 | +0% |" in line


def test_the_verdict_names_what_is_off_and_says_saturated_before_it() -> None:
    low = run(ttft=[0.06] * 4, ttft_sim=[0.02] * 4, tpot_sim=[0.0115] * 4)
    row = sim_to_real.summarize_rate(1.0, [low])
    assert row["ttft_p50_error"] == pytest.approx(-2 / 3)
    assert row["verdict"] == (
        "TTFT off (p50 -67%, p90 -67%): sent to an idle server: p50 60.0 / 20.0 ms (priced "
        "as the calibration's one-token requests: its profile has no lone requests that "
        "went on decoding, which paid 2.1-2.4 ms more on a CPU vLLM); "
        "TPOT off (p50 +15%, p90 +15%): the server's steps ran faster than calibrated"
    )
    # a profile with lone decoding requests says what they took
    probed = {**low, "decoding_probe_kept": 18, "decoding_probe_p50_s": 0.0042}
    assert "sent to an idle server: p50 60.0 / 20.0 ms (their first token priced from 18 " \
        "lone decoding requests of the calibration, 4.2 ms beyond their step at p50); " in (
        sim_to_real.summarize_rate(1.0, [probed])["verdict"])  # fmt: skip
    busy = sim_to_real.summarize_rate(8.0, [run(ttft=[1.0], ttft_sim=[0.1], busy=0.95, achieved=8)])
    assert busy["verdict"].startswith("saturated (sim busy 95%, served 100% of offered)")
    behind = sim_to_real.summarize_rate(8.0, [run(ttft=[1.0], ttft_sim=[1.0], achieved=6.0)])
    assert behind["verdict"].startswith("saturated") and "served 75%" in behind["verdict"]


def test_a_ttft_off_with_the_steps_off_the_same_way_says_the_server_drifted() -> None:
    # TTFT and TPOT both 20% low: the server's steps ran slower than calibrated
    slow = run(ttft=[0.05] * 4, ttft_sim=[0.04] * 4, tpot_sim=[0.008] * 4)
    verdict = sim_to_real.summarize_rate(1.0, [slow])["verdict"]
    assert verdict.startswith(
        "TTFT off (p50 -20%, p90 -20%): the server's steps ran slower than calibrated "
        "(TPOT p50 -20%)"
    )
    fast = run(ttft=[0.05] * 4, ttft_sim=[0.06] * 4, tpot_sim=[0.012] * 4)
    assert (
        "ran faster than calibrated (TPOT p50 +20%)"
        in sim_to_real.summarize_rate(1.0, [fast])["verdict"]
    )
    # a client that stalled on over a tenth of the requests set the pace: said instead
    stalled = dict(slow, client_stalled=[True, False, False, False])
    said = sim_to_real.summarize_rate(1.0, [stalled])["verdict"]
    assert "calibrated" not in said and "the client stalled on 25% of the requests" in said
    # TPOT within 10%, or off the other way: the steps are no reason
    for tpot in (0.0095, 0.012):
        other = run(ttft=[0.05] * 4, ttft_sim=[0.04] * 4, tpot_sim=[tpot] * 4)
        assert "than calibrated (" not in sim_to_real.summarize_rate(1.0, [other])["verdict"]


def test_a_low_p90_made_of_requests_sent_while_another_ran_is_said_so() -> None:
    # 10 requests; the two slowest were sent while another ran and took 60 ms, where the
    # simulator said 20 ms; the rest are exact
    ttft = [0.015] * 8 + [0.06, 0.06]
    r = run(ttft=ttft, ttft_sim=[0.015] * 8 + [0.02, 0.02])
    r["busy"] = [False] * 8 + [True, True]
    verdict = sim_to_real.summarize_rate(1.0, [r])["verdict"]
    assert verdict.startswith("TTFT off (p90 -67%): 2 of the 2 slowest were sent while another")
    assert "took 60.0 ms at p90, simulated 20.0 ms" in verdict
    # the same slow requests sent to an idle server: no busy tail is named
    r["busy"] = [True] * 8 + [False, False]
    assert "while another" not in sim_to_real.summarize_rate(1.0, [r])["verdict"]


def test_the_busy_tail_says_what_calibration_showed_and_the_busy_wait_where_known() -> None:
    ttft = [0.015] * 8 + [0.06, 0.06]
    r = run(ttft=ttft, ttft_sim=[0.015] * 8 + [0.02, 0.02])
    r["busy"] = [False] * 8 + [True, True]

    def said(**probe: Any) -> str:
        return str(sim_to_real.summarize_rate(1.0, [{**r, **probe}])["verdict"])

    assert "a tail the calibration's busy requests did not show" in said()
    assert "decoded one token, which shows no such tail; calibrate again" in said(
        busy_probe_tokens=1
    )
    streamed = said(busy_probe_tokens=32, busy_probe_p90_s=0.045)
    assert "busy requests, streaming 32 tokens, spent 45.0 ms outside the engine core" in streamed
    assert "busy-wait" not in streamed and "in one burst" not in streamed
    held = said(busy_probe_tokens=32, busy_probe_p90_s=0.045, busy_probe_bursts=7)
    assert "at p90; 7 more were read in one burst, left out as a sweep's are" in held
    waited = said(busy_probe_tokens=32, busy_probe_p90_s=0.045, busy_wait=True)
    assert "at p90) - " + sim_to_real_verdict.BUSY_WAIT + "; TPOT within 10%" in waited
    # no busy tail, no mechanism named, whatever the log says
    r["busy"] = [True] * 8 + [False, False]
    assert "busy-wait" not in said(busy_wait=True)


def test_the_busy_wait_is_read_from_a_cpu_servers_log(tmp_path: Any) -> None:
    log = tmp_path / "server.log"
    assert not sim_to_real.server_busy_waits(log)  # no log
    log.write_text(
        "(EngineCore pid=1) INFO [ompmultiprocessing.py:185] OpenMP thread binding info:\n"
        "(EngineCore pid=1) INFO [ompmultiprocessing.py:185] \treserved_cpus=[1]\n"
    )
    assert sim_to_real.server_busy_waits(log)
    log.write_text("(EngineCore pid=1) INFO [core.py:1] a GPU server\n")
    assert not sim_to_real.server_busy_waits(log)
    # threads bound, no core reserved for the rest: not the set-up measured
    log.write_text("(EngineCore pid=1) INFO OpenMP thread binding info:\n\tcore ids=[0, 1]\n")
    assert not sim_to_real.server_busy_waits(log)


def test_bursts_are_counted_apart_and_said_to_be_the_servers_where_it_busy_waits() -> None:
    late = sim_to_real.Measured(0.02, 0.005, 0.5, 97, 0, 97)
    burst = sim_to_real.Measured(0.3, 1e-6, 0.3001, 97, 0, 97)
    assert sim_to_real.read_in_burst(burst) and not sim_to_real.read_in_burst(late)
    r = run(ttft=[0.02] * 4, ttft_sim=[0.02] * 4)
    r["client_stalled"] = [True, True, False, False]
    r["read_in_burst"] = [False, True, False, False]
    row = sim_to_real.summarize_rate(1.0, [r])
    assert row["client_stalls"] == 2 and row["client_bursts"] == 1
    assert row["verdict"].endswith("client stalled on 2 (left out)")
    said = sim_to_real.summarize_rate(1.0, [{**r, "busy_wait": True}])["verdict"]
    assert said.endswith(
        "client stalled on 2 (left out); 1 of them read in one burst, on this server "
        "mostly the busy-wait's stall, not the client's"
    )
    # over a tenth stalled, most in a burst: the verdict says so once, not "the client"
    slow = run(ttft=[0.02] * 9 + [0.2], ttft_sim=[0.02] * 10)
    slow.update(client_stalled=[True] * 3 + [False] * 7, busy_wait=True,
                read_in_burst=[True, True] + [False] * 8)  # fmt: skip
    said = sim_to_real.summarize_rate(1.0, [slow])["verdict"]
    assert "- 30% of the requests were sent late or read in one burst, 2 of 3 in a burst (" in said
    assert said.count("busy-wait's stall") == 1 and "the client stalled on 30%" not in said
    slow["read_in_burst"] = [True] + [False] * 9  # most were sent late: the client's
    assert "the client stalled on 30%" in sim_to_real.summarize_rate(1.0, [slow])["verdict"]


def test_a_runs_profile_says_what_its_busy_requests_decoded() -> None:
    import dataclasses

    from prefixkv.adapters.lab.sim import CostProfile
    from prefixkv.adapters.lab.sim.serving_spread import quantile_table

    base = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7)
    assert sim_to_real.busy_probe(base)["busy_probe_tokens"] == 0
    assert math.isnan(sim_to_real.busy_probe(base)["busy_probe_p90_s"])
    table = quantile_table([0.0, 0.1])
    older = dataclasses.replace(
        base, busy_request_spread_s=table, fit={"serving_path": {"busy_samples_kept": 9}}
    )
    said = sim_to_real.busy_probe(older)
    assert math.isnan(said.pop("decoding_probe_p50_s"))  # made before they were sent
    assert said == {
        "busy_probe_tokens": 1,
        "busy_probe_p90_s": pytest.approx(table[18]),
        "busy_probe_bursts": 0,
        "decoding_probe_kept": 0,
    }
    newer = dataclasses.replace(
        older,
        fit={"serving_path": {"busy_samples_kept": 9, "busy_tokens": 32, "busy_bursts": 4}},
    )
    assert sim_to_real.busy_probe(newer)["busy_probe_tokens"] == 32
    assert sim_to_real.busy_probe(newer)["busy_probe_bursts"] == 4
    lone = dataclasses.replace(
        newer,
        decoding_request_spread_s=table,
        fit={"serving_path": {"decoding_samples_kept": 17}},
    )
    said = sim_to_real.busy_probe(lone)
    assert said["decoding_probe_kept"] == 17
    assert said["decoding_probe_p50_s"] == pytest.approx(table[10])


def test_a_tpot_p90_off_beyond_its_p50_says_how_the_pace_varies() -> None:
    tpot = [0.004] * 8 + [0.008, 0.008]
    r = run(ttft=[0.02] * 10, ttft_sim=[0.02] * 10, tpot=tpot, tpot_sim=[0.004] * 10)
    verdict = sim_to_real.summarize_rate(1.0, [r])["verdict"]
    assert verdict == (
        "TTFT within 10%; TPOT off (p90 -50%): the pace varies from request to request: "
        "TPOT p90 / p50 2.00 measured, 1.00 simulated"
    )
    # the steps 20% slow besides: both are said
    both = dict(r, tpot_sim=[0.0032] * 10)
    verdict = sim_to_real.summarize_rate(1.0, [both])["verdict"]
    assert "ran slower than calibrated; the pace varies" in verdict


def test_one_token_outputs_leave_tpot_empty_not_wrong() -> None:
    nan = math.nan
    row = sim_to_real.summarize_rate(
        0.5, [run(ttft=[0.02, 0.02], ttft_sim=[0.02, 0.02], tpot=[nan, nan], tpot_sim=[nan, nan])]
    )
    assert math.isnan(row["tpot_p50_measured_s"])
    assert row["verdict"] == "TTFT within 10%; TPOT within 10%"
    line = sim_to_real.sweep_table([row]).splitlines()[-1]
    assert "| - / - | - |" in line


@pytest.mark.parametrize("text", ["1,x", "0,1", "2,1", "1,1", "-1", "inf", ""])
def test_bad_rates_are_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        sim_to_real.parse_rates(text)
    assert sim_to_real.parse_rates("0.5,1,16") == [0.5, 1.0, 16.0]


def test_requests_the_client_stalled_on_are_counted_and_left_out() -> None:
    # the third request's stream was read in one burst, 2 s late: the client's stall
    r = run(ttft=[0.02, 0.02, 2.0, 0.02], ttft_sim=[0.02] * 4, tpot=[0.01, 0.01, 3e-5, 0.01])
    r["client_stalled"] = [False, False, True, False]
    row = sim_to_real.summarize_rate(1.0, [r])
    assert row["client_stalls"] == 1 and row["ttft_p90_error"] == pytest.approx(0.0)
    assert row["verdict"] == "TTFT within 10%; TPOT within 10%; client stalled on 1 (left out)"
    assert "| 4/4 | 1 |" in sim_to_real.sweep_table([row])


def test_a_late_send_or_a_burst_read_is_the_clients_stall() -> None:
    m = sim_to_real.Measured(0.02, 0.005, 0.02 + 9 * 0.005, 10, 0)
    stalled = sim_to_real.client_stalled
    assert not stalled(1.0, 1.001, m)
    assert stalled(1.0, 1.0 + sim_to_real.CLIENT_LATE_S + 1e-3, m)
    assert stalled(1.0, 1.0, m._replace(tpot_s=2e-5, latency_s=0.02 + 9 * 2e-5))
    one = m._replace(tokens=1, tpot_s=math.nan)  # one token: no gaps to read in a burst
    assert not stalled(1.0, 1.0, one)
    # ten tokens in ten chunks read at once: the client's; merged into one chunk by a
    # server that fell behind: the server's own time
    burst = m._replace(tpot_s=2e-5, latency_s=0.02 + 9 * 2e-5)
    assert stalled(1.0, 1.0, burst._replace(chunks=10))
    assert not stalled(1.0, 1.0, burst._replace(chunks=1, tpot_s=0.0, latency_s=0.02))


@given(
    st.lists(
        st.tuples(st.floats(0, 10, allow_nan=False), st.floats(0, 3, allow_nan=False)),
        max_size=30,
    )
)
def test_busy_at_send_is_another_request_running_when_one_was_sent(
    reqs: list[tuple[float, float]],
) -> None:
    sent = [s for s, _ in reqs]
    latency = [t for _, t in reqs]
    got = sim_to_real_verdict.busy_at_send(sent, latency)
    for k, (s, _) in enumerate(reqs):
        running = any(
            j != k and (sent[j], j) < (s, k) and sent[j] + latency[j] > s for j in range(len(reqs))
        )
        assert got[k] == running
