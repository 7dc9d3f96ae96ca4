"""Analysable outputs of simulated runs: tidy rows, CSV / JSON / Parquet files that
pandas loads into one row per request, DataFrames, and the plots."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.outputs.plots import plot_capacity_sweep, plot_ttft_cdf, ttft_curves
from prefixkv.adapters.lab.outputs.tables import (
    TableFormatError,
    request_rows,
    run_rows,
    to_dataframes,
    write_rows,
    write_tables,
)
from prefixkv.adapters.lab.sim import SimResult, SimSettings, from_trace, simulate, with_arrivals
from prefixkv.adapters.lab.sim.metrics import RequestRow
from prefixkv.adapters.lab.workloads import make_workload
from prefixkv.indexes import make_index
from prefixkv.storage.extras import ExtraNotInstalledError

BACKENDS = (("hash_chain", 16), ("radix", 1))


def _runs(capacities: tuple[int, ...] = (50_000,)) -> list[SimResult]:
    reqs = make_workload("shared_system_prompt", num_requests=30)
    out = []
    for capacity in capacities:
        for name, bs in BACKENDS:
            timed = from_trace(reqs)
            out.append(
                simulate(
                    with_arrivals(timed, request_rate=2.0, seed=0),
                    functools.partial(make_index, name, bs),
                    capacity,
                    SimSettings(max_num_seqs=16),
                    labels={"backend": name, "workload": "shared_system_prompt"},
                )
            )
    return out


@pytest.fixture(scope="module")
def runs() -> list[SimResult]:
    return _runs()


def test_rows_are_flat_and_labelled(runs: list[SimResult]) -> None:
    rows = request_rows(runs)
    assert len(rows) == 60
    first = rows[0]
    for col in ("backend", "workload", "index", "block_size", "capacity_tokens", "policy"):
        assert col in first
    for col in ("request_id", "arrival_s", "queueing_delay_s", "ttft_s", "e2e_s", "hit_tokens"):
        assert col in first
    assert all(not isinstance(v, (dict, list)) for v in first.values())
    (run,) = [r for r in run_rows(runs) if r["backend"] == "radix"]
    assert run["num_requests"] == 30 and 0 < run["hit_ratio"] < 1
    assert run["ttft_p50_s"] <= run["ttft_p90_s"] <= run["ttft_p99_s"]


def test_csv_loads_with_pandas_one_row_per_request(runs: list[SimResult], tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    files = write_tables({"requests": request_rows(runs), "runs": run_rows(runs)}, tmp_path)
    assert [f.name for f in files] == ["requests.csv", "runs.csv"]
    df = pandas.read_csv(tmp_path / "requests.csv")
    assert len(df) == 60 and df.groupby("backend").size().to_dict() == {
        "hash_chain": 30,
        "radix": 30,
    }
    assert df["request_id"].is_unique is False  # the same request, once per backend
    assert not df.duplicated(["backend", "request_id"]).any()
    radix = df[df["backend"] == "radix"].set_index("request_id")
    rec = {r.request_id: r for r in runs[1].requests}
    for rid, row in radix.iterrows():
        assert row["ttft_s"] == pytest.approx(rec[str(rid)].ttft_s)
        assert row["hit_tokens"] == rec[str(rid)].hit_tokens
    run_df = pandas.read_csv(tmp_path / "runs.csv")
    assert len(run_df) == 2 and "ttft_p90_s" in run_df.columns


def test_json_forms_load_flat(runs: list[SimResult], tmp_path: Path) -> None:
    pandas = pytest.importorskip("pandas")
    rows = request_rows(runs)
    rows[0]["tpot_s"] = math.nan  # a one-token output has no TPOT
    write_rows(tmp_path / "r.json", rows)
    write_rows(tmp_path / "r.jsonl", rows)
    records = json.loads((tmp_path / "r.json").read_text())
    assert records[0]["tpot_s"] is None and len(records) == 60
    df = pandas.read_json(tmp_path / "r.json")
    assert len(df) == 60 and "ttft_s" in df.columns
    lines = pandas.read_json(tmp_path / "r.jsonl", lines=True)
    assert lines.shape == df.shape


def test_dataframes(runs: list[SimResult]) -> None:
    pytest.importorskip("pandas")
    requests, summary = to_dataframes(runs)
    assert requests.shape[0] == 60 and summary.shape[0] == 2
    p50 = requests.groupby("backend")["ttft_s"].median()
    assert p50["radix"] == pytest.approx(runs[1].run.ttft_p50_s)


def test_parquet_when_pyarrow_is_installed(runs: list[SimResult], tmp_path: Path) -> None:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        with pytest.raises(ExtraNotInstalledError, match="pyarrow"):
            write_rows(tmp_path / "r.parquet", request_rows(runs))
        assert not (tmp_path / "r.parquet").exists()
        return
    write_rows(tmp_path / "r.parquet", request_rows(runs))
    assert pq.read_table(tmp_path / "r.parquet").num_rows == 60


def test_unknown_table_format(runs: list[SimResult], tmp_path: Path) -> None:
    with pytest.raises(TableFormatError, match=r"\.csv"):
        write_rows(tmp_path / "r.xlsx", request_rows(runs))


def test_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    runs = _runs((4096, 50_000))
    cdf = plot_ttft_cdf(ttft_curves(runs[:2]), tmp_path / "ttft_cdf.png")
    sweep = plot_capacity_sweep(run_rows(runs), tmp_path / "capacity.png")
    for path in (cdf, sweep):
        assert path.stat().st_size > 10_000
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- one request row for every kind of run ------------------------------------------------

_CLOCK = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "hit_tokens",
    "computed_prefill_tokens",
    "recomputed_tokens",
    "num_preemptions",
    "prefill_gpu_s",
    "saved_gpu_s",
    "queueing_delay_s",
    "ttft_s",
    "e2e_s",
    "tpot_s",
    "uncached_prefill_tokens",
)
_K_LIVE = (
    "request_id",
    "prompt_tokens",
    "hit_tokens",
    "uncached_prefill_tokens",
    "matched_tokens",
    "boundary_lost_tokens",
    "cap_lost_tokens",
    "index_us",
    "admit_us",
)
_ROUTE = ("replica", "routes", "predicted_hit_tokens", "decision_us", "hash_us", "decision_cpu_us")


@given(
    prompt=st.integers(0, 10_000),
    hit=st.integers(0, 10_000),
    arrival=st.one_of(st.none(), st.floats(0, 1e6)),
    replica=st.one_of(st.none(), st.integers(0, 63)),
)
def test_a_request_row_writes_the_columns_of_the_parts_its_run_filled(
    prompt: int, hit: int, arrival: float | None, replica: int | None
) -> None:
    # The columns requests.csv promises: a K-live row (no clock), an arrival-time row,
    # and a cluster row (a clock and a route), each in the order the files always had.
    row = RequestRow("r", prompt_tokens=prompt, hit_tokens=min(hit, prompt))
    if arrival is not None:
        row.arrival_s = arrival
        if replica is not None:
            row.route(replica, 1, 32, 1.0, 0.5, 0.8)
    flat = row.as_row()
    route = _ROUTE if replica is not None else ()
    expected = _K_LIVE if arrival is None else _CLOCK + route
    assert tuple(flat) == expected
    assert flat["uncached_prefill_tokens"] == prompt - min(hit, prompt)
    assert all(flat[k] == getattr(row, k) or flat[k] != flat[k] for k in flat)
