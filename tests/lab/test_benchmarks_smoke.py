"""The benchmark suites still run (tiny sizes, timing off): not a performance test."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ROOT


@pytest.mark.slow
def test_benchmarks_run_at_smoke_size() -> None:
    env = dict(os.environ, PREFIXKV_BENCH="smoke")
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-q", "-p", "no:cacheprovider",
           "--benchmark-disable"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout


def test_memory_per_block_script_runs() -> None:
    cmd = [sys.executable, "benchmarks/memory_per_block.py", "--blocks", "512"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bytes_per_cached_block" in proc.stdout


def test_soak_script_runs() -> None:
    cmd = [sys.executable, "benchmarks/soak.py", "--requests", "300", "--every", "100",
           "--num-tokens", "2048"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count('"summary"') == 2


def test_decode_flat_script_runs() -> None:
    cmd = [sys.executable, "benchmarks/decode_flat.py", "--steps", "2048", "--repeat", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("| vllm |") == 3 and proc.stdout.count("| sglang |") == 3


def test_decode_profile_loop_runs_and_its_annotations_parse() -> None:
    for engine_class in ("vllm", "sglang"):
        for index in ("hash_chain", "radix", "driver"):
            cmd = [sys.executable, "benchmarks/decode_profile.py", "--child",
                   "--engine-class", engine_class, "--index", index, "--rounds", "2",
                   "--steps", "40"]  # fmt: skip
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
    import decode_profile

    small = decode_profile.inclusive(
        "100 (50.00%)  ???:Py_RunMain [/lib/libpython3.11.so]\n"
        "40 (20.00%)  *  a.c:CPyDef_manager___CacheManager___advance [/x.so]\n"
        "30 (15.00%)  a.c:CPyDef_manager___CacheManager___advance'2 [/x.so]\n"
    )
    assert small == {"Py_RunMain": 100, "CPyDef_manager___CacheManager___advance": 40}
    large = {"Py_RunMain": 300, "CPyDef_manager___CacheManager___advance": 140}
    assert decode_profile.per_step(small, large, 10) == {
        "Py_RunMain": 20.0,
        "CPyDef_manager___CacheManager___advance": 10.0,
    }
