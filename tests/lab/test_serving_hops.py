"""The hop probe's parts that run without a server: its table, its per-process CPU
reading, and the experiment's patch of vLLM's shm queue busy-wait."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import serving_hops

NOSPIN = Path(serving_hops.__file__).parent / "nospin" / "sitecustomize.py"


CPU = {"vllm": 0.01, "VLLM::EngineCor": 0.05, "VLLM::Worker": 0.1}


def row(arm: str, kind: str, ttft: float, **more: Any) -> dict[str, Any]:
    return {"arm": arm, "kind": kind, "load1": 1.5, "client_ttft_ms": ttft, "cpu_s": CPU, **more}


def test_the_table_gives_each_arm_and_kind_its_percentiles_bursts_and_cpu() -> None:
    rows = [
        row("spin", "busy", t, burst=t > 50, client_wait_ms=t / 10)
        for t in (10.0, 20.0, 30.0, 40.0, 100.0)
    ]
    rows.append(row("nospin", "lone", 5.0))
    lines = serving_hops.table(rows).splitlines()
    assert len(lines) == 4  # head, rule, two groups
    spin = next(ln for ln in lines if ln.startswith("| spin | busy | 5 |"))
    cells = [c.strip() for c in spin.strip("|").split("|")]
    assert cells[3] == "1.50-1.50"
    assert cells[4] == "30.0 / 76.0"  # p50, p90 (linear between order statistics)
    assert cells[5] == "-"  # not measured
    # the client's run-queue wait, p50 / p90
    assert cells[-3] == "3.0 / 7.6"
    assert cells[-2] == "1/5"
    assert cells[-1] == "0.010 / 0.050 / 0.100"
    assert any(ln.startswith("| nospin | lone | 1 |") for ln in lines)


def test_the_clients_run_queue_wait_only_grows() -> None:
    before = serving_hops.run_queue_wait_s()
    sum(range(10**5))  # some work: time on a core, maybe a wait for one
    assert serving_hops.run_queue_wait_s() >= before >= 0.0


def test_process_cpu_reads_the_processes_of_a_group() -> None:
    mine = serving_hops.process_cpu(os.getpgid(0))
    assert mine and all(v >= 0 for v in mine.values())
    assert serving_hops.process_cpu(2**22 + 12345) == {}  # no such group


def _nospin() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("nospin_sitecustomize", NOSPIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    before = list(sys.meta_path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.meta_path[:] = before  # the finder it installs stays out of the test run
    return module


def test_the_experiment_makes_the_busy_wait_nap_and_touches_nothing_else(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    nospin = _nospin()
    shm = types.ModuleType(nospin._TARGET)
    shm.sched_yield = os.sched_yield  # type: ignore[attr-defined]
    nospin._patch(shm)
    assert shm.sched_yield is not os.sched_yield  # type: ignore[attr-defined]
    assert "nap 200 us a turn" in capsys.readouterr().err
    # the finder wraps the loader of its one module (a stand-in here) and no other
    import json

    monkeypatch.setattr(nospin, "_TARGET", "json.decoder")
    finder = nospin._Finder()
    assert finder.find_spec("json.encoder", json.__path__) is None
    spec = finder.find_spec("json.decoder", json.__path__)
    assert isinstance(spec.loader, nospin._Loader)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    assert loaded.JSONDecoder and callable(loaded.sched_yield)
