"""An index event sink that queues vLLM 0.33 KV events, as vLLM's ``BlockPool`` does.

An index with an event sink calls ``on_stored`` when full blocks become cached (one
call per chain of new blocks), ``on_removed`` when blocks leave the cache, and
``on_cleared`` on reset, with raw digests and the request's namespace; this recorder
turns the calls into the exact events vLLM queues (``cache_full_blocks``,
``_emit_block_removed_events``, ``reset_prefix_cache``) and hands them out with
``take_events``, like ``KVCacheManager.take_events``:

* hashes become vLLM's wire ints (the digest's low 64 bits, ``maybe_convert_block_hash``);
* a namespace becomes ``lora_name``/``lora_id`` and per-block untagged ``extra_keys``
  (LoRA name in every block, cache salt and keys vLLM lacks in block 0);
* one ``BlockRemoved`` per hash, as vLLM emits one per evicted block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefixkv.indexes.tokens import ExtraKey
from prefixkv.indexes.vllm_hashing import (
    block_extra_keys,
    to_external_block_hash,
    to_external_block_hashes,
)

from .wire import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEventBatch,
)

__all__ = ["VllmEventRecorder", "event_extra_keys"]

KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def event_extra_keys(
    extra_key: ExtraKey | None, first_block: int, num_blocks: int
) -> list[tuple[Any, ...] | None]:
    """The per-block ``extra_keys`` a vLLM ``BlockStored`` carries (``to_event_extra_keys``).

    Each block's hash extra keys (:func:`~prefixkv.indexes.vllm_hashing.block_extra_keys`)
    with vLLM's tags dropped: ``("lora", name, path)`` -> ``name``, ``("cache_salt", s)``
    -> ``s``. Kinds vLLM lacks (``tenant``, ``extra``, ...) keep their ``(kind, value)``
    pair, so a consumer keyed by content never takes a tenant ``"a"`` for a salt ``"a"``
    (no vLLM engine publishes them).
    """
    if num_blocks <= 0:
        return []
    if extra_key is None:
        return [None] * num_blocks
    # Block 0 differs from the rest (its salt); every later block is alike.
    later = block_extra_keys(extra_key, 1)
    out = [None if later is None else _untagged(later)] * num_blocks
    if first_block == 0:
        keys = block_extra_keys(extra_key, 0)
        out[0] = None if keys is None else _untagged(keys)
    return out


_VLLM_TAGS = frozenset({"lora", "cache_salt"})


def _untagged(keys: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(k[1] if k[0] in _VLLM_TAGS else k for k in keys)


class VllmEventRecorder:
    """Queues vLLM 0.33 events for an index's sink calls (``enable_kv_cache_events``).

    Args:
        medium: the ``medium`` of every event (vLLM's ``BlockPool(medium=...)``).
        group_idx: the KV-cache group (prefixkv indexes hold one).
        kv_cache_spec_kind: the group's kind, stamped on ``BlockStored`` by vLLM's
            ``KVCacheManager.take_events``.
        int_hashes: wire hashes as 64-bit ints (vLLM's default,
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) or the raw digests.
    """

    __slots__ = ("_events", "group_idx", "int_hashes", "kv_cache_spec_kind", "medium")

    def __init__(
        self,
        *,
        medium: str = MEDIUM_GPU,
        group_idx: int = 0,
        kv_cache_spec_kind: str | None = "full_attention",
        int_hashes: bool = True,
    ) -> None:
        self.medium = medium
        self.group_idx = group_idx
        self.kv_cache_spec_kind = kv_cache_spec_kind
        self.int_hashes = int_hashes
        self._events: list[KVEvent] = []

    def _wire(self, digest: bytes) -> bytes | int:
        return to_external_block_hash(digest) if self.int_hashes else digest

    def _wire_all(self, digests: Sequence[bytes]) -> list[ExternalBlockHash]:
        if self.int_hashes:
            return list(to_external_block_hashes(digests))
        return list(digests)

    def on_stored(
        self,
        block_hashes: Sequence[bytes],
        parent_block_hash: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        extra_key: ExtraKey | None,
    ) -> None:
        """Full blocks were cached, as one chain after ``parent_block_hash``.

        ``parent_block_hash`` is the digest of the block before the first one, ``None``
        when the chain starts at the sequence's block 0; ``token_ids`` are the new
        blocks' tokens; ``extra_key`` is the sequence's namespace.
        """
        fields = dict(extra_key) if extra_key else {}
        lora = fields.get("lora")
        lora_id = fields.get("lora_id")
        self._events.append(
            BlockStored(
                block_hashes=self._wire_all(block_hashes),
                parent_block_hash=None
                if parent_block_hash is None
                else self._wire(parent_block_hash),
                token_ids=list(token_ids),
                block_size=block_size,
                lora_id=lora_id if isinstance(lora_id, int) else None,
                medium=self.medium,
                lora_name=None if lora is None else str(lora),
                extra_keys=event_extra_keys(
                    extra_key, 0 if parent_block_hash is None else 1, len(block_hashes)
                ),
                group_idx=self.group_idx,
                kv_cache_spec_kind=self.kv_cache_spec_kind,
            )
        )

    def on_removed(self, block_hashes: Sequence[bytes]) -> None:
        """Blocks left the cache: one ``BlockRemoved`` per hash, in order."""
        wire = self._wire_all(block_hashes)
        medium, group = self.medium, self.group_idx
        self._events += [BlockRemoved([h], medium, group_idx=group) for h in wire]

    def on_cleared(self) -> None:
        """The cache was reset."""
        self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVEvent]:
        """The events queued since the last call, oldest first (the queue is emptied)."""
        events, self._events = self._events, []
        return events

    def take_batch(self, ts: float, data_parallel_rank: int | None = None) -> KVEventBatch | None:
        """The queued events as one batch, or None when there are none (vLLM's scheduler
        publishes no empty batch)."""
        events = self.take_events()
        if not events:
            return None
        return KVEventBatch(ts=ts, events=events, data_parallel_rank=data_parallel_rank)
