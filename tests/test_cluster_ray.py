"""The cluster on Ray (local, 2 CPUs): the same decisions and hit ratios as in-process.

One actor per replica; a killed actor (``ray.kill``) and a restarted one (a new
actor, sequence back at 0) are handled as in the deterministic mode. Skipped when Ray
is not installed (``pip install 'prefixkv[cluster]'``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from prefixkv.adapters.lab.cluster.run import ClusterConfig, run_cluster
from prefixkv.adapters.lab.cluster.trace_requests import sim_requests
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.workloads import make_workload

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a local Ray cluster starts in seconds

from prefixkv.adapters.lab.cluster.ray_fleet import RayFleet  # noqa: E402

CFG = ClusterConfig(num_replicas=2, capacity_tokens=2048, block_size=16, buffer_steps=32)


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
    assert [(r.metrics.request_id, r.replica) for r in on_ray.requests] == [
        (r.metrics.request_id, r.replica) for r in local.requests
    ]
    if faults:
        assert on_ray.run.rerouted_requests == local.run.rerouted_requests
