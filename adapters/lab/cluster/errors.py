"""The cluster simulation's errors (the router's, plus two of its own)."""

from __future__ import annotations

from prefixkv.adapters.router.errors import ClusterError, ClusterSettingsError, UnknownPolicyError

__all__ = ["ClusterSettingsError", "FaultSpecError", "ReplicaDeadError", "UnknownPolicyError"]


class FaultSpecError(ClusterError):
    """A ``--faults`` entry cannot be parsed or names a replica that does not exist."""


class ReplicaDeadError(ClusterError):
    """A call reached a replica that was killed (or whose actor died)."""
