"""Errors of the arrival-time simulator: bad input raises one before any state changes."""

from __future__ import annotations

from prefixkv.indexes.errors import PrefixKVError

__all__ = [
    "ProfileError",
    "ProfileRangeWarning",
    "ServerError",
    "SimError",
    "SimInputError",
    "SimSettingsError",
    "SimUnservableError",
]


class SimError(PrefixKVError):
    """Base class of the simulator's errors."""


class SimSettingsError(SimError):
    """A scheduler setting or an arrival-process parameter is out of range."""


class SimInputError(SimError):
    """A request is malformed: empty prompt, bad output length, arrivals out of order."""


class SimUnservableError(SimError):
    """A request can never run, even with the cache empty."""


class ProfileError(SimError):
    """A cost profile is missing a coefficient, has a negative one, or cannot be read."""


class ServerError(SimError):
    """A served engine cannot be reached or answered out of bounds or out of protocol."""


class ProfileRangeWarning(UserWarning):
    """A run went past the range its cost profile was measured on."""
