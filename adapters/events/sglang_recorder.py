"""An index event sink that queues SGLang 0.5.23 KV events, as SGLang's ``RadixCache`` does.

The radix tree calls ``on_stored`` once per new node (its page digests, chained to its
parent's last page), ``on_removed`` once per evicted node and ``on_cleared`` on reset;
this recorder turns the calls into the events SGLang's ``KVCacheEventRecorder`` queues
(``record_store``, ``record_remove``, ``record_all_cleared``) and hands them out with
``take_events``, like ``RadixCache.take_events``:

* a page digest becomes SGLang's wire hash: its first 8 bytes as a *signed* int
  (``hash_str_to_int64``);
* each page is one ``BlockStored``, merged into the queue's last event when it
  continues that event's chain with the same medium, block size, salt and LoRA
  (``KVCacheEventRecorder.enqueue``), so a node's pages make one event; consecutive
  removals merge likewise;
* the namespace's ``cache_salt`` is published in ``BlockStored.cache_salt`` (the page
  digests are already salted, :mod:`prefixkv.indexes.sglang_hashing`);
* a new recorder starts with ``AllBlocksCleared`` queued, as a new ``RadixCache``
  (whose constructor calls ``reset``) does.

Not reproduced: SGLang's LoRA-name namespacing of event hashes and its Dynamo event
format, which need SGLang's adapter registry (every ``lora_name`` is ``None``, as in
SGLang when no adapter name is registered).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.indexes.sglang_hashing import to_event_hash, to_event_hashes
from prefixkv.indexes.tokens import ExtraKey

from .codec import to_vllm_event
from .sglang_wire import (
    SGLangAllBlocksCleared,
    SGLangBlockRemoved,
    SGLangBlockStored,
    SGLangEventBatch,
)
from .wire import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

__all__ = ["SGLangEventRecorder"]

SGLangEvent = SGLangBlockStored | SGLangBlockRemoved | SGLangAllBlocksCleared


def _cache_salt(extra_key: ExtraKey | None) -> str | None:
    # SGLang's RadixKey keeps ``cache_salt or None``.
    for kind, value in extra_key or ():
        if kind == "cache_salt" and value != "":
            return str(value)
    return None


class SGLangEventRecorder:
    """Queues SGLang 0.5.23 events for a radix tree's sink calls (``enable_kv_cache_events``).

    Args:
        medium: the ``medium`` of every event (SGLang's ``StorageMedium``, ``"GPU"``
            for the device tree).
        announce_start: queue ``AllBlocksCleared`` first, as a freshly built SGLang
            ``RadixCache`` does (its constructor resets the tree).
    """

    __slots__ = ("_queue", "medium")

    def __init__(self, *, medium: str = MEDIUM_GPU, announce_start: bool = True) -> None:
        self.medium = medium
        self._queue: list[SGLangEvent] = [SGLangAllBlocksCleared()] if announce_start else []

    def _enqueue(self, event: SGLangEvent) -> None:
        # KVCacheEventRecorder.enqueue: merge into a compatible queue tail.
        if self._queue:
            tail = self._queue[-1]
            if isinstance(tail, SGLangBlockRemoved) and isinstance(event, SGLangBlockRemoved):
                if tail.medium == event.medium:
                    tail.block_hashes.extend(event.block_hashes)
                    return
            elif (
                isinstance(tail, SGLangBlockStored)
                and isinstance(event, SGLangBlockStored)
                and tail.medium == event.medium
                and tail.lora_id == event.lora_id
                and tail.block_size == event.block_size
                and tail.cache_salt == event.cache_salt
                and tail.session_id == event.session_id
                and tail.lora_name == event.lora_name
                and tail.block_hashes
                and event.parent_block_hash == tail.block_hashes[-1]
            ):
                tail.block_hashes.extend(event.block_hashes)
                tail.token_ids.extend(event.token_ids)
                return
        self._queue.append(event)

    def on_stored(
        self,
        block_hashes: Sequence[bytes],
        parent_block_hash: bytes | None,
        token_ids: Sequence[int],
        block_size: int,
        extra_key: ExtraKey | None,
    ) -> None:
        """A node's pages were cached (``record_store``).

        SGLang enqueues one ``BlockStored`` per page; a node's pages chain and share
        every field, so after the first each merges into the one before: the node is
        enqueued here as that merged event (which itself may merge into the tail).
        """
        if not block_hashes:
            return
        self._enqueue(
            SGLangBlockStored(
                block_hashes=to_event_hashes(block_hashes),
                parent_block_hash=None
                if parent_block_hash is None
                else to_event_hash(parent_block_hash),
                token_ids=list(token_ids[: len(block_hashes) * block_size]),
                block_size=block_size,
                lora_id=None,
                medium=self.medium,
                cache_salt=_cache_salt(extra_key),
            )
        )

    def on_removed(self, block_hashes: Sequence[bytes]) -> None:
        """A node was evicted (``record_remove``): one ``BlockRemoved`` for its pages."""
        if block_hashes:
            hashes = to_event_hashes(block_hashes)
            self._enqueue(SGLangBlockRemoved(block_hashes=hashes, medium=self.medium))

    def on_cleared(self) -> None:
        """The tree was reset (``record_all_cleared``)."""
        self._enqueue(SGLangAllBlocksCleared())

    def take_sglang_events(self) -> list[SGLangEvent]:
        """The queued events as SGLang's own structs, oldest first (the queue is emptied)."""
        events, self._queue = self._queue, []
        return events

    def take_events(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        """The queued events as vLLM structs (the codec's reading of SGLang's), oldest
        first; the queue is emptied. SGLang's ``cache_salt`` is not carried (the hashes
        are salted already)."""
        return [to_vllm_event(e) for e in self.take_sglang_events()]

    def take_batch(self, ts: float, data_parallel_rank: int | None = None) -> KVEventBatch | None:
        """The queued events as one vLLM-struct batch, or None when there are none."""
        events = self.take_events()
        if not events:
            return None
        return KVEventBatch(ts=ts, events=events, data_parallel_rank=data_parallel_rank)

    def take_sglang_batch(
        self, ts: float, attn_dp_rank: int | None = None
    ) -> SGLangEventBatch | None:
        """The queued events as the batch SGLang's scheduler publishes, or None when
        there are none; it encodes to SGLang's bytes."""
        events = self.take_sglang_events()
        if not events:
            return None
        return SGLangEventBatch(ts=ts, events=events, attn_dp_rank=attn_dp_rank)
