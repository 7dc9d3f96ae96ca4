"""Errors of the router, all :class:`PrefixKVError` subclasses.

Bad input (a policy name, an index name, a setting) raises one of these before any
state changes. The lab's cluster simulation adds its own (a fault spec, a dead
replica) under the same :class:`ClusterError`.
"""

from __future__ import annotations

from prefixkv.indexes.errors import PrefixKVError

__all__ = ["ClusterError", "ClusterSettingsError", "NoReplicaError", "UnknownPolicyError"]


class ClusterError(PrefixKVError):
    """Base class of the router's and the cluster simulation's errors."""


class ClusterSettingsError(ClusterError):
    """A cluster setting is out of range: no replicas, a bad capacity, a bad TTL."""


class UnknownPolicyError(ClusterError):
    """A routing policy or cluster index name is not known (the message lists them)."""


class NoReplicaError(ClusterError):
    """A request cannot be routed: every replica is dead, draining or incompatible."""
