"""The cluster report at compare's standard: defined columns, titled plots, notes for
overload and for a policy above a bound, partial results marked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.cluster.metrics import ClusterResult
from prefixkv.adapters.lab.cluster.run import ClusterSettings, run_cluster
from prefixkv.adapters.lab.outputs import cluster as report
from prefixkv.adapters.lab.outputs import plots
from prefixkv.adapters.lab.outputs.markdown import table
from prefixkv.adapters.lab.sim.arrivals import sim_requests
from prefixkv.adapters.lab.workloads import make_workload

CFG = ClusterSettings(num_replicas=2, capacity_tokens=4096, block_size=16)


def _runs(rate: float, policies: tuple[str, ...], closed_loop: bool = True) -> list[ClusterResult]:
    w = make_workload("multi_turn", num_sessions=12, turns=(2, 4), system_len=32, seed=1)
    return [
        run_cluster(
            list(sim_requests(w, request_rate=rate, seed=0, closed_loop=closed_loop)), p, CFG
        )
        for p in policies
    ]


def _with_hit(res: ClusterResult, hit: float) -> ClusterResult:
    return dataclasses.replace(res, run=dataclasses.replace(res.run, hit_ratio=hit))


def test_overload_is_noted_and_a_steady_fleet_is_not() -> None:
    # Open loop: a closed-loop session waits for its answers and cannot overload a fleet.
    hot = _runs(400.0, ("round_robin", "llmd", "pooled"), closed_loop=False)
    assert all(r.run.offered_load > 1 for r in hot)
    (note,) = report.report_notes(hot, hot)
    assert note.startswith("**Overload.** 2 of 2 policies") and "load " in note
    calm = _runs(0.5, ("round_robin", "llmd", "pooled"))
    assert all(r.run.offered_load < 1 and r.run.ttft_growth < report.GROWTH_LIMIT for r in calm)
    assert report.report_notes(calm, calm) == []


def test_each_run_says_its_offered_and_achieved_rate_and_the_shared_overload_verdict() -> None:
    hot = _runs(400.0, ("round_robin",), closed_loop=False)
    calm = _runs(0.5, ("round_robin",), closed_loop=False)
    for r in (*hot, *calm):
        assert 0 < r.run.achieved_rate <= r.run.offered_rate
    assert hot[0].run.overloaded and hot[0].run.achieved_rate < hot[0].run.offered_rate / 10
    assert not calm[0].run.overloaded
    assert "req/s offered / achieved" in table(report.POLICY_COLUMNS, report.policy_rows(hot, hot))


def test_a_policy_above_a_bound_is_explained() -> None:
    rr, llmd, pooled, infinite = _runs(0.5, ("round_robin", "llmd", "pooled", "infinite"))
    runs = [rr, _with_hit(llmd, 0.9), _with_hit(pooled, 0.8), _with_hit(infinite, 0.85)]
    above_pooled, above_infinite = report.report_notes(runs, runs)
    assert above_pooled.startswith("**Above the pooled figure.** llmd 0.900 > 0.800.")
    assert "not an optimum" in above_pooled
    assert above_infinite.startswith("**Above the infinite bound: llmd.**")
    assert report.report_notes([rr, llmd, pooled], [rr, llmd, pooled]) == []


def test_report_defines_columns_titles_plots_and_marks_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("matplotlib")
    titles: list[str] = []
    real = plots._save

    def save(fig: Any, path: Any, title: str) -> Path:
        titles.append(title)
        return real(fig, path, title)

    monkeypatch.setattr(plots, "_save", save)
    runs = _runs(0.5, ("round_robin", "llmd", "pooled"))
    files = report.write_report(runs, tmp_path, command="prefixkv cluster ...",
                                source="multi_turn (36 requests); arrivals: Poisson 0.5/s",
                                partial="interrupted after 3 of 5 runs")  # fmt: skip
    assert len(titles) == 5 and {f.name for f in files} <= set(report.OUTPUT_NAMES)
    for title in titles:
        assert "multi_turn (36 requests); arrivals: Poisson 0.5/s" in title
        assert "2 replicas x 4,096 tokens each" in title
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert md.count("**Partial results**: interrupted after 3 of 5 runs") == 1
    assert "## Policies at 2 replicas x 4,096 tokens each" in md
    header = next(line for line in md.splitlines() if line.startswith("| policy | index |"))
    defined = [c[0] for c in report.POLICY_COLUMNS]
    assert [column.strip() for column in header.strip("|").split("|")] == defined
    assert all(f"| {c} | " in md for c in defined)  # each column defined
    assert "| column | meaning |" in md and " us" not in md
    header = (tmp_path / "requests.csv").read_text(encoding="utf-8").split("\n", 1)[0]
    assert header.startswith("policy,num_replicas,capacity_tokens,faults,request_id,arrival_s,")
    doc = json.loads((tmp_path / "results.json").read_text(encoding="utf-8"),
                     parse_constant=_no_nan)  # fmt: skip
    assert doc["partial"] is True and doc["partial_reason"] == "interrupted after 3 of 5 runs"
    assert [r["labels"]["policy"] for r in doc["runs"]] == ["round_robin", "llmd", "pooled"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def _no_nan(name: str) -> None:
    raise AssertionError(f"results.json holds {name}, which is not JSON")


def test_cluster_command_reports_overload(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = ["cluster", "--workload", "multi_turn", "--max-requests", "60", "--replicas", "1",
            "--request-rate", "500", "--policies", "round_robin,pooled", "--quiet",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "**Overload.** 1 of 1 policies ran an overloaded fleet: round_robin" in md
    assert "offered load" in (out / "runs.csv").read_text().splitlines()[0].replace("_", " ")
