"""A caller of prefixkv's public API, type-checked by ``tests/test_typed_api.py`` with
``mypy --strict``: every entry point takes and returns precise types (never ``Any``).
Never run."""

from __future__ import annotations

from typing_extensions import assert_type

from prefixkv.adapters import CacheManager
from prefixkv.adapters.requests import SimpleRequest
from prefixkv.adapters.sglang import PrefixCache, PrefixNode
from prefixkv.adapters.vllm import KVCacheManager
from prefixkv.indexes import (
    ExtraKey,
    HashChainIndex,
    PrefixMatch,
    RadixIndex,
    TokenKey,
    make_block_hasher,
    make_extra_key,
)
from prefixkv.storage import BlockAllocator, Owner

index = HashChainIndex(16, seed=0, verify=True)
radix = RadixIndex(4, check_block_ids=False)
key = TokenKey(range(64))
assert_type(index.match_prefix(key, 32), PrefixMatch)
assert_type(radix.cached_blocks(key, None), list[int])
assert_type(index.evict(2), list[int])
assert_type(make_extra_key(lora="sql", cache_salt=7), ExtraKey | None)
make_block_hasher(16, "sha256", seed=b"x")

allocator = BlockAllocator(64)
assert_type(allocator.allocate(3), list[int] | None)
assert_type(allocator.owner_of(0), Owner)
assert_type(allocator.is_free(1), bool)

manager = CacheManager(index, allocator, enable_kv_cache_events=True)
admission = manager.admit("r", range(40), "tenant-a", priority=1, reserve_blocks=1)
assert_type(manager.advance("r", 41, tokens=[1], swap_duplicates=False), list[int] | None)
assert_type(manager.append("r", [2], num_slots=1), bool)
manager.finish("r", split_at_prompt=False)
assert_type(manager.evict(1), int)

cache = PrefixCache.create_simulated("radix", capacity_tokens=4096, page_size=1)
match = cache.match_prefix([1, 2, 3], "lora-a", None, max_prefix_len=2)
assert_type(cache.insert([1, 2], [5, 6], extra_key="lora-a"), int)
assert_type(cache.evict(8), int)
node = cache.lock(match.last_node)
assert_type(node, PrefixNode)
cache.unlock(node)

vllm = KVCacheManager("hash_chain", 128, 16, max_model_len=2048, watermark=0.01)
request = SimpleRequest("v", list(range(20)))
assert_type(vllm.get_computed_blocks(request, 16)[1], int)
vllm.allocate_slots(request, 20, num_lookahead_tokens=0, delay_cache_blocks=False)
