"""The cluster simulation: many replicas behind one KV-aware router, with faults.

N simulated engine replicas (each the arrival-time replica of :mod:`..sim` with its own
index and capacity) publish KV events with sequence numbers; the router of
:mod:`prefixkv.adapters.router` keeps a cluster index of which worker holds which
block, tracks load with reservations, and routes each request with a policy. Runs
in-process in virtual time (deterministic) or with one Ray actor per replica
(:class:`RayFleet`).

``run_cluster(requests, "dynamo", ClusterConfig(...), faults="kill=1@60")`` is the
entry point; ``prefixkv cluster`` runs many policies and writes a report. The router's
names that this package exported before they moved (``Router``, ``HashScheme``,
``make_policy``, ...) still import from here for one release, with a
``DeprecationWarning``.
"""

import warnings

from .config import ClusterConfig
from .errors import (
    ClusterConfigError,
    ClusterError,
    FaultSpecError,
    NoReplicaError,
    ReplicaDeadError,
    UnknownPolicyError,
)
from .experiment import arrival_span, run_experiment
from .faults import EventChannel, FaultPlan, ScheduledFault, parse_faults
from .fleet import Fleet, LocalFleet, PooledFleet, ReplicaSpec
from .local_indexer import LocalIndexer
from .metrics import ClusterResult, ClusterRun, Invariants, ReplicaSummary, RoutedRequest
from .publisher import EventPublisher
from .ray_fleet import RayFleet, ray_available
from .report import write_report
from .run import run_cluster
from .sim_replica import ReplicaReport, SimReplica
from .trace_requests import sim_requests

__all__ = [
    "ClusterConfig",
    "ClusterConfigError",
    "ClusterError",
    "ClusterResult",
    "ClusterRun",
    "EventChannel",
    "EventPublisher",
    "FaultPlan",
    "FaultSpecError",
    "Fleet",
    "Invariants",
    "LocalFleet",
    "LocalIndexer",
    "NoReplicaError",
    "PooledFleet",
    "RayFleet",
    "ReplicaDeadError",
    "ReplicaReport",
    "ReplicaSpec",
    "ReplicaSummary",
    "RoutedRequest",
    "ScheduledFault",
    "SimReplica",
    "UnknownPolicyError",
    "arrival_span",
    "parse_faults",
    "ray_available",
    "run_cluster",
    "run_experiment",
    "sim_requests",
    "write_report",
]

_MOVED_TO_ROUTER = {
    "ApproxIndex": "ApproxIndex",
    "ChainedHashIndex": "ChainedHashIndex",
    "ClusterIndex": "ClusterIndex",
    "Decision": "Decision",
    "Dump": "Dump",
    "HashScheme": "HashScheme",
    "LoadTracker": "LoadTracker",
    "POLICIES": "POLICIES",
    "PolicySpec": "PolicySpec",
    "RadixBlockIndex": "RadixBlockIndex",
    "RouteContext": "RouteContext",
    "RouteKeys": "RouteKeys",
    "Router": "Router",
    "RoutingPolicy": "RoutingPolicy",
    "SeqBatch": "SeqBatch",
    "StreamTracker": "StreamTracker",
    "Worker": "Worker",
    "WorkerLoad": "WorkerLoad",
    "make_index_for": "make_cluster_index",
    "make_policy": "make_policy",
    "parse_policies": "parse_policies",
    "parse_policy": "parse_policy",
    "BOUNDS": "routing.BOUNDS",
    "DYNAMO_APPROX_TTL_S": "approx.DYNAMO_APPROX_TTL_S",
    "Reservation": "load.Reservation",
    "policy_index": "policies.policy_index",
}
"""Names this package exported before the router moved -> where they are now, under
``prefixkv.adapters.router``."""


_RENAMED = {"TimedFault": "ScheduledFault", "timed_requests": "sim_requests"}
"""Names renamed in place ("timed" means measured by the wall clock)."""


def __getattr__(name: str) -> object:
    if name in _RENAMED:
        warnings.warn(
            f"{__name__}.{name} is now {__name__}.{_RENAMED[name]}; "
            "the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[_RENAMED[name]]
    new = _MOVED_TO_ROUTER.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"prefixkv.adapters.lab.cluster.{name} moved to prefixkv.adapters.router.{new}; "
        "the old name goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    import importlib

    module, _, attr = f"prefixkv.adapters.router.{new}".rpartition(".")
    return getattr(importlib.import_module(module), attr)
