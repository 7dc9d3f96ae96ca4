"""Errors of the cluster simulation and router, all :class:`PrefixKVError` subclasses.

Bad input (a policy name, a fault spec, a setting) raises one of these before any
state changes. A replica that is gone is not an input error: the driver catches
:class:`ReplicaDeadError` and routes the request elsewhere.
"""

from __future__ import annotations

from prefixkv.indexes.errors import PrefixKVError

__all__ = [
    "ClusterConfigError",
    "ClusterError",
    "FaultSpecError",
    "NoReplicaError",
    "ReplicaDeadError",
    "UnknownPolicyError",
]


class ClusterError(PrefixKVError):
    """Base class of the cluster's errors."""


class ClusterConfigError(ClusterError):
    """A cluster setting is out of range: no replicas, a bad capacity, a bad TTL."""


class UnknownPolicyError(ClusterError):
    """A routing policy or cluster index name is not known (the message lists them)."""


class FaultSpecError(ClusterError):
    """A ``--faults`` entry cannot be parsed or names a replica that does not exist."""


class ReplicaDeadError(ClusterError):
    """A call reached a replica that was killed (or whose actor died)."""


class NoReplicaError(ClusterError):
    """A request cannot be routed: every replica is dead, draining or incompatible."""
