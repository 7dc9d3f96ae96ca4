"""The objects prefixkv's vLLM ``KVCacheManager`` hands the engine, and where they come from.

:class:`EngineTypes` names the engine's own block (``KVCacheBlock``), block-list
(``KVCacheBlocks``), prefix-cache-stats and KV-event types; the manager builds its
answers only from them. Inside vLLM, ``scheduler.py`` passes vLLM's; elsewhere
:data:`PREFIXKV_TYPES`, the look-alikes below (vLLM's ``vllm/v1/core/kv_cache_manager.py``,
``kv_cache_utils.py`` and ``metrics/stats.py`` shapes, one KV-cache group). Also what
vLLM reads of the manager's ``coordinator``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from ..events.wire import KVEvent

__all__ = [
    "PREFIXKV_TYPES",
    "Coordinator",
    "EngineTypes",
    "KVCacheBlock",
    "KVCacheBlocks",
    "PrefixCacheStats",
    "SingleTypeManager",
]


class KVCacheBlock:
    """prefixkv's stand-in for vLLM's ``KVCacheBlock``: what the scheduler reads of a block."""

    __slots__ = ("block_id", "is_null")

    def __init__(self, block_id: int, is_null: bool = False) -> None:
        self.block_id = block_id
        self.is_null = is_null

    def __repr__(self) -> str:
        return f"KVCacheBlock(block_id={self.block_id})"


class KVCacheBlocks:
    """vLLM's boundary object between scheduler and cache: ``blocks[group][i]``.

    prefixkv's stand-in for vLLM's dataclass of the same name (one group here),
    compared by block ids.
    """

    __slots__ = ("blocks",)

    def __init__(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> None:
        self.blocks = blocks

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        """Block ids per group; ``None`` with ``allow_none`` when every group is empty."""
        if allow_none and not any(self.blocks):
            return None
        return tuple([b.block_id for b in group] for group in self.blocks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None  # type: ignore[assignment]  # compared by value, like vLLM's dataclass

    def __repr__(self) -> str:
        return f"KVCacheBlocks(block_ids={self.get_block_ids()!r})"


class PrefixCacheStats:
    """vLLM's ``PrefixCacheStats`` (the ``vllm:prefix_cache_*`` metrics), prefixkv's copy.

    Attributes:
        reset: ``reset_prefix_cache`` ran since the last take.
        requests, queries, hits: new requests, their prompt tokens, their hit tokens.
        preempted_requests, preempted_queries, preempted_hits: the same for requests
            that were preempted before (counted apart, as vLLM does).
    """

    __slots__ = (
        "hits",
        "preempted_hits",
        "preempted_queries",
        "preempted_requests",
        "queries",
        "requests",
        "reset",
    )

    def __init__(self) -> None:
        self.reset = False
        self.requests = self.queries = self.hits = 0
        self.preempted_requests = self.preempted_queries = self.preempted_hits = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one admitted lookup."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


def _same_events(events: list[KVEvent]) -> list[Any]:
    return list(events)


class EngineTypes(NamedTuple):
    """The engine's own types, which the manager builds its answers from.

    Attributes:
        block: ``(block_id, is_null) -> block`` (vLLM's ``KVCacheBlock``); each block
            object is made once, the first time its id is handed out.
        blocks: ``groups -> block list`` (vLLM's ``KVCacheBlocks``), called with a
            tuple of one group: a list of blocks, or ``()`` for the shared empty one.
        prefix_cache_stats: ``() -> stats`` with ``record(num_tokens, num_hits,
            preempted)`` and ``reset`` (vLLM's ``PrefixCacheStats``).
        convert_events: prefixkv's KV events (vLLM's wire structs) -> the engine's.
    """

    block: Callable[[int, bool], Any]
    blocks: Callable[[tuple[Sequence[Any], ...]], Any]
    prefix_cache_stats: Callable[[], Any]
    convert_events: Callable[[list[KVEvent]], list[Any]]


PREFIXKV_TYPES: Final = EngineTypes(KVCacheBlock, KVCacheBlocks, PrefixCacheStats, _same_events)
"""prefixkv's own look-alikes: what the manager answers with outside an engine."""


class SingleTypeManager:
    """What vLLM reads of a KV-cache group's manager: its block size and spec.

    ``EngineCore`` reads them at start-up (``_initialize_effective_attention_block_size``,
    ``get_kv_cache_group_metadata``), the scheduler to size speculative steps.
    """

    __slots__ = ("block_size", "kv_cache_group_id", "kv_cache_spec")

    def __init__(self, block_size: int, kv_cache_spec: object) -> None:
        self.block_size = block_size
        self.kv_cache_spec = kv_cache_spec
        self.kv_cache_group_id = 0


class Coordinator:
    """What vLLM reads of ``KVCacheManager.coordinator``, for one full-attention group.

    No partial-block hits, no re-prefilled tokens, no eagle groups: the features that
    would set them are refused at start-up.
    """

    __slots__ = (
        "eagle_group_ids",
        "enable_partial_hash_hits",
        "num_reprefillable_tokens",
        "single_type_managers",
    )

    def __init__(self, block_size: int, kv_cache_spec: object) -> None:
        self.single_type_managers = (SingleTypeManager(block_size, kv_cache_spec),)
        self.enable_partial_hash_hits = False
        self.num_reprefillable_tokens = 0
        self.eagle_group_ids: tuple[int, ...] = ()
