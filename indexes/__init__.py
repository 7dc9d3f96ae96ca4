"""Prefix-cache indexes: the Protocol, hashing, and the backends (pure Python, no torch).

Every name loads its module on first use, so that an engine running one backend never
loads the others."""

from typing import TYPE_CHECKING

from .lazy import lazy_names

if TYPE_CHECKING:
    from .base import (
        CacheHandle,
        Described,
        EventSink,
        IndexDescription,
        IndexStats,
        InsertResult,
        PrefixIndex,
        PrefixMatch,
        SupportsCachedBlocks,
        SupportsCommonPrefix,
        SupportsEventSink,
        SupportsEvictBlocks,
        SupportsMemoryBytes,
        describe,
    )
    from .errors import (
        BlockOwnershipError,
        CacheInUseError,
        IndexOptionError,
        InvalidHandleError,
        InvalidTokenError,
        LockStateError,
        NamespaceConflictError,
        PrefixKVError,
        RequestStateError,
        StaleHandleError,
        UnknownIndexError,
    )
    from .eviction import EVICTION_POLICIES, EvictionPolicy, make_eviction_policy
    from .hash_chain import HashChainIndex
    from .hashing import BLOCK_HASH_ALGORITHMS, HASH_ALGORITHMS, BlockHasher, make_block_hasher
    from .null import NoPrefixIndex
    from .radix import RadixIndex
    from .registry import available_indexes, describe_index, make_index, register_index
    from .sync import SynchronizedIndex
    from .tokens import ExtraKey, TokenKey, make_extra_key
    from .wrapper import IndexWrapper


__all__ = [
    "BLOCK_HASH_ALGORITHMS",
    "EVICTION_POLICIES",
    "HASH_ALGORITHMS",
    "BlockHasher",
    "BlockOwnershipError",
    "CacheHandle",
    "CacheInUseError",
    "Described",
    "EventSink",
    "EvictionPolicy",
    "ExtraKey",
    "HashChainIndex",
    "IndexDescription",
    "IndexOptionError",
    "IndexStats",
    "IndexWrapper",
    "InsertResult",
    "InvalidHandleError",
    "InvalidTokenError",
    "LockStateError",
    "NamespaceConflictError",
    "NoPrefixIndex",
    "PrefixIndex",
    "PrefixKVError",
    "PrefixMatch",
    "RadixIndex",
    "RequestStateError",
    "StaleHandleError",
    "SupportsCachedBlocks",
    "SupportsCommonPrefix",
    "SupportsEventSink",
    "SupportsEvictBlocks",
    "SupportsMemoryBytes",
    "SynchronizedIndex",
    "TokenKey",
    "UnknownIndexError",
    "available_indexes",
    "describe",
    "describe_index",
    "make_block_hasher",
    "make_eviction_policy",
    "make_extra_key",
    "make_index",
    "register_index",
]

_HOMES = {
    "CacheHandle": "base",
    "Described": "base",
    "EventSink": "base",
    "IndexDescription": "base",
    "IndexStats": "base",
    "InsertResult": "base",
    "PrefixIndex": "base",
    "PrefixMatch": "base",
    "SupportsCachedBlocks": "base",
    "SupportsCommonPrefix": "base",
    "SupportsEventSink": "base",
    "SupportsEvictBlocks": "base",
    "SupportsMemoryBytes": "base",
    "describe": "base",
    "BlockOwnershipError": "errors",
    "CacheInUseError": "errors",
    "IndexOptionError": "errors",
    "InvalidHandleError": "errors",
    "InvalidTokenError": "errors",
    "LockStateError": "errors",
    "NamespaceConflictError": "errors",
    "PrefixKVError": "errors",
    "RequestStateError": "errors",
    "StaleHandleError": "errors",
    "UnknownIndexError": "errors",
    "EVICTION_POLICIES": "eviction",
    "EvictionPolicy": "eviction",
    "make_eviction_policy": "eviction",
    "HashChainIndex": "hash_chain",
    "BLOCK_HASH_ALGORITHMS": "hashing",
    "HASH_ALGORITHMS": "hashing",
    "BlockHasher": "hashing",
    "make_block_hasher": "hashing",
    "NoPrefixIndex": "null",
    "RadixIndex": "radix",
    "available_indexes": "registry",
    "describe_index": "registry",
    "make_index": "registry",
    "register_index": "registry",
    "SynchronizedIndex": "sync",
    "ExtraKey": "tokens",
    "TokenKey": "tokens",
    "make_extra_key": "tokens",
    "IndexWrapper": "wrapper",
}
"""The names loaded on first use, by the module each lives in."""

_lookup = lazy_names(__name__, _HOMES)


def __getattr__(name: str) -> object:
    return _lookup(name)
