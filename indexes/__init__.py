"""Prefix-cache indexes: the Protocol, hashing, and the backends (pure Python, no torch)."""

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
