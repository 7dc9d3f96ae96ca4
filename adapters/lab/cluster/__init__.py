"""The cluster simulation: many simulated replicas behind one KV-aware router, with faults.

``run_cluster(requests, "dynamo", ClusterSettings(...), faults="kill=1@60")`` is the entry
point; the lab's README tells the story.
"""

from prefixkv.adapters.router.errors import ClusterSettingsError

from ..sim.arrivals import sim_requests
from .config import ClusterSettings
from .faults import FaultSpecError
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
