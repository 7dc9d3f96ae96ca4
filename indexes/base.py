"""The contract every prefix-cache index implements, written once.

An index maps token prefixes to the KV blocks that hold them. It owns the blocks it
caches: a cached block is either locked (in use by at least one request) or
evictable, and ``evict`` hands unlocked blocks back to the caller (LRU, tail or leaf
first). Engines see only its records (``PrefixMatch`` and ``InsertResult``, in
``records.py``), never hash entries or tree nodes (like vLLM's ``KVCacheBlocks`` and
mini-sglang's ``match_prefix`` results).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, runtime_checkable

from .records import InsertResult, PrefixMatch
from .tokens import ExtraKey, TokenKey

__all__ = [
    "CacheHandle",
    "Described",
    "EventSink",
    "IndexDescription",
    "IndexStats",
    "InsertResult",
    "PrefixIndex",
    "PrefixMatch",
    "SupportsCachedBlocks",
    "SupportsCommonPrefix",
    "SupportsEventSink",
    "SupportsEvictBlocks",
    "SupportsExtendLocked",
    "SupportsMemoryBytes",
    "describe",
]

CacheHandle = object
"""An opaque reference to cached entries (a tree node, a run of blocks).

Pass it back to the index that made it. A handle is validated whenever it is used:
if anything since the lookup invalidated it (eviction, ``evict_blocks``, a reset,
the release of blocks it names), ``lock`` and ``count_evictable`` raise
``StaleHandleError`` and the caller looks up again; it is never trusted blindly.
"""


class IndexDescription(NamedTuple):
    """What a backend says about itself, so no caller ever matches on its name.

    Attributes:
        unit: what its ``block_size`` is called: ``"block"`` (vLLM) or ``"page"`` (SGLang).
        models: the engine whose prefix cache it reproduces (``"vllm"``, ``"sglang"``),
            whose scheduler order a replay should drive it in; ``None`` for neither.
        caches: ``False`` for an index that never holds a block (prefix caching off).
        default_block_size: its ``block_size`` when none is given.
        pool_owned_options: options to build it with when the caller owns the block
            pool and checks block ownership itself (a ``CacheManager``), e.g. turning
            off a per-block check the caller already makes.
    """

    unit: Literal["block", "page"] = "block"
    models: str | None = None
    caches: bool = True
    default_block_size: int = 16
    pool_owned_options: Mapping[str, Any] = MappingProxyType({})


@runtime_checkable
class Described(Protocol):
    """A backend class that describes itself (every built-in does)."""

    DESCRIPTION: ClassVar[IndexDescription]


def describe(index: object) -> IndexDescription:
    """What ``index`` says about itself (wrappers forward it); a plain block index if silent."""
    return index.DESCRIPTION if isinstance(index, Described) else IndexDescription()


class IndexStats(NamedTuple):
    """Sizes and counters of an index, in blocks.

    Attributes:
        num_cached_blocks: blocks the index owns (locked + evictable).
        num_evictable_blocks: owned blocks no request has locked.
        num_locked_blocks: owned blocks pinned by at least one lock.
        num_entries: hash entries (hash chain) or tree nodes (radix).
        num_evicted_blocks: blocks given back by ``evict`` since creation.
    """

    num_cached_blocks: int
    num_evictable_blocks: int
    num_locked_blocks: int
    num_entries: int
    num_evicted_blocks: int


@runtime_checkable
class PrefixIndex(Protocol):
    """A prefix-cache index: the one interface every backend implements.

    Thread safety: none. An engine calls its index from its scheduler thread only
    (as vLLM's and SGLang's schedulers do); wrap it in a lock to share it.
    """

    block_size: int
    """Hit granularity in tokens: the hash chain's block, the radix tree's page."""

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """Find the longest cached prefix of ``key``, at most ``max_num_tokens`` long.

        May mutate: recency stamps and node splits (radix). Never locks.

        Args:
            key: the sequence to look up.
            max_num_tokens: cap on the hit (the manager passes ``len - 1``).

        Returns:
            The hit; ``num_tokens == 0`` with no blocks on a miss.
        """
        ...

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """Register the first ``num_tokens`` tokens of ``key`` as cached in ``block_ids``.

        Only whole blocks (pages) are registered; a partial tail block is not.
        New entries start unlocked: lock the returned handle to pin them.

        Args:
            key: the sequence.
            block_ids: the caller's blocks for the key, one per block, covering at
                least the registered whole blocks.
            num_tokens: how many leading tokens have KV (default: all).
            prefix: optional hint, a handle the caller holds locked on a prefix of
                this key (from its previous insert); an index may skip that part.

        Raises:
            BlockOwnershipError: too few blocks, or a block id cached elsewhere.
        """
        ...

    def count_evictable(self, handle: CacheHandle) -> int:
        """Validate ``handle`` now and count its blocks that are evictable now.

        Locking the handle would protect exactly these blocks, so an admission check
        made at allocation time subtracts them from the evictable total (vLLM's
        ``num_evictable_computed_blocks``). Mutates nothing.

        Raises:
            InvalidHandleError: the handle is foreign.
            StaleHandleError: something since the lookup invalidated it.
        """
        ...

    def lock(self, handle: CacheHandle) -> None:
        """Pin the entries of ``handle`` (vLLM ``ref_cnt += 1``, SGLang ``inc_lock_ref``).

        Raises:
            InvalidHandleError: the handle is foreign.
            StaleHandleError: something since the lookup invalidated it; nothing changes.
        """
        ...

    def unlock(self, handle: CacheHandle) -> list[int]:
        """Release one lock on ``handle``; entries stay cached (evictable at 0).

        Returns:
            Blocks the index no longer holds and hands back to the caller (only
            blocks whose entries were dropped while locked, e.g. by
            ``evict_blocks``); usually empty.

        Raises:
            LockStateError: no lock is held on some entry (a double unlock).
        """
        ...

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """Move one lock from ``old`` to ``new`` (SGLang: lock the new node, unlock the old).

        Equivalent to ``lock(new)`` then ``unlock(old)``; an index may do it in
        O(difference) when ``new`` extends ``old``.
        """
        ...

    def evict(self, num_blocks: int) -> list[int]:
        """Free at least ``num_blocks`` unlocked blocks, least recently used first.

        The hash chain frees exactly that many (tail blocks first); the radix tree
        frees whole leaves and may overshoot. Fewer come back when not enough are
        evictable.

        Returns:
            The freed block ids, now owned by the caller.
        """
        ...

    def reset(self) -> list[int]:
        """Drop every entry and return all cached blocks.

        Raises:
            CacheInUseError: some entry is locked; nothing changes.
        """
        ...

    def stats(self) -> IndexStats:
        """Sizes and counters, in O(1)."""
        ...

    def check_invariants(self) -> None:
        """Verify the internal structure.

        Raises:
            AssertionError: with a description of the broken state.
        """
        ...


@runtime_checkable
class SupportsEvictBlocks(Protocol):
    """An index that drops entries by block id (vLLM ``BlockPool.evict_blocks``, KV connectors)."""

    def evict_blocks(self, block_ids: Sequence[int]) -> list[int]:
        """Drop the cache entries of ``block_ids``; ids not cached are ignored.

        Returns:
            The unlocked blocks freed now, owned by the caller; locked ones come
            back from their last ``unlock``.
        """
        ...


@runtime_checkable
class SupportsCommonPrefix(Protocol):
    """An index that counts blocks shared by every running request in O(result)."""

    def num_common_prefix_blocks(self, block_ids: Sequence[int], num_requests: int) -> int:
        """Leading blocks of ``block_ids`` locked by exactly ``num_requests`` requests."""
        ...


@runtime_checkable
class SupportsMemoryBytes(Protocol):
    """An index that can estimate the size of its own structures."""

    def memory_bytes(self) -> int:
        """Estimated bytes held by the index's structures (not the KV)."""
        ...


