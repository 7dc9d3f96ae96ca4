"""KV events of a hash-chain replica until ``CacheManager(enable_kv_cache_events=True)``.

Wraps the index so that each newly registered run of blocks, each eviction and each
reset reaches a :class:`VllmEventRecorder`, giving the events vLLM queues. To be
replaced by the manager's own ``take_events`` (same events) when it lands.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prefixkv.adapters.events.recorder import VllmEventRecorder
from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes.base import CacheHandle, InsertResult, PrefixIndex
from prefixkv.indexes.hash_chain import HashChainIndex
from prefixkv.indexes.tokens import TokenKey
from prefixkv.indexes.wrapper import IndexWrapper
from prefixkv.storage.allocator import BlockAllocator

__all__ = ["manager_with_events"]


class _Recording(IndexWrapper):
    def __init__(self, inner: HashChainIndex, recorder: VllmEventRecorder) -> None:
        super().__init__(inner)
        self.chain = inner
        self.recorder = recorder
        self._digests: dict[int, bytes] = {}

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        bs = self.block_size
        num_full = (len(key) if num_tokens is None else num_tokens) // bs
        known = {b for b in block_ids[:num_full] if self.chain.is_cached(b)}
        result = self.chain.insert(key, block_ids, num_tokens, prefix)
        hashes = key.block_hashes(self.chain.hasher)
        i = 0
        while i < num_full:
            if block_ids[i] in known:
                i += 1
                continue
            j = i
            while j < num_full and block_ids[j] not in known:
                self._digests[block_ids[j]] = hashes[j]
                j += 1
            self.recorder.on_stored(
                hashes[i:j],
                hashes[i - 1] if i else None,
                key.tokens[i * bs : j * bs].tolist(),
                bs,
                key.extra_key,
            )
            i = j
        return result

    def _removed(self, ids: Iterable[int]) -> None:
        self.recorder.on_removed([self._digests.pop(b) for b in ids if b in self._digests])

    def evict(self, num_blocks: int) -> list[int]:
        ids = self.chain.evict(num_blocks)
        self._removed(ids)
        return ids

    def evict_blocks(self, block_ids: Iterable[int]) -> list[int]:
        ids = self.chain.evict_blocks(block_ids)
        self._removed(ids)
        return ids

    def reset(self) -> list[int]:
        ids = self.chain.reset()
        self._digests.clear()
        self.recorder.on_cleared()
        return ids

    def __getattr__(self, name: str) -> Any:
        return super().__getattr__(name)


def manager_with_events(
    index: PrefixIndex, allocator: BlockAllocator, events: bool
) -> tuple[CacheManager, PrefixIndex, Callable[[], list[Any]]]:
    """A manager over ``index`` and a function taking its queued events."""
    if not events or not isinstance(index, HashChainIndex):
        return CacheManager(index, allocator), index, list
    recorder = VllmEventRecorder()
    wrapped = _Recording(index, recorder)
    return CacheManager(wrapped, allocator), wrapped, recorder.take_events
