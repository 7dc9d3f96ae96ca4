"""The simulator's scripts run (tiny sizes): the Mooncake replay on the trace head the
fidelity tests use."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "fidelity" / "mooncake_conversation_head.jsonl"


def test_sim_mooncake_script_reports_ttft_and_writes_tables(tmp_path: Path) -> None:
    cmd = [sys.executable, "benchmarks/sim_mooncake.py", str(TRACE), "--max-requests", "40",
           "--scale-block", "16", "--request-rate", "2", "--capacity-tokens", "4096,65536",
           "--max-prompt-tokens", "1500",
           "--backends", "hash_chain:16,radix:1", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT p50" in proc.stdout and "Poisson 2.0/s" in proc.stdout
    with (tmp_path / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40 * 4  # two backends at two capacities
    assert {r["backend"] for r in rows} == {"hash_chain:16", "radix:1"}
    assert (tmp_path / "ttft_cdf.png").stat().st_size > 0
    assert (tmp_path / "capacity.png").stat().st_size > 0
    scaled = [c if c != "--request-rate" else "--time-scale" for c in cmd[:-2]]
    proc = subprocess.run(scaled, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trace timestamps x 2.0" in proc.stdout
