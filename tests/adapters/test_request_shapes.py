"""The request shapes the vLLM engine class and SGLang's prefix cache read stay Python on both
builds: the protocols are runtime-checkable, and a driver may give a request attributes
of its own (vLLM's ``lora_request``), which the engine class honours.
"""

from __future__ import annotations

from types import SimpleNamespace

from prefixkv.adapters import requests, sglang, vllm
from prefixkv.adapters.requests import ReqLike, RequestLike, SimpleReq, SimpleRequest
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.sglang.simulated import alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager


def test_the_engine_classes_export_the_request_shapes_of_their_engine() -> None:
    assert vllm.SimpleRequest is SimpleRequest and vllm.RequestLike is RequestLike
    assert sglang.SimpleReq is SimpleReq and sglang.ReqLike is ReqLike
    assert SimpleRequest.__module__ == SimpleReq.__module__ == requests.__name__


def test_the_protocols_check_at_runtime() -> None:
    assert isinstance(SimpleRequest("a", [1, 2]), RequestLike)
    assert isinstance(SimpleReq("a", [1, 2]), ReqLike)
    assert not isinstance(object(), RequestLike)
    assert not isinstance(SimpleNamespace(rid="a"), ReqLike)


def test_a_lora_id_joins_the_extra_key_as_in_sglang_and_is_keyed_apart() -> None:
    # SGLang's Req appends lora_id to extra_key; the cache keys the LoRA id apart too,
    # so a base-model request whose extra_key spells the same string misses.
    assert SimpleReq("a", [1], lora_id="sql").extra_key == "sql"
    assert SimpleReq("a", [1], extra_key="t-", lora_id="sql").extra_key == "t-sql"
    for fold in (False, True):
        cache = PrefixCache.create_simulated("radix", capacity_tokens=64, fold_lora=fold)
        done = SimpleReq("a", [1, 2, 3, 4], lora_id="sql")
        assert alloc_for_extend(cache, done) == 0
        done.output_ids.append(5)
        cache.cache_finished_req(done)
        assert cache.match_req(SimpleReq("b", [1, 2, 3, 4, 6], lora_id="sql")).prefix_len == 4
        # SGLang's own rule (fold_lora, inside SGLang): the string alone is the namespace.
        base = cache.match_prefix([1, 2, 3, 4], extra_key="sql").prefix_len
        assert base == (4 if fold else 0)
        assert cache.match_prefix([1, 2, 3, 4]).prefix_len == 0


def test_a_lora_set_on_a_simple_request_is_its_namespace() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=17, block_size=2)
    prompt = [1, 2, 3, 4, 5]
    hits = []
    for rid, lora in (("a", None), ("b", "sql"), ("c", None), ("d", "sql"), ("e", "chat")):
        req = SimpleRequest(rid, list(prompt))
        if lora is not None:
            req.lora_request = SimpleNamespace(  # type: ignore[attr-defined]
                lora_name=lora, lora_int_id=1, lora_path=f"/loras/{lora}"
            )
        blocks, hit, _ = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
        req.num_computed_tokens = req.num_tokens
        kv.free(req)
        hits.append(hit)
    assert hits == [0, 0, 4, 4, 0]


def test_a_driver_may_tag_a_simple_req() -> None:
    cache = PrefixCache.create_simulated("radix", capacity_tokens=64)
    req = SimpleReq("a", [1, 2, 3])
    req.arrival = 0.5  # type: ignore[attr-defined]
    assert alloc_for_extend(cache, req) == 0
    cache.cache_finished_req(req)
    assert req.arrival == 0.5  # type: ignore[attr-defined]
