"""The cluster on Ray (local, 2 CPUs): the same decisions and hit ratios as in-process.

One actor per replica; a killed actor (``ray.kill``) and a restarted one (a new
actor, sequence back at 0) are handled as in the deterministic mode. ``prefixkv
cluster --ray`` checks placement first (actors that cannot all get their CPUs are
refused, or the default share is lowered) and refuses an address nothing answers at,
where Ray itself would wait forever. Skipped when Ray is not installed (``pip install
'prefixkv[cluster]'``).
"""

from __future__ import annotations

import _thread
import contextlib
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixkv.adapters.lab.cli import main
from prefixkv.adapters.lab.cluster.run import ClusterSettings, run_cluster
from prefixkv.adapters.lab.sim.arrivals import sim_requests
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.workloads import make_workload

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a local Ray cluster starts in seconds

from prefixkv.adapters.lab.cluster.ray_fleet import RayFleet  # noqa: E402

CFG = ClusterSettings(num_replicas=2, capacity_tokens=2048, block_size=16, buffer_steps=32)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def requests() -> list[SimRequest]:
    w = make_workload("multi_turn", num_sessions=16, turns=(2, 5), system_len=32, seed=3)
    return list(sim_requests(w, request_rate=2.0, seed=0))


@pytest.mark.parametrize(
    ("policy", "faults"),
    [("dynamo", ""), ("llmd", "restart=0@6,kill=1@10")],
)
def test_ray_fleet_matches_the_deterministic_mode(
    policy: str, faults: str, requests: list[SimRequest], local_ray: None
) -> None:
    local = run_cluster(requests, policy, CFG, faults)
    on_ray = run_cluster(requests, policy, CFG, faults, fleet=RayFleet(num_cpus=0.5, init=False))
    on_ray.check_invariants()
    assert on_ray.run.hit_ratio == local.run.hit_ratio
    assert [(r.request_id, r.replica) for r in on_ray.requests] == [
        (r.request_id, r.replica) for r in local.requests
    ]
    if faults:
        assert on_ray.run.rerouted_requests == local.run.rerouted_requests


def _cluster(tmp_path: Path, *flags: str) -> list[str]:
    return ["cluster", "--workload", "multi_turn", "--max-requests", "40", "--request-rate",
            "4", "--quiet", "--out", str(tmp_path / "report"), "--ray", *flags]  # fmt: skip


@contextlib.contextmanager
def _watchdog(seconds: float) -> Iterator[None]:
    """Interrupt the main thread (as Ctrl-C would) if the block outlives ``seconds``:
    a Ray placement that can never happen hangs instead of failing."""
    timer = threading.Timer(seconds, _thread.interrupt_main)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def test_cluster_refuses_actors_that_cannot_be_placed(
    tmp_path: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    # 4 actors x 1 CPU on a 2-CPU Ray: Ray would wait forever to place the last two.
    with _watchdog(60):
        code = main(_cluster(tmp_path, "--replicas", "4", "--ray-cpus", "1"))
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("prefixkv: error: --ray: 4 replica actors x --ray-cpus 1 = 4 CPUs")
    # 2 free CPUs, or fewer while the previous test's actors are still being killed
    assert re.search(r"has [\d.]+ free .*give --ray-cpus 0?\.\d+ or fewer replicas$", err), err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "report").exists()
    assert ray.is_initialized()  # the caller's Ray is left running


@pytest.mark.slow  # starts 4 actors twice: ~7 s on 2 cores
def test_cluster_lowers_the_default_cpu_share_to_fit(
    tmp_path: Path, local_ray: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with _watchdog(120):
        code = main(_cluster(tmp_path, "--replicas", "4", "--policies", "round_robin,llmd"))
    err = capsys.readouterr().err
    assert code == 0, err
    assert "4 replica actors x 1 CPU exceed the Ray cluster's" in err
    assert "CPU instead (--ray-cpus to choose)" in err and len(err.splitlines()) == 1
    rows = (tmp_path / "report" / "runs.csv").read_text().splitlines()
    assert len(rows) == 3


def test_an_unreachable_ray_address_fails_fast(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _watchdog(300):  # a hang guard: the command gives up after its own 10 s
        code = main(_cluster(tmp_path, "--ray-address", f"127.0.0.1:{port}"))
    err = capsys.readouterr().err
    assert code == 2 and "nothing answers there within 10 s" in err, err
    assert not (tmp_path / "report").exists()
