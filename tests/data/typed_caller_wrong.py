"""Wrong calls ``mypy --strict`` must reject (``tests/test_typed_api.py``): each line
that ends with ``# wrong`` is one error. Never run."""

from __future__ import annotations

from prefixkv.adapters import CacheManager
from prefixkv.adapters.sglang import PageRows, PrefixCache
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import (
    HashChainIndex,
    RadixIndex,
    TokenKey,
    make_block_hasher,
    make_extra_key,
)
from prefixkv.storage import BlockAllocator

make_block_hasher("16")  # wrong
RadixIndex(4).evict("2")  # wrong
HashChainIndex(16).match_prefix(TokenKey([1]), 2.5)  # wrong
make_extra_key(lora=["sql"])  # wrong
BlockAllocator(8).allocate(None)  # wrong
BlockAllocator(8).is_free("1")  # wrong
CacheManager(HashChainIndex(16), BlockAllocator(8)).finish("r", split_at_prompt="no")  # wrong
PrefixCache.create_simulated("radix", capacity_tokens=4096.0)  # wrong
PrefixCache.create_simulated("radix").match_prefix([1], extra_key=3)  # wrong
CacheManager(HashChainIndex(16), BlockAllocator(8)).commit("r", 1.5)  # wrong
HashChainIndex("16")  # wrong
BlockAllocator(num_blocks=8.0)  # wrong
CacheManager("radix", BlockAllocator(8))  # wrong
KVCacheManager(num_blocks="1024")  # wrong
KVCacheManager().allocate_slots(SimpleRequest("r", [1]), num_new_tokens="1")  # wrong
PageRows().read(0, 0, None)  # wrong
