"""The cluster simulation: many replicas behind one KV-aware router, with faults.

N simulated engine replicas (each the arrival-time replica of :mod:`..sim` with its own
index and capacity) publish KV events with sequence numbers; the router of
:mod:`prefixkv.adapters.router` keeps a cluster index of which worker holds which
block, tracks load with reservations, and routes each request with a policy. Runs
in-process in virtual time (deterministic) or with one Ray actor per replica
(:class:`RayFleet`).

``run_cluster(requests, "dynamo", ClusterSettings(...), faults="kill=1@60")`` is the
entry point; ``prefixkv cluster`` runs many policies and writes a report
(:mod:`prefixkv.adapters.lab.outputs.cluster`).
"""

from .config import ClusterSettings
from .errors import (
    ClusterError,
    ClusterSettingsError,
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
from .run import run_cluster
from .sim_replica import ReplicaReport, SimReplica
from .trace_requests import sim_requests

__all__ = [
    "ClusterError",
    "ClusterResult",
    "ClusterRun",
    "ClusterSettings",
    "ClusterSettingsError",
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
]
