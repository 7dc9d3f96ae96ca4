"""The trace benchmark script still runs, on the small fixtures (not a performance test)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT, TEST_DATA

MOONCAKE = TEST_DATA / "traces" / "mooncake_small.jsonl"


def _run(*args: str) -> list[str]:
    cmd = [sys.executable, "benchmarks/trace_replay.py", *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["wall", "--trace", str(MOONCAKE), "--capacity-tokens", "8K", "-k", "2"], "peak_rss_mib"),
        (["throughput", "--tokens", "30k"], "prompt_tokens_per_s"),
        (["memory", "--trace", str(MOONCAKE), "--capacity-tokens", "8K", "--lengthen", "3"],
         "rss_ratio"),
        (["profile", "--trace", str(MOONCAKE), "--index", "radix", "--size", "1",
          "--capacity-tokens", "8K", "--top", "5"], "own_s"),
    ],
)  # fmt: skip
def test_trace_benchmark_modes_run(args: list[str], expect: str) -> None:
    lines = _run(*args)
    assert any(expect in line for line in lines), lines
    rows = [json.loads(line) for line in lines if line.startswith("{")]
    assert rows
