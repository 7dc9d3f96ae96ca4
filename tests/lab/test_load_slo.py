"""Overload said out loud, rate sweeps and goodput: the load rule on hand-made records
(known answers and properties), and ``compare --request-rate`` sweeps end to end."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from helpers import results_doc, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim.errors import SimSettingsError
from prefixkv.adapters.lab.sim.load import (
    MIN_REQUESTS,
    LoadSummary,
    Slo,
    least_squares_slope,
    summarize_load,
)
from prefixkv.adapters.lab.sim.metrics import RequestRow

SMALL = ("--timing-repeats", "0", "-q", "--no-plots", "--index", "hash_chain")


_run = run_cli
_doc = results_doc


def _queue(n: int, gap: float, service: float, outputs: int = 4) -> list[RequestRow]:
    """A single server, one request at a time: arrivals every ``gap`` s, each taking
    ``service`` s to its first token and ``service`` more to its last."""
    recs, free = [], 0.0
    for k in range(n):
        arrival = k * gap
        start = max(arrival, free)
        free = start + 2 * service
        recs.append(
            RequestRow(f"r{k}", arrival, 10, outputs, start, start + service, start + 2 * service)
        )
    return recs


# ------------------------------------------------------------------------- the rule


def test_a_queue_served_faster_than_it_is_offered_is_not_overloaded() -> None:
    load = summarize_load(_queue(200, gap=1.0, service=0.3))
    assert load.offered_rate == pytest.approx(200 / 199)
    assert load.achieved_rate == pytest.approx(200 / (199 + 0.6))
    assert load.waiting_growth == pytest.approx(0.0)
    assert not load.overloaded
    assert load.verdict().endswith("not overloaded")


def test_a_queue_offered_twice_what_it_serves_is_overloaded_with_the_right_trend() -> None:
    # lambda = 1/s, mu = 1/(2 x 1 s) = 0.5/s: waiting grows lambda / mu - 1 = 1 s per s
    load = summarize_load(_queue(200, gap=1.0, service=1.0))
    assert load.overloaded
    assert load.waiting_growth == pytest.approx(1.0, rel=0.02)
    assert load.achieved_rate == pytest.approx(0.5, rel=0.02)
    assert "overloaded (queues grow without bound" in load.verdict()


def test_a_short_run_with_a_long_tail_is_not_called_overloaded() -> None:
    # 10 requests 1 s apart, each 5 s long but with room: achieved << offered, no trend
    recs = [RequestRow(f"r{k}", k, 10, 4, k, k + 2.5, k + 5.0) for k in range(10)]
    load = summarize_load(recs)
    assert load.achieved_rate < load.offered_rate / 1.1
    assert not load.overloaded


def test_too_few_requests_are_never_overloaded() -> None:
    recs = _queue(MIN_REQUESTS - 1, gap=1.0, service=5.0)
    assert not summarize_load(recs).overloaded
    assert summarize_load(_queue(MIN_REQUESTS * 4, gap=1.0, service=5.0)).overloaded


def test_closed_loop_says_what_the_sessions_held_the_rate_to() -> None:
    recs = _queue(50, gap=4.0, service=0.3)  # sent every 4 s although 1 s was asked
    load = summarize_load(recs, offered_arrivals=[float(k) for k in range(50)], closed_loop=True)
    assert load.offered_rate == pytest.approx(50 / 49)
    assert load.sent_rate == pytest.approx(50 / 196)
    assert not load.overloaded and "closed loop, sessions sent" in load.verdict()


def test_goodput_counts_requests_meeting_every_bound_as_vllm_bench_serve() -> None:
    recs = [
        RequestRow("fast", 0.0, 10, 5, 0.0, 0.1, 0.5),  # TTFT 0.1, TPOT 0.1
        RequestRow("slow-ttft", 1.0, 10, 5, 1.0, 2.0, 2.4),  # TTFT 1.0
        RequestRow("slow-tpot", 2.0, 10, 5, 2.0, 2.1, 4.1),  # TPOT 0.5
        RequestRow("one-token", 3.0, 10, 1, 3.0, 3.2, 3.2),  # TPOT counts as 0
    ]
    slo = Slo(ttft_s=0.5, tpot_s=0.2)
    assert [slo.met(r) for r in recs] == [True, False, False, True]
    load = summarize_load(recs, slo=slo)
    assert load.good_requests == 2
    assert load.goodput == pytest.approx(2 / 4.1)  # first arrival to last finish
    assert slo.describe() == "TTFT <= 500 ms, TPOT <= 200 ms"
    with pytest.raises(SimSettingsError):
        Slo()
    with pytest.raises(SimSettingsError, match="ttft_s"):
        Slo(ttft_s=math.nan)


def test_least_squares_slope_known_answers() -> None:
    assert least_squares_slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert math.isnan(least_squares_slope([1.0], [2.0]))
    assert math.isnan(least_squares_slope([1.0, 1.0], [2.0, 3.0]))


@st.composite
def _records(draw: st.DrawFn) -> tuple[list[RequestRow], list[float]]:
    n = draw(st.integers(2, 40))
    gaps = draw(st.lists(st.floats(0.001, 5.0), min_size=n, max_size=n))
    asked, t = [], 0.0
    for g in gaps:
        t += g
        asked.append(t)
    recs = []
    for k, a in enumerate(asked):
        delay = draw(st.floats(0.0, 3.0))  # closed loop: sent no earlier than asked
        sent = a + delay if k else a
        wait = draw(st.floats(0.0, 10.0))
        ttft = draw(st.floats(0.001, 5.0))
        rest = draw(st.floats(0.0, 5.0))
        out = draw(st.integers(1, 50))
        recs.append(
            RequestRow(
                f"r{k}", sent, 10, out, sent + wait, sent + wait + ttft, sent + wait + ttft + rest
            )
        )
    return recs, asked


@given(_records(), st.floats(0.01, 10.0), st.floats(0.001, 1.0))
@settings(max_examples=200, deadline=None)
def test_goodput_at_most_achieved_at_most_sent_at_most_offered(
    case: tuple[list[RequestRow], list[float]], ttft: float, tpot: float
) -> None:
    recs, asked = case
    load = summarize_load(recs, offered_arrivals=asked, slo=Slo(ttft_s=ttft, tpot_s=tpot))
    assert load.goodput is not None
    assert load.goodput <= load.achieved_rate <= load.sent_rate * (1 + 1e-9)
    assert load.sent_rate <= load.offered_rate * (1 + 1e-9)
    assert load.overloaded <= (load.num_requests >= MIN_REQUESTS)


# --------------------------------------------------------------------------- the CLI


def test_compare_sweeps_listed_rates_with_goodput_and_says_overloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "120", "--open-loop",
        "--request-rate", "0.5,32", "--slo-ttft", "1s", "--slo-tpot", "200", *SMALL,
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    doc = _doc(tmp_path)
    runs = {r["request_rate"]: r for r in doc["runs"] if r["schedule"] == "arrival"}
    assert set(runs) == {0.5, 32}
    assert runs[0.5]["role"] == "table" and runs[32]["role"] == "rate"
    assert not runs[0.5]["overloaded"] and runs[32]["overloaded"]
    for r in runs.values():
        assert r["goodput"] <= r["achieved_rate"] <= r["offered_rate"]
        assert r["slo"] == "TTFT <= 1000 ms, TPOT <= 200 ms"
    assert "request-rate sweep" in out and "OVERLOADED" in out
    assert "saturation: hash_chain as vllm: served up to 0.5 req/s offered" in out
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Request-rate sweep at the table's capacity" in report
    requests = [r for r in _rows(tmp_path / "requests.csv") if r["schedule"] == "arrival"]
    assert {r["meets_slo"] for r in requests} <= {"True", "False"}


def _rows(path: Path) -> list[dict[str, str]]:
    import csv

    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_an_overloaded_table_run_is_said_on_the_console_and_in_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "120", "--open-loop",
        "--request-rate", "32", *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    assert "load: multi_turn, hash_chain as vllm: offered" in out and "overloaded (" in out
    assert "**Load.**" in (tmp_path / "report.md").read_text(encoding="utf-8")


def test_auto_doubles_until_overloaded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "120", "--open-loop",
        "--request-rate", "auto", *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    runs = sorted(
        (r for r in _doc(tmp_path)["runs"] if r["schedule"] == "arrival"),
        key=lambda r: r["request_rate"],
    )
    rates = [r["request_rate"] for r in runs]
    assert all(b == 2 * a for a, b in itertools.pairwise(rates))
    assert math.log2(rates[0]).is_integer()
    assert [r["overloaded"] for r in runs] == [False] * (len(runs) - 1) + [True]
    assert "doubling until overloaded" in out


def test_closed_loop_sessions_say_their_achieved_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "120", "--request-rate", "16",
        *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0
    (run,) = [r for r in _doc(tmp_path)["runs"] if r["schedule"] == "arrival"]
    assert run["closed_loop"] and run["sent_rate"] < run["offered_rate"] / 1.1
    assert "closed loop, sessions sent" in out


def test_the_python_api_sweeps_rates_with_an_slo() -> None:
    from prefixkv.adapters.lab.compare import CompareOptions, compare_backends

    t = compare_backends(
        CompareOptions(
            ["multi_turn"], indexes="hash_chain", max_requests=60, timing_repeats=0,
            request_rate=1.0, rate_sweep=[4.0], slo=Slo(ttft_s=0.5), closed_loop=False,
        )
    )  # fmt: skip
    runs = t.comparison.workloads[0].arrival_runs
    assert [(r.labels["role"], r.labels["request_rate"]) for r in runs] == [
        ("table", 1.0),
        ("rate", 4.0),
    ]
    assert all(r.part(LoadSummary).goodput is not None for r in runs)
    with pytest.raises(SimSettingsError, match="rate_sweep"):
        compare_backends(CompareOptions(["seed"], request_rate=1.0, rate_sweep="fast"))
