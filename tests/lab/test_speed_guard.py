"""The speed guard (``benchmarks/guard.py``, ``make bench``): what it reads, what it flags.

Not a performance test: the ratios here are made up or come from a tiny replay whose
figures are not judged; what is checked is that a ratio that moved by more than the
tolerance either way is named and fails the run, and one within it passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import guard
import pytest
from helpers import ROOT

from prefixkv.adapters.lab.traces import open_trace


def _bench(test: str, name: str, bs: int, seconds: float, **sizes: int) -> dict[str, object]:
    return {"fullname": f"benchmarks/test_index_ops.py::{test}[...]", "name": f"{test}[...]",
            "params": {"name": name, "bs": bs, **sizes}, "stats": {"min": seconds}}  # fmt: skip


def test_index_op_ratios_pair_each_radix_with_the_hash_chain(tmp_path: Path) -> None:
    data = {"benchmarks": [
        _bench("test_match_prefix", "hash_chain", 16, 2.0, prompt_len=256, cache_blocks=0),
        _bench("test_match_prefix", "radix", 1, 3.0, prompt_len=256, cache_blocks=0),
        _bench("test_match_prefix", "radix", 16, 1.0, prompt_len=256, cache_blocks=0),
        _bench("test_match_prefix", "radix", 1, 9.0, prompt_len=16, cache_blocks=0),  # no pair
        {"fullname": "benchmarks/test_storage_ops.py::x", "name": "x",
         "params": {"name": "hash_chain", "bs": 16}, "stats": {"min": 1.0}},
    ]}  # fmt: skip
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    assert guard.index_op_ratios(path) == {
        "index_ops/test_match_prefix[cache_blocks=0,prompt_len=256]: radix-1 / hash_chain-16": 1.5,
        "index_ops/test_match_prefix[cache_blocks=0,prompt_len=256]: radix-16 / hash_chain-16": 0.5,
    }


@pytest.mark.parametrize(
    ("now", "moved"),
    [(1.0, False), (1.19, False), (0.81, False), (1.25, True), (0.75, True), (2.3, True)],
)
def test_compare_flags_a_move_past_the_tolerance_either_way(now: float, moved: bool) -> None:
    got = guard.compare({"a": now, "new": 5.0}, {"a": 1.0}, 0.2)
    assert got == (["a"] if moved else [])


def test_conversations_trace_reads_and_grows(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    total = guard.conversations(path, 200_000, seed=3)
    reqs = list(open_trace(path))
    assert sum(len(r.tokens) for r in reqs) == total >= 200_000
    assert all(len(r.output) >= 20 for r in reqs)
    # turns extend their conversation: some prompt starts with an earlier whole prompt
    starts = {tuple(r.tokens[:512]) for r in reqs[:8]}
    assert any(tuple(r.tokens[:512]) in starts for r in reqs[8:])


def test_guard_fails_on_a_moved_ratio_and_passes_on_its_own_baseline(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "guard.py"), "--tokens", "60000",
           "--repeat", "1", "--capacity-tokens", "300000", "--baseline", str(baseline)]  # fmt: skip
    run = subprocess.run([*cmd, "--update"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    stored = json.loads(baseline.read_text())
    assert stored["machine"]["date"] and stored["machine"]["cores"]
    keys = list(stored["ratios"])
    assert any("radix:1 / hash_chain:16" in k for k in keys)
    # the same ratios stored 100x lower: every one has moved, however loaded the machine
    stored["ratios"] = {k: v / 100 for k, v in stored["ratios"].items()}
    baseline.write_text(json.dumps(stored))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert run.stdout.count("MOVED") == len(keys)
    assert "make bench-baseline" in run.stderr
