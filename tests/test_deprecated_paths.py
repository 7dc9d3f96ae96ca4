"""Names that moved keep their old import paths for one release, with a warning that
says where they went; the object is the same one."""

from __future__ import annotations

import importlib
import re

import pytest

import prefixkv.adapters.router as router
from prefixkv.adapters.lab import cluster


def test_the_reference_engine_from_the_adapters_root_is_deprecated() -> None:
    import prefixkv.adapters
    from prefixkv.adapters.engine import Engine

    with pytest.warns(DeprecationWarning, match=r"prefixkv\.adapters\.engine"):
        assert prefixkv.adapters.Engine is Engine
    assert "Engine" not in prefixkv.adapters.__all__
    with pytest.raises(AttributeError):
        prefixkv.adapters.NoSuchName  # noqa: B018


@pytest.mark.parametrize("name", sorted(cluster._MOVED))
def test_the_clusters_old_names_warn_and_resolve(name: str) -> None:
    module, _, attr = cluster._MOVED[name].partition(":")
    with pytest.warns(DeprecationWarning, match=rf"is now {re.escape(module)}\.{attr}\b"):
        old = getattr(cluster, name)
    assert old is getattr(importlib.import_module(module), attr)
    assert name not in cluster.__all__


def test_every_name_the_lab_cluster_exported_before_still_imports() -> None:
    before = {
        "BOUNDS", "DYNAMO_APPROX_TTL_S", "POLICIES", "ApproxIndex", "ChainedHashIndex",
        "ClusterConfig", "ClusterConfigError", "ClusterError", "ClusterIndex", "ClusterResult",
        "ClusterRun", "Decision", "Dump", "EventChannel", "EventPublisher", "FaultPlan",
        "FaultSpecError", "Fleet", "HashScheme", "Invariants", "LoadTracker", "LocalFleet",
        "LocalIndexer", "NoReplicaError", "PolicySpec", "PooledFleet", "RadixBlockIndex",
        "RayFleet", "ReplicaDeadError", "ReplicaReport", "ReplicaSpec", "ReplicaSummary",
        "Reservation", "RouteContext", "RouteKeys", "RoutedRequest", "Router", "RoutingPolicy",
        "SeqBatch", "SimReplica", "StreamTracker", "TimedFault", "UnknownPolicyError", "Worker",
        "WorkerLoad", "arrival_span", "make_index_for", "make_policy", "parse_faults",
        "parse_policies", "parse_policy", "policy_index", "ray_available", "run_cluster",
        "run_experiment", "timed_requests", "write_report",
    }  # fmt: skip
    with pytest.warns(DeprecationWarning):
        missing = {n for n in before if getattr(cluster, n, None) is None}
    assert not missing
    renamed = {"ScheduledFault", "sim_requests"}
    assert set(cluster.__all__) - renamed | set(cluster._MOVED) == before


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchName"):
        cluster.NoSuchName  # noqa: B018
    assert router.Router is router.router.Router


def test_the_queue_order_names_replace_policy_in_the_simulator() -> None:
    from prefixkv.adapters.lab import sim
    from prefixkv.adapters.lab.sim import config

    for module in (sim, config):
        with pytest.warns(DeprecationWarning, match="QUEUE_ORDERS"):
            assert module.POLICIES == sim.QUEUE_ORDERS == ("fcfs", "lpm")
        with pytest.warns(DeprecationWarning, match="QueueOrder"):
            assert module.Policy is sim.QueueOrder
    assert "POLICIES" not in sim.__all__


def test_eviction_queue_check_is_check_invariants() -> None:
    from prefixkv.indexes.eviction import EvictionQueue, LRUPolicy

    q = EvictionQueue(LRUPolicy())
    with pytest.warns(DeprecationWarning, match="check_invariants"):
        q.check()


def _compare_moved() -> list[tuple[str, str]]:
    from prefixkv.adapters.lab import compare, comparison

    return [("compare", n) for n in sorted(compare._MOVED)] + [
        ("comparison", n) for n in sorted(comparison._MOVED)
    ]


@pytest.mark.parametrize(("module", "name"), _compare_moved())
def test_the_old_compare_and_comparison_names_warn_and_resolve(module: str, name: str) -> None:
    old = importlib.import_module(f"prefixkv.adapters.lab.{module}")
    with pytest.warns(DeprecationWarning, match=r"prefixkv\.adapters\.lab\.compare\.\w+"):
        value = getattr(old, name)
    assert value is not None
    with pytest.raises(AttributeError):
        getattr(old, "NoSuchName")  # noqa: B009


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("prefixkv.adapters.lab.sim", "TimedRequest", "SimRequest"),
        ("prefixkv.adapters.lab.sim", "timed_request", "sim_request"),
        ("prefixkv.adapters.lab.sim.requests", "TimedRequest", "SimRequest"),
        ("prefixkv.adapters.lab.cluster", "TimedFault", "ScheduledFault"),
        ("prefixkv.adapters.lab.cluster", "timed_requests", "sim_requests"),
    ],
)
def test_timed_names_for_arrival_time_things_are_renamed(module: str, old: str, new: str) -> None:
    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=new):
        assert getattr(mod, old) is getattr(mod, new)


def test_fault_plans_scheduled_faults_keep_their_old_name() -> None:
    plan = cluster.parse_faults("kill=1@5")
    with pytest.warns(DeprecationWarning, match="scheduled"):
        assert plan.timed == plan.scheduled


def test_cluster_result_check_is_check_invariants() -> None:
    from prefixkv.adapters.lab.cluster import ClusterConfig, run_cluster
    from prefixkv.adapters.lab.sim import sim_request

    requests = [sim_request(f"r{i}", [1 + i] * 40, 2, arrival=0.1 * i) for i in range(4)]
    res = run_cluster(requests, "round_robin", ClusterConfig(num_replicas=2, capacity_tokens=512))
    with pytest.warns(DeprecationWarning, match="check_invariants"):
        res.check()
