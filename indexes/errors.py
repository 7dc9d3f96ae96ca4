"""The prefixkv exception hierarchy.

Every misuse of a public entry point (a bad token id, a double unlock, a block
that belongs to someone else) raises a subclass of :class:`PrefixKVError`, which
is a ``ValueError`` so generic handlers keep working. "Does not fit" is not an
error: those calls return ``None``. Each message names the offending value.
"""

from __future__ import annotations

__all__ = [
    "BlockOwnershipError",
    "CacheInUseError",
    "IndexOptionError",
    "InvalidHandleError",
    "InvalidTokenError",
    "LockStateError",
    "NamespaceConflictError",
    "PrefixKVError",
    "RequestStateError",
    "StaleHandleError",
    "UnknownIndexError",
]


class PrefixKVError(ValueError):
    """Base class of every error prefixkv raises for misuse."""


class InvalidTokenError(PrefixKVError):
    """A token id is not a non-negative int below 2**32 (or a prompt is empty)."""


class InvalidHandleError(PrefixKVError):
    """A cache handle came from another index or is not a handle at all."""


class StaleHandleError(InvalidHandleError):
    """A handle that was valid when made, invalidated by what happened since.

    Eviction, ``evict_blocks``, a reset or the release of the blocks it names all
    make a lookup's handle stale; it is rejected, never trusted. Look up again.
    """


class LockStateError(PrefixKVError):
    """An unlock without a matching lock (the ref count would go negative)."""


class BlockOwnershipError(PrefixKVError):
    """A block id is foreign, out of range, freed twice or registered twice."""


class CacheInUseError(PrefixKVError):
    """A reset was asked for while entries are still locked by requests."""


class RequestStateError(PrefixKVError):
    """A request id is unknown, reused, or used after it finished."""


class UnknownIndexError(PrefixKVError):
    """``make_index`` was given a name nobody registered."""


class IndexOptionError(PrefixKVError):
    """``make_index`` was given an option the backend does not take, or a bad value."""


class NamespaceConflictError(PrefixKVError):
    """A namespace (or priority) was given that contradicts the key's own."""
