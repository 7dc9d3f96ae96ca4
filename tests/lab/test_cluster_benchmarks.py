"""The cluster benchmark scripts still run (tiny sizes): not performance tests."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, TEST_DATA

HEAD = TEST_DATA / "fidelity" / "mooncake_conversation_head.jsonl"


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_cluster_index_benchmark_runs() -> None:
    out = _run(
        "benchmarks/cluster_index.py", "--block-events", "3000", "--queries", "50", "--repeat", "1"
    )
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["index"] for r in rows} == {"chained", "radix", "approx"}
    assert all(r["apply_block_events_per_s"] > 0 for r in rows if "apply_block_events_per_s" in r)


def test_cluster_router_benchmark_runs() -> None:
    out = _run("benchmarks/cluster_router.py", "--workers", "4", "--docs", "20",
               "--decisions", "50", "--policies", "round_robin,dynamo,sglang")  # fmt: skip
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["policy"] for r in rows] == ["round_robin", "dynamo", "sglang"]


def test_cluster_mooncake_benchmark_runs(tmp_path: Path) -> None:
    _run("benchmarks/cluster_mooncake.py", "--conversation", str(HEAD), "--groups", "policies",
         "--max-requests", "80", "--replicas", "2", "--out", str(tmp_path))  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["conversation"]["pooled_hit"] >= summary["conversation"]["round_robin_hit"]
    assert (tmp_path / "conversation" / "policies" / "report.md").exists()


def test_cluster_mooncake_benchmark_keeps_its_time_budget(tmp_path: Path) -> None:
    # A budget spent at once: at most the first run starts; the rest are skipped, and said so.
    out = _run("benchmarks/cluster_mooncake.py", "--conversation", str(HEAD), "--groups",
               "policies,capacity", "--max-requests", "80", "--replicas", "2",
               "--time-budget", "0.001", "--out", str(tmp_path))  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    for group, planned in (("policies", 12), ("capacity", 30)):
        note = summary["skipped"][f"conversation/{group}"]
        m = re.fullmatch(r"the time budget of 0.001 s ran out after (\d+) of (\d+) runs; "
                         r"skipped: (.*)", note)  # fmt: skip
        assert m is not None and int(m[2]) == planned, note
        finished, skipped = int(m[1]), m[3].split("; ")
        assert finished <= 1 and len(skipped) == planned - finished
        assert all(" N=2 capacity=" in s for s in skipped)
        assert f"conversation/{group}: {note}" in out
        report = tmp_path / "conversation" / group / "report.md"
        assert report.exists() == bool(finished)
        if finished:
            assert "**Partial results**: the time budget of 0.001 s" in report.read_text()
