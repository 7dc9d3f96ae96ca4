"""``prefixkv cluster`` sized for your model and GPU, with requests refused for their
length as vLLM refuses them, a request-rate sweep with goodput under an SLO, and the
sweep's walk over rates (shared with ``compare``) checked as a property."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import pytest
from helpers import results_doc, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim.load import LoadSummary
from prefixkv.adapters.lab.sim.rate_sweep import (
    MAX_AUTO_RATES,
    rate_schedule,
    saturation_of,
    sweep_rates,
)
from prefixkv.adapters.lab.workloads import load_workloads

SMALL = ("--replicas", "2", "--policies", "round_robin,dynamo", "--no-plots", "--quiet")


def _runs(out: Path) -> list[dict[str, str]]:
    with (out / "runs.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------ the walk over rates


def _load(overloaded: bool, goodput: float | None = None) -> LoadSummary:
    return LoadSummary(10, 1.0, 1.0, 1.0, 0.0, overloaded, goodput=goodput)


@given(
    st.dictionaries(st.sampled_from("abcd"), st.integers(0, 12), min_size=1),
    st.sampled_from([0.25, 1.0, 3.0]),
    st.sets(st.integers(0, MAX_AUTO_RATES - 1), max_size=3),
)
@settings(max_examples=100, deadline=None)
def test_auto_runs_rising_rates_and_stops_each_key_at_its_first_overload_or_ten_rates(
    first_hot: dict[str, int], start: float, skipped: set[int]
) -> None:
    # key k overloads from the first_hot[k]-th rate on; some points cannot run (None)
    rates = rate_schedule(start, auto=True)
    assert len(rates) == MAX_AUTO_RATES and rates[0] == start
    assert all(b == 2 * a for a, b in itertools.pairwise(rates))

    def run(key: str, rate: float) -> tuple[str, float, bool] | None:
        k = rates.index(rate)
        if k in skipped:
            return None
        return key, rate, k >= first_hot[key]

    keys = sorted(first_hot)
    ran = list(sweep_rates(keys, rates, run, lambda r: r[2], auto=True))
    for key in keys:
        got = [r[1] for r in ran if r[0] == key]
        expected = []
        for k, rate in enumerate(rates):
            if k in skipped:
                continue
            expected.append(rate)
            if k >= first_hot[key]:
                break  # the first overloaded rate is the last
        assert got == expected == sorted(got) and len(got) <= MAX_AUTO_RATES


def test_listed_rates_all_run_and_done_runs_count_without_running_again() -> None:
    assert rate_schedule(4.0, [1.0, 2.0, 4.0]) == [1.0, 2.0, 4.0]
    calls: list[tuple[str, float]] = []

    def run(key: str, rate: float) -> tuple[str, float]:
        calls.append((key, rate))
        return key, rate

    done = {("a", 2.0): ("a", 2.0)}
    listed = list(sweep_rates(["a", "b"], [1.0, 2.0, 8.0], run, lambda r: r[1] >= 2, done=done))
    assert ("a", 2.0) not in calls and len(listed) == 5  # listed: nothing stops
    auto = list(sweep_rates(["a"], [1.0, 2.0, 8.0], run, lambda r: r[1] >= 2, auto=True, done=done))
    assert auto == [("a", 1.0)]  # the done run at 2 was overloaded: 8 is never tried


def test_saturation_reads_the_highest_rate_served_and_the_best_goodput() -> None:
    (s,) = saturation_of(
        [("p", 4.0, _load(True, 1.0)), ("p", 1.0, _load(False, 0.9)),
         ("p", 2.0, _load(False, 1.8))]
    )  # fmt: skip
    assert (s.sustained_rate, s.overloaded_rate, s.best_goodput_rate) == (2.0, 4.0, 2.0)
    assert s.describe().startswith("p: served up to 2 req/s offered without overload")


# ------------------------------------------------------------- your model and your GPU


def test_cluster_sizes_each_replica_for_the_model_and_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "cluster", "--workload", "multi_turn", "--max-requests", "30",
        "--model-config", "llama-3-8b", "--gpu-memory", "80", "--capacity-tokens", "auto",
        *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert {r["capacity_tokens"] for r in _runs(tmp_path)} == {"467291"}  # as compare's
    assert out.startswith("capacity: meta-llama/Meta-Llama-3-8B") and "pool 467,291" in out
    doc = results_doc(tmp_path)
    assert doc["settings"]["capacity_model"].startswith("meta-llama/Meta-Llama-3-8B")
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "- model and GPU: meta-llama/Meta-Llama-3-8B" in report


@pytest.mark.parametrize(
    ("argv", "fault"),
    [
        (["--model-config", "nope"], "no model config 'nope'"),
        (["--model-config", "llama-3-8b", "--capacity-tokens", "auto"], "needs --gpu-memory"),
        (["--tensor-parallel-size", "2"], "need --model-config or --gpu-memory"),
        (["--max-model-len", "0"], "--max-model-len"),
        (["--request-rate", "1,1"], "distinct request rates"),
        (["--slo-ttft", "-5"], "--slo-ttft"),
    ],
)
def test_bad_model_and_load_flags_are_one_line(
    argv: list[str], fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, "cluster", *argv, *SMALL, "--out", str(tmp_path / "x"))
    assert code == 2 and fault in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_long_requests_are_rejected_and_counted_or_abort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (w,) = load_workloads(["multi_turn"], None, max_requests=40)
    sizes = sorted(len(r.tokens) + len(r.output) for r in w.requests)
    limit = sizes[-3]  # exactly at the limit: admitted; one token over: rejected
    too_long = [r for r in w.requests if len(r.tokens) + len(r.output) > limit]
    assert 1 <= len(too_long) <= 2
    code, out, err = run_cli(
        capsys, "cluster", "--workload", "multi_turn", "--max-requests", "40",
        "--max-model-len", str(limit), *SMALL, "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert code == 0, err
    for run in _runs(tmp_path / "a"):
        assert int(run["num_requests"]) + len(too_long) == 40  # served + rejected == sent
    doc = results_doc(tmp_path / "a")
    assert doc["settings"]["rejected_requests"] == len(too_long)
    assert f"max_model_len {limit:,}" in doc["settings"]["admission"]
    assert f"{len(too_long)} of 40 requests rejected before scheduling" in out
    report = (tmp_path / "a" / "report.md").read_text(encoding="utf-8")
    assert f"{len(too_long)} of 40 requests rejected" in report and too_long[0].id in report
    code, _, err = run_cli(
        capsys, "cluster", "--workload", "multi_turn", "--max-requests", "40",
        "--max-model-len", str(limit), "--on-long-request", "abort", *SMALL,
        "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert code == 2 and f"request {too_long[0].id!r} is too long" in err
    assert not (tmp_path / "b").exists()


def test_a_request_longer_than_the_smallest_pool_is_rejected_not_an_abort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (w,) = load_workloads(["long_document"], None, max_requests=20)
    cap = w.stats.largest[0] - 64  # the largest request cannot fit one replica alone
    code, out, err = run_cli(
        capsys, "cluster", "--workload", "long_document", "--max-requests", "20",
        "--capacity-tokens", f"{cap},{4 * cap}", *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert f"alone in the KV pool (capacity {cap:,} tokens)" in out
    runs = _runs(tmp_path)
    assert {int(r["num_requests"]) for r in runs} == {20 - results_doc(tmp_path)["settings"][
        "rejected_requests"]} != {20}  # fmt: skip


# ------------------------------------------------------------- rates, overload, goodput


def test_cluster_sweeps_listed_rates_with_goodput_and_says_overloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "cluster", "--workload", "multi_turn", "--max-requests", "120", "--open-loop",
        "--capacity-tokens", "64k", "--request-rate", "0.5,64", "--slo-ttft", "1s",
        "--slo-tpot", "200", "--replicas", "2", "--policies", "round_robin,dynamo",
        "--no-plots", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    runs = _runs(tmp_path)
    by = {(r["policy"], float(r["request_rate"])): r for r in runs}
    assert set(by) == {(p, x) for p in ("round_robin", "dynamo") for x in (0.5, 64.0)}
    for (_, rate), r in by.items():
        assert r["role"] == ("table" if rate == 0.5 else "rate")
        assert r["overloaded"] == ("True" if rate == 64 else "False")
        assert float(r["goodput"]) <= float(r["achieved_rate"]) <= float(r["offered_rate"])
        assert r["slo"] == "TTFT <= 1000 ms, TPOT <= 200 ms"
    assert "overloaded (queues grow without bound" in out and "not overloaded" in out
    report = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Load and the request-rate sweep at 2 replicas" in report
    assert "- round_robin: served up to 0.5 req/s offered without overload" in report
    assert "overloaded from 64 req/s" in report and "- SLO: TTFT <= 1000 ms" in report
    table = report.split("## Policies at", 1)[1].split("##", 1)[0]
    assert table.count("| round_robin |") == 1  # the sweep's runs stay out of the policy table


def test_cluster_auto_doubles_until_each_policy_is_overloaded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(
        capsys, "cluster", "--workload", "multi_turn", "--max-requests", "120", "--open-loop",
        "--capacity-tokens", "64k", "--request-rate", "auto", *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    runs = _runs(tmp_path)
    for policy in ("round_robin", "dynamo"):
        mine = sorted(
            (r for r in runs if r["policy"] == policy), key=lambda r: float(r["request_rate"])
        )
        rates = [float(r["request_rate"]) for r in mine]
        assert all(b == 2 * a for a, b in itertools.pairwise(rates))
        assert math.log2(rates[0] / 2).is_integer()  # 2 replicas x a power of two
        hot = [r["overloaded"] == "True" for r in mine]
        assert hot == [False] * (len(mine) - 1) + [True] or (
            len(mine) == MAX_AUTO_RATES and not any(hot)
        )
    assert "doubling until each policy is overloaded" in (tmp_path / "report.md").read_text()


def test_closed_loop_cluster_runs_say_what_the_sessions_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "cluster", "--workload", "multi_turn", "--max-requests", "60",
        "--capacity-tokens", "64k", "--request-rate", "16", "--replicas", "2",
        "--policies", "round_robin", "--no-plots", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    (run,) = _runs(tmp_path)
    assert run["closed_loop"] == "True"
    assert float(run["sent_rate"]) < float(run["offered_rate"]) / 1.1
    assert "closed loop, sessions sent" in out
    assert "held back" in (tmp_path / "report.md").read_text(encoding="utf-8")
