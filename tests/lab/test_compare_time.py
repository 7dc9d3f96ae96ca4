"""``prefixkv compare`` at arrival time, its analysable outputs, the DataFrame API,
``prefixkv calibrate``, and ``make report`` (tiny sizes throughout)."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, TEST_DATA, interrupt_after, results_doc, run_cli

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.compare import CompareError, CompareOptions, compare_backends
from prefixkv.adapters.lab.compare import run as run_module
from prefixkv.adapters.lab.sim import load_profile

MOONCAKE_HEAD = TEST_DATA / "fidelity" / "mooncake_conversation_head.jsonl"
KVCT = TEST_DATA / "traces" / "kv_cache_tester"


_run = run_cli
_doc = results_doc


def _rows(out: Path, name: str = "requests.csv") -> list[dict[str, str]]:
    with (out / name).open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _arrival_runs(doc: dict[str, Any], role: str = "table") -> dict[tuple[str, str], Any]:
    return {
        (r["workload"], r["backend"]): r
        for r in doc["runs"]
        if r["schedule"] == "arrival" and r["role"] == role
    }


def _error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("prefixkv: error: "), err
    return lines[0]


SMALL = ("--max-requests", "30", "--timing-repeats", "0", "-q", "--no-plots")


@pytest.fixture(scope="module")
def rated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One run with a request rate on two built-in workloads, shared by several tests."""
    out = tmp_path_factory.mktemp("rated")
    code = main(["compare", "-w", "multi_turn", "few_shot", "--request-rate", "4", *SMALL,
                 "--out", str(out)])  # fmt: skip
    assert code == 0
    return out, (out / "report.md").read_text(encoding="utf-8")


