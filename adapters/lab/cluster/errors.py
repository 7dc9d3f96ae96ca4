"""Errors of the cluster simulation: the router's, and two of its own.

Bad input (a fault spec, a setting) raises one of these before any state changes. A
replica that is gone is not an input error: the driver catches
:class:`ReplicaDeadError` and routes the request elsewhere.
"""

from __future__ import annotations

from prefixkv.adapters.router.errors import (
    ClusterError,
    ClusterSettingsError,
    NoReplicaError,
    UnknownPolicyError,
)

__all__ = [
    "ClusterError",
    "ClusterSettingsError",
    "FaultSpecError",
    "NoReplicaError",
    "ReplicaDeadError",
    "UnknownPolicyError",
]


class FaultSpecError(ClusterError):
    """A ``--faults`` entry cannot be parsed or names a replica that does not exist."""


class ReplicaDeadError(ClusterError):
    """A call reached a replica that was killed (or whose actor died)."""
