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

from prefixkv.adapters.deprecated import moved_names

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

_ROUTER = "prefixkv.adapters.router"
_MOVED = {
    **{
        name: f"{_ROUTER}:{name}"
        for name in (
            "POLICIES", "ApproxIndex", "ChainedHashIndex", "ClusterIndex", "Decision", "Dump",
            "HashScheme", "LoadTracker", "PolicySpec", "RadixBlockIndex", "RouteContext",
            "RouteKeys", "Router", "RoutingPolicy", "SeqBatch", "StreamTracker", "Worker",
            "WorkerLoad", "make_policy", "parse_policies", "parse_policy",
        )
    },
    "make_index_for": f"{_ROUTER}:make_cluster_index",
    "BOUNDS": f"{_ROUTER}.routing:BOUNDS",
    "DYNAMO_APPROX_TTL_S": f"{_ROUTER}.approx:DYNAMO_APPROX_TTL_S",
    "Reservation": f"{_ROUTER}.load:Reservation",
    "policy_index": f"{_ROUTER}.policies:policy_index",
    # renamed in place: "timed" means measured by the wall clock
    "TimedFault": f"{__name__}:ScheduledFault",
    "timed_requests": f"{__name__}:sim_requests",
}  # fmt: skip
"""Names this package exported before the router moved out (or before they were
renamed) -> where they are now."""

__getattr__ = moved_names(__name__, _MOVED)
