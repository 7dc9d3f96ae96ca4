"""Errors of the arrival-time simulator, all :class:`PrefixKVError` subclasses.

Bad input (a request, an arrival process, a setting, a profile) raises one of these
before any state changes; "does not fit right now" is not an error, it waits.
"""

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
    """A request can never run: the pool (or, without chunked prefill, one step's
    token budget) is too small for it even with the cache empty."""


class ProfileError(SimError):
    """A cost profile is missing a coefficient, has a negative one, or cannot be read."""


class ServerError(SimError):
    """A served engine cannot be reached, refused a request, answered past its deadline
    or byte budget, or answered something else than an OpenAI-compatible completion
    stream with numbers in range."""


class ProfileRangeWarning(UserWarning):
    """A run went past the range its cost profile was measured on (longer prompts or
    contexts, bigger batches): its times extrapolate the fit."""