@runtime_checkable
class SupportsCachedBlocks(Protocol):
    """An index that answers "which blocks hold this prefix?" without side effects."""

    def cached_blocks(self, key: TokenKey, max_num_tokens: int | None = None) -> list[int]:
        """The blocks of the longest cached prefix of ``key``, in order.

        Unlike ``match_prefix`` it changes nothing: no recency stamp, no split.
        """
        ...


@runtime_checkable
class SupportsExtendLocked(Protocol):
    """An index that registers a locked run's next blocks and moves the lock in one call."""

    def extend_locked(
        self, key: TokenKey, block_ids: Sequence[int], num_tokens: int, prefix: CacheHandle
    ) -> CacheHandle | None:
        """``insert(key, block_ids, num_tokens, prefix)`` then ``relock(prefix, new)``,
        returning the new handle, where the caller registers fresh blocks right after its
        locked ``prefix``; ``None`` (nothing changed) where the two calls are needed."""
        ...


class EventSink(Protocol):
    """Receives an index's cache-content changes, as an engine's KV-event queue does.

    Calls carry raw digests and the request's namespace; a recorder
    (``prefixkv.adapters.events``) turns them into the wire events of the engine the
    index mirrors. Calls arrive in the order the changes happen, on the index's thread.
    """

    def on_stored(
        self,
        block_hashes: Sequence[bytes],
        parent_block_hash: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        extra_key: ExtraKey | None,
    ) -> None:
        """Full blocks (pages) became cached, as one chain.

        Args:
            block_hashes: the new blocks' digests, in sequence order.
            parent_block_hash: the digest of the block just before the first one;
                ``None`` when the chain starts at the sequence's first block.
            token_ids: the new blocks' tokens, ``block_size`` per digest (read them
                during the call; the index may reuse the buffer).
            block_size: tokens per block.
            extra_key: the sequence's namespace.
        """
        ...

    def on_removed(self, block_hashes: Sequence[bytes]) -> None:
        """Cached blocks left the cache (evicted, dropped by ``evict_blocks``)."""
        ...

    def on_cleared(self) -> None:
        """The whole cache was reset."""
        ...


@runtime_checkable
class SupportsEventSink(Protocol):
    """An index that reports its cache-content changes to an optional :class:`EventSink`.

    With no sink attached (the default) the index pays at most one ``is None`` test
    per operation.
    """

    kv_event_dialect: str
    """Whose events the sink calls reproduce, given the matching recorder: ``"vllm"``
    (vLLM 0.33's ``BlockPool``: one call per stored chain, one digest per removal)
    or ``"sglang"`` (SGLang 0.5.23's ``RadixCache``: one call per tree node, page
    digests as SGLang computes them)."""

    def set_event_sink(self, sink: EventSink | None) -> None:
        """Attach ``sink`` (``None`` detaches). Changes from now on are reported.

        Entries cached before the sink was attached were never announced to it, so
        their later removal reaches it unannounced.
        """
        ...
