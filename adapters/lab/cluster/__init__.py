"""Many replicas behind one KV-aware router: cluster indexes, load, policies, faults.

N simulated engine replicas (each the arrival-time replica of :mod:`..sim` with its own
index and capacity) publish KV events with sequence numbers; a router keeps a cluster
index of which worker holds which block, tracks load with reservations, and routes
each request with a policy. Runs in-process in virtual time (deterministic) or with
one Ray actor per replica (:class:`RayFleet`).

``run_cluster(requests, "dynamo", ClusterConfig(...), faults="kill=1@60")`` is the
entry point; ``prefixkv cluster`` runs many policies and writes a report.
"""

from .approx import DYNAMO_APPROX_TTL_S, ApproxIndex
from .errors import (
    ClusterConfigError,
    ClusterError,
    FaultSpecError,
    NoReplicaError,
    ReplicaDeadError,
    UnknownPolicyError,
)
from .experiment import arrival_span, run_experiment
from .faults import EventChannel, FaultPlan, TimedFault, parse_faults
from .fleet import Fleet, LocalFleet, PooledFleet, ReplicaSpec
from .index import ChainedHashIndex, ClusterIndex
from .keys import HashScheme, RouteKeys, Worker
from .load import LoadTracker, Reservation, WorkerLoad
from .local_indexer import LocalIndexer
from .metrics import ClusterResult, ClusterRun, Invariants, ReplicaSummary, RoutedRequest
from .policies import POLICIES, make_policy, policy_index
from .policy import BOUNDS, PolicySpec, RouteContext, RoutingPolicy, parse_policies, parse_policy
from .radix import RadixBlockIndex
from .ray_fleet import RayFleet, ray_available
from .replica import ReplicaReport, SimReplica
from .report import write_report
from .requests import timed_requests
from .router import Decision, Router
from .run import ClusterConfig, make_index_for, run_cluster
from .stream import Dump, EventPublisher, SeqBatch, StreamTracker

__all__ = [
    "BOUNDS",
    "DYNAMO_APPROX_TTL_S",
    "POLICIES",
    "ApproxIndex",
    "ChainedHashIndex",
    "ClusterConfig",
    "ClusterConfigError",
    "ClusterError",
    "ClusterIndex",
    "ClusterResult",
    "ClusterRun",
    "Decision",
    "Dump",
    "EventChannel",
    "EventPublisher",
    "FaultPlan",
    "FaultSpecError",
    "Fleet",
    "HashScheme",
    "Invariants",
    "LoadTracker",
    "LocalFleet",
    "LocalIndexer",
    "NoReplicaError",
    "PolicySpec",
    "PooledFleet",
    "RadixBlockIndex",
    "RayFleet",
    "ReplicaDeadError",
    "ReplicaReport",
    "ReplicaSpec",
    "ReplicaSummary",
    "Reservation",
    "RouteContext",
    "RouteKeys",
    "RoutedRequest",
    "Router",
    "RoutingPolicy",
    "SeqBatch",
    "SimReplica",
    "StreamTracker",
    "TimedFault",
    "UnknownPolicyError",
    "Worker",
    "WorkerLoad",
    "arrival_span",
    "make_index_for",
    "make_policy",
    "parse_faults",
    "parse_policies",
    "parse_policy",
    "policy_index",
    "ray_available",
    "run_cluster",
    "run_experiment",
    "timed_requests",
    "write_report",
]
