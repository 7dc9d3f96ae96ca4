"""KV-cache event structs, field for field those of vLLM 0.33 (``vllm/distributed/kv_events.py``).

A batch is a msgpack *array* ``[ts, events, data_parallel_rank]`` (the rank omitted
when ``None``); each event is a msgpack *map* tagged ``"type": "<class name>"``, with
the fields below in this order and the defaulted ones omitted when unset. Encoding
these structs with ``msgspec.msgpack`` or ``msgspec.json`` gives the bytes vLLM's
``ZmqEventPublisher`` sends and the JSON its structs produce; the recorded fixtures in
``tests/data/events`` check it byte for byte.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEvent",
    "KVEventBatch",
]

ExternalBlockHash = bytes | int
"""A block hash on the wire: vLLM's 64-bit unsigned int by default (``maybe_convert_block_hash``),
the raw digest bytes with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, a signed 64-bit
int from SGLang."""

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A batch of events: ``[ts, events, data_parallel_rank]`` on the wire."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the KV-cache events; the tag is the class name."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache, as one chain after ``parent_block_hash``.

    Attributes:
        block_hashes: the blocks' hashes, in chain order.
        parent_block_hash: the hash of the block before the first one (``None``: the
            chain starts at the sequence's first block).
        token_ids: the blocks' tokens, ``block_size`` per hash.
        block_size: tokens per block.
        lora_id: the LoRA adapter's int id (deprecated in vLLM; use ``lora_name``).
        medium: where the blocks live (``"GPU"``, ``"CPU"``, ``"STORAGE"``).
        lora_name: the LoRA adapter's name.
        extra_keys: per block, the untagged extra keys of its hash (LoRA name,
            ``(mm_identifier, offset)`` pairs, cache salt in block 0, prompt-embedding
            digests) or ``None``.
        group_idx: the KV-cache group (hybrid models have several).
        kv_cache_spec_kind: the group's attention kind, e.g. ``"full_attention"``.
        kv_cache_spec_sliding_window: the group's window, for sliding-window groups.
        locality: ``"LOCAL"`` or ``"REMOTE"`` relative to the publisher.
        ownership: the secondary offloading tier that produced the event.
        session_id: the session whose request stored (or re-reported) the blocks.
        lookahead_token_ids: per block, the tokens after it its hash covers.
    """

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left the prefix cache (one event per evicted hash in vLLM)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset (vLLM ``reset_prefix_cache``)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared
"""One event of a batch, as vLLM's ``KVEventBatch.events`` holds them."""


class KVEventBatch(EventBatch):
    """An :class:`EventBatch` whose events are the three KV-cache events."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
