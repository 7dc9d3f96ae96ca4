"""Prefix-cache indexes: the Protocol, hashing, and the backends (pure Python, no torch)."""

from .base import CacheHandle, IndexStats, InsertResult, PrefixIndex, PrefixMatch
from .errors import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    InvalidTokenError,
    LockStateError,
    PrefixKVError,
    RequestStateError,
    UnknownIndexError,
)
from .eviction import EVICTION_POLICIES, EvictionPolicy, make_eviction_policy
from .hash_chain import HashChainIndex
from .hashing import HASH_ALGORITHMS, BlockHasher
from .null import NoPrefixIndex
from .radix import RadixIndex
from .registry import available_indexes, make_index, register_index
from .sync import SynchronizedIndex
from .tokens import ExtraKey, TokenKey, make_extra_key

__all__ = [
    "EVICTION_POLICIES",
    "HASH_ALGORITHMS",
    "BlockHasher",
    "BlockOwnershipError",
    "CacheHandle",
    "CacheInUseError",
    "EvictionPolicy",
    "ExtraKey",
    "HashChainIndex",
    "IndexStats",
    "InsertResult",
    "InvalidHandleError",
    "InvalidTokenError",
    "LockStateError",
    "NoPrefixIndex",
    "PrefixIndex",
    "PrefixKVError",
    "PrefixMatch",
    "RadixIndex",
    "RequestStateError",
    "SynchronizedIndex",
    "TokenKey",
    "UnknownIndexError",
    "available_indexes",
    "make_eviction_policy",
    "make_extra_key",
    "make_index",
    "register_index",
]
