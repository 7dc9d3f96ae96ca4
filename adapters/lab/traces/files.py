"""Deprecated: the output rule moved to :mod:`prefixkv.adapters.outputs` (every writer of
prefixkv uses it, the event files outside the lab too); the old names resolve there, with
a ``DeprecationWarning``, for one release."""

from __future__ import annotations

from prefixkv.adapters import outputs
from prefixkv.adapters.deprecated import moved_names

__getattr__ = moved_names(
    __name__, {name: f"{outputs.__name__}:{name}" for name in outputs.__all__}
)