def test_request_rate_reports_ttft_next_to_the_k_live_table(
    rated: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    out, md = rated
    doc = _doc(out)
    runs = _arrival_runs(doc)
    assert set(runs) == {
        (w, b) for w in ("multi_turn", "few_shot") for b in ("hash_chain", "radix", "none")
    }
    # One scheduler for every backend by default: only the index varies.
    engines = {b: (r["engine"], r["batching"], r["policy"]) for (_, b), r in runs.items()}
    assert engines == dict.fromkeys(("hash_chain", "radix", "none"), ("vllm", "mixed", "fcfs"))
    assert {r["varied"] for r in runs.values()} == {"index"}
    for (_, b), r in runs.items():
        assert r["num_requests"] == 30 and r["arrivals"] == "Poisson, 4 req/s (seed 0)"
        assert 0 < r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"]
        assert r["queueing_mean_s"] >= 0 and r["request_throughput"] > 0
        assert r["prefill_gpu_s"] > 0 and r["profile"] == "llama2-70b-tp2-a100"
        if b == "none":
            assert r["hit_ratio"] == 0 and r["saved_gpu_s"] == 0
        else:
            assert r["hit_ratio"] > 0.3 and r["saved_gpu_s"] > 0
    assert doc["config"]["engines"] == [
        "hash_chain: vLLM-style (mixed batching, fcfs queue)",
        "radix: vLLM-style (mixed batching, fcfs queue)",
        "none: vLLM-style (mixed batching, fcfs queue)",
    ]
    assert "### multi_turn at arrival time" in md and "TTFT p50/p90/p99" in md
    assert "radix as vllm (mixed batching, fcfs)" in md
    assert "Index axis, scheduler held at vLLM-style (mixed batching, fcfs queue)" in md


def test_tidy_csv_loads_one_row_per_request_and_json_normalizes_flat(
    rated: tuple[Path, str],
) -> None:
    pandas = pytest.importorskip("pandas")
    out, _ = rated
    df = pandas.read_csv(out / "requests.csv")
    keys = ["workload", "schedule", "role", "backend", "capacity_tokens"]
    sizes = df.groupby(keys).size()
    assert len(sizes) == 2 * 2 * 3 and set(sizes) == {30}  # workload x schedule x backend
    for _, group in df.groupby(keys):
        assert group["request_id"].is_unique
        assert list(group["position"]) == list(range(30))
    arrival = df[df["schedule"] == "arrival"]
    assert (arrival["ttft_s"] >= arrival["queueing_delay_s"]).all()
    assert (
        arrival["hit_tokens"] + arrival["uncached_prefill_tokens"] == arrival["prompt_tokens"]
    ).all()
    radix = arrival[(arrival["backend"] == "radix") & (arrival["workload"] == "few_shot")]
    run = _arrival_runs(_doc(out))[("few_shot", "radix")]
    assert radix["ttft_s"].median() == pytest.approx(run["ttft_p50_s"])
    assert int(radix["hit_tokens"].sum()) == run["hit_tokens"]
    # results.json: json_normalize gives one column per field, nothing nested left.
    doc = _doc(out)
    runs = pandas.json_normalize(doc["runs"])
    assert len(runs) == len(doc["runs"]) == 2 * (3 + 3)
    assert set(runs.columns) == {k for r in doc["runs"] for k in r}
    for frame in (runs, pandas.json_normalize(doc["workloads"])):
        assert not frame.map(lambda v: isinstance(v, (list, dict))).any().any()
    joined = pandas.json_normalize(doc, record_path="runs", meta=["format", ["config", "seed"]])
    assert len(joined) == len(runs) and set(joined["config.seed"]) == {0}
    assert set(pandas.read_csv(out / "runs.csv").columns) == set(runs.columns)
    if (out / "requests.parquet").exists():
        pq = pandas.read_parquet(out / "requests.parquet")
        assert pq.shape == df.shape and list(pq["request_id"]) == list(df["request_id"])


def test_the_k_live_schedule_is_unchanged_by_the_arrival_time_runs(
    rated: tuple[Path, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = rated
    code, _, _ = _run(capsys, "compare", "-w", "multi_turn", "few_shot", *SMALL,
                      "--out", str(tmp_path))  # fmt: skip
    assert code == 0

    def k_live(rows: list[dict[str, str]]) -> list[tuple[str, ...]]:
        cols = ("workload", "backend", "request_id", "hit_tokens", "matched_tokens",
                "boundary_lost_tokens", "cap_lost_tokens")  # fmt: skip
        return [tuple(r[c] for c in cols) for r in rows if r["schedule"] == "k_live"]

    alone = k_live(_rows(tmp_path))
    assert alone and alone == k_live(_rows(out))
    assert not any(r["schedule"] == "arrival" for r in _doc(tmp_path)["runs"])


def test_engine_knobs_reach_every_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, err = _run(
        capsys, "compare", "-w", "shared_system_prompt", "--index", "hash_chain,radix",
        "--request-rate", "3", "--arrival", "fixed", "--max-num-seqs", "2",
        "--max-num-batched-tokens", "512", "--policy", "lpm", "--scheduler", "sglang",
        *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert "arrival time: fixed, 3 req/s" in stdout
    for r in _arrival_runs(_doc(tmp_path)).values():
        assert (r["max_num_seqs"], r["max_num_batched_tokens"]) == (2, 512)
        assert (r["policy"], r["batching"], r["engine"]) == ("lpm", "prefill_first", "sglang")
        assert r["arrival_process"] == "fixed" and r["request_rate"] == 3
    rows = [r for r in _rows(tmp_path) if r["schedule"] == "arrival"]
    for r in rows:
        assert float(r["arrival_s"]) == pytest.approx(int(r["position"]) / 3)


def test_time_scale_keeps_a_mooncake_traces_timestamps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, err = _run(
        capsys, "compare", "--trace", str(MOONCAKE_HEAD), "--max-requests", "60",
        "--tokens-per-id", "16", "--index", "hash_chain,radix", "--time-scale", "2",
        "--timing-repeats", "0", "-q", "--no-plots", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert "arrival time: trace timestamps × 2" in stdout
    with MOONCAKE_HEAD.open(encoding="utf-8") as f:
        stamps = [json.loads(line)["timestamp"] for line, _ in zip(f, range(60), strict=False)]
    assert stamps[-1] > stamps[0]
    for backend in ("hash_chain", "radix"):
        rows = [
            r for r in _rows(tmp_path) if r["schedule"] == "arrival" and r["backend"] == backend
        ]
        got = [float(r["arrival_s"]) for r in rows]
        assert got == pytest.approx([(t - stamps[0]) / 1000 * 2 for t in stamps])
        assert all(float(r["ttft_s"]) > 0 for r in rows)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-w", "seed", "--time-scale", "2"], "has no arrival times for --time-scale"),
        (["-w", "seed", "--max-num-seqs", "4", "--policy", "lpm"],
         "--max-num-seqs, --policy need --request-rate or --time-scale"),
        (["-w", "seed", "--request-rate", "1", "--time-scale", "1"], "not allowed with"),
        (["-w", "seed", "--request-rate", "0"], "--request-rate"),
        (["-w", "seed", "--request-rate", "nan"], "finite number > 0"),
        (["-w", "seed", "--request-rate", "1e-300"], "in [1e-09, 1e+09], got 1e-300"),
        (["--trace", str(MOONCAKE_HEAD), "--time-scale", "1e300"], "time scale must be"),
        (["-w", "seed", "--time-scale", "2", "--arrival", "fixed"], "--arrival goes with"),
        (["-w", "seed", "--request-rate", "1", "--profile", "nope"], "no profile 'nope'"),
        (["-w", "seed", "--request-rate", "1", "--policy", "sjf"], "invalid choice"),
        (["-w", "seed", "--request-rate", "1", "--max-num-batched-tokens", "0"], "token count"),
        (["--trace", str(KVCT), "--time-scale", "1", "--session-order", "sequential"],
         "not in arrival order"),
        (["-w", "seed", "--request-rate", "1,1"], "distinct request rates"),
        (["-w", "seed", "--request-rate", "1", "--slo-ttft", "0"], "--slo-ttft"),
        (["-w", "seed", "--slo-tpot", "50"], "--slo-tpot need --request-rate or --time-scale"),
        (["-w", "seed", "--time-scale", "2", "--request-rate", "auto"], "not allowed with"),
    ],
)  # fmt: skip
def test_bad_time_flags_are_one_line(
    argv: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "compare", *argv, "--out", str(tmp_path / "o"))
    assert code == 2
    assert needle in _error_line(err)
    assert not (tmp_path / "o").exists()


def test_unsorted_timestamps_under_a_time_scale_name_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "late.jsonl"
    trace.write_text(
        '{"id": "a", "tokens": [1, 2], "arrival": 3}\n'
        '{"id": "b", "tokens": [1, 2], "arrival": 5}\n'
        '{"id": "c", "tokens": [1, 2], "arrival": 4}\n'
    )
    code, _, err = _run(
        capsys, "compare", "--trace", str(trace), "--time-scale", "1", "--out", str(tmp_path / "o")
    )
    assert code == 2 and not (tmp_path / "o").exists()
    assert f"{trace}:3: request 'c' arrives at 4 s, before the request at {trace}:2" in err


def test_ctrl_c_in_an_arrival_time_run_keeps_what_finished(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the radix tree's run, halfway through the backends
    interrupt_after(monkeypatch, run_module, "simulate", 2)
    code, stdout, _ = _run(capsys, "compare", "-w", "few_shot", "--index", "hash_chain,radix",
                           "--request-rate", "2", *SMALL[:4], "--out", str(tmp_path))  # fmt: skip
    assert code == 130 and "partial results" in stdout
    doc = _doc(tmp_path)
    assert doc["partial"] is True and doc["workloads"][0]["partial"] is True
    kinds = [(r["schedule"], r["backend"]) for r in doc["runs"]]
    assert kinds == [("k_live", "hash_chain"), ("k_live", "radix"), ("arrival", "hash_chain")]
    rows = _rows(tmp_path)
    assert len(rows) == 3 * 30  # the tables hold exactly what finished
    assert "Partial results" in (tmp_path / "report.md").read_text(encoding="utf-8")
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_time_plots_and_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    code, _, err = _run(
        capsys, "compare", "-w", "multi_turn", "--index", "hash_chain,radix",
        "--capacity-tokens", "2k,40k", "--request-rate", "2", "--max-requests", "40",
        "--timing-repeats", "0", "-q", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    for name in ("ttft_cdf_multi_turn.png", "time_vs_capacity_multi_turn.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
        assert f"]({name})" in md
    assert "Hit ratio and TTFT p90 at each capacity" in md
    sweep = {(r["backend"], r["capacity_tokens"]): r for r in _doc(tmp_path)["runs"]
             if r["schedule"] == "arrival"}  # fmt: skip
    assert set(sweep) == {(b, c) for b in ("hash_chain", "radix") for c in (2000, 40000)}
    for b in ("hash_chain", "radix"):  # more room: at least as many hits, evictions gone
        tight, roomy = sweep[(b, 2000)], sweep[(b, 40000)]
        assert tight["evicted_blocks"] > 0 == roomy["evicted_blocks"]
        assert roomy["hit_ratio"] >= tight["hit_ratio"]
        assert roomy["prefill_gpu_s"] <= tight["prefill_gpu_s"]


def test_compare_backends_returns_dataframes() -> None:
    pandas = pytest.importorskip("pandas")
    options = CompareOptions(["few_shot"], indexes="hash_chain,radix", request_rate=3.0,
                             max_requests=25, timing_repeats=0)  # fmt: skip
    t = compare_backends(options)
    assert isinstance(t.requests, pandas.DataFrame) and isinstance(t.runs, pandas.DataFrame)
    assert len(t.requests) == 2 * 2 * 25 and len(t.runs) == 2 * 2
    arrival = t.runs[t.runs["schedule"] == "arrival"].set_index("backend")
    assert arrival.loc["radix", "engine"] == "vllm"  # one scheduler: only the index varies
    medians = t.requests[t.requests["schedule"] == "arrival"].groupby("backend")["ttft_s"].median()
    assert medians["radix"] == pytest.approx(arrival.loc["radix", "ttft_p50_s"])
    (w,) = t.comparison.workloads
    assert [r.labels["backend"] for r in w.arrival_runs] == ["hash_chain", "radix"]
    assert len(t.comparison.request_rows()) == len(t.requests)


def test_rate_sweep_runs_each_backend_once_per_rate_the_table_included() -> None:
    options = CompareOptions(["seed"], indexes="hash_chain,radix", request_rate=2.0,
                             rate_sweep=[1.0, 2.0, 4.0], timing_repeats=0)  # fmt: skip
    (w,) = compare_backends(options).comparison.workloads
    runs = sorted(
        (r.labels["backend"], r.labels["request_rate"], r.labels["role"]) for r in w.arrival_runs
    )
    assert runs == [
        (b, rate, "table" if rate == 2.0 else "rate")
        for b in ("hash_chain", "radix")
        for rate in (1.0, 2.0, 4.0)
    ]


def test_compare_backends_without_pandas_gives_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    t = compare_backends(CompareOptions(["seed"], indexes="radix"), timing_repeats=0)
    assert isinstance(t.requests, list) and len(t.requests) == 3
    assert t.requests[1]["request_id"] == "B" and t.requests[1]["hit_tokens"] == 30


def test_compare_options_refuse_a_field_they_do_not_have() -> None:
    with pytest.raises(CompareError, match=r"no capacity_blocks; it has: .*capacity_tokens"):
        compare_backends(CompareOptions(["seed"]), capacity_blocks=4)


def test_calibrate_writes_a_profile_compare_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "cpu.json"
    code, stdout, err = _run(capsys, "calibrate", "--device", "cpu", "--quick", "--repeats", "1",
                             "--num-layers", "1", "-q", "--out", str(profile))  # fmt: skip
    assert code == 0, err
    assert str(profile) in stdout and "relative error" in stdout
    p = load_profile(profile)
    assert p.name == "reference-engine-cpu" and p.fit["num_samples"] == 8
    assert "1 layers" in p.model and "prefixkv calibrate" in p.source
    out = tmp_path / "o"
    code, _, err = _run(capsys, "compare", "-w", "seed", "--request-rate", "1",
                        "--profile", str(profile), *SMALL, "--out", str(out))  # fmt: skip
    assert code == 0, err
    assert {r["profile"] for r in _arrival_runs(_doc(out)).values()} == {"reference-engine-cpu"}


def test_calibrate_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "calibrate", "--head-dim", "5", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "head_dim must be even" in _error_line(err)
    code, _, err = _run(capsys, "calibrate", "--out", str(tmp_path))
    assert code == 2 and "is a folder" in _error_line(err)
    code, _, err = _run(capsys, "calibrate", "--device", "tpu", "--out", str(tmp_path / "p.json"))
    assert code == 2 and "invalid choice" in _error_line(err)
    assert not (tmp_path / "p.json").exists()


# `make report` is two steps: the wheel (build/wheel-venv, the prerequisite `make test`
# builds anyway for its compiled half) and `prefixkv compare` on it. The pure half reads
# the steps from make's dry run; the compiled half runs `make report` itself on the wheel
# it is testing, so that one `make test` builds the wheel once.
WHEEL_STAMP = "build/wheel-venv/.built-auto"


def _make(*args: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    assert make is not None
    # -o: the environment running the tests is installed already.
    return subprocess.run(
        [make, "--no-print-directory", "-o", ".venv/.prefixkv-installed", "PREFIXKV_BUILD=auto",
         *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_make_report_builds_the_wheel_then_compares_on_it(tmp_path: Path) -> None:
    out = tmp_path / "report"
    proc = _make("-n", "-B", "report", f"REPORT_DIR={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = proc.stdout.splitlines()
    assert any("-m build --wheel" in step for step in steps), steps
    assert steps[-1] == f"build/wheel-venv/bin/prefixkv compare --out {out}", steps


@pytest.mark.slow
@pytest.mark.both_builds
@pytest.mark.skipif(
    os.environ.get("PREFIXKV_EXPECT_BUILD") != "compiled",
    reason="runs in the compiled half, on the wheel make report builds",
)
def test_make_report_still_works(tmp_path: Path) -> None:
    # The README's command, on the installed wheel (-o: not built again under the tests).
    proc = _make("-o", WHEEL_STAMP, "report", f"REPORT_DIR={tmp_path / 'report'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = tmp_path / "report"
    for name in ("report.md", "results.json", "requests.csv", "runs.csv",
                 "hit_ratio_vs_capacity.png", "strips_seed.png"):  # fmt: skip
        assert (report / name).stat().st_size > 0, name
    doc = _doc(report)
    assert {w["workload"] for w in doc["workloads"]} >= {"seed", "multi_turn", "few_shot"}
    assert not math.isnan(doc["runs"][0]["hit_ratio"])


def test_ctrl_c_while_writing_the_tables_lists_the_finished_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefixkv.adapters.lab.outputs import tables

    interrupt_after(monkeypatch, tables, "write_rows", 2)
    code, _, _ = _run(capsys, "compare", "-w", "seed", "--request-rate", "1", *SMALL,
                      "--out", str(tmp_path))  # fmt: skip
    assert code == 130
    doc = _doc(tmp_path)
    assert doc["partial"] is True and doc["tables"] == {"requests_csv": "requests.csv"}
    assert (tmp_path / "requests.csv").exists() and not (tmp_path / "runs.csv").exists()
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "- tables: requests.csv\n" in md and "Partial results" in md
    assert not list(tmp_path.glob(".*"))
