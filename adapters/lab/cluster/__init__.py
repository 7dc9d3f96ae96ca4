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

from ..sim.arrivals import sim_requests
from .config import ClusterSettings
from .errors import ClusterSettingsError, FaultSpecError
from .fleet import LocalFleet
from .metrics import ClusterResult
from .ray_fleet import RayFleet
from .run import run_cluster
from .sim_replica import SimReplica

__all__ = [
    "ClusterResult",
    "ClusterSettings",
    "ClusterSettingsError",
    "FaultSpecError",
    "LocalFleet",
    "RayFleet",
    "SimReplica",
    "run_cluster",
    "sim_requests",
]
