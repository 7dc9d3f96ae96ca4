"""Guarantees against wrong and cross-tenant hits: namespaces (cache salt, LoRA,
tenant) in both backends and both engine classes, typed namespace keys, hash-collision
verification, and the thread-safe wrapper."""

from __future__ import annotations

import contextlib
import random
import threading
import time

import pytest

from prefixkv.adapters import CacheManager
from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import (
    HashChainIndex,
    RadixIndex,
    SynchronizedIndex,
    TokenKey,
    make_extra_key,
    make_index,
)
from prefixkv.storage import BlockAllocator

PROMPT = [random.Random(5).randrange(1, 32000) for _ in range(64)]
BACKENDS = [("hash_chain", 16), ("hash_chain", 1), ("radix", 1), ("radix", 16)]


def served(m: CacheManager, rid: str, tokens: list[int], extra: object = None) -> int:
    adm = m.admit(rid, tokens, extra)  # type: ignore[arg-type]
    assert adm is not None
    m.commit(rid, len(tokens))
    m.finish(rid)
    return adm.hit_tokens


@pytest.mark.parametrize(("name", "bs"), BACKENDS)
def test_tenant_b_never_hits_tenant_a_through_the_manager(name: str, bs: int) -> None:
    m = CacheManager(make_index(name, block_size=bs), BlockAllocator(4096 // bs))
    a, b = make_extra_key(tenant="a"), make_extra_key(tenant="b")
    assert served(m, "a1", PROMPT, a) == 0
    assert served(m, "b1", PROMPT, b) == 0
    assert served(m, "shared", PROMPT) == 0
    assert served(m, "a2", PROMPT, a) > 0
    m.check_invariants()


@pytest.mark.parametrize(("name", "bs"), BACKENDS)
def test_cache_salt_isolates_through_the_vllm_engine_class(name: str, bs: int) -> None:
    kv = KVCacheManager(make_index(name, block_size=bs), num_blocks=4096 // bs + 1)

    def run(rid: str, salt: str | None) -> int:
        req = SimpleRequest(rid, list(PROMPT), cache_salt=salt)
        blocks, hit, _ = kv.get_computed_blocks(req)
        assert kv.allocate_slots(req, req.num_tokens - hit, hit, blocks) is not None
        kv.free(req)
        return hit

    assert run("a1", "alice") == 0
    assert run("b1", "bob") == 0
    assert run("n1", None) == 0
    assert run("a2", "alice") > 0


@pytest.mark.parametrize(("name", "bs"), BACKENDS)
def test_extra_key_isolates_through_the_sglang_cache(name: str, bs: int) -> None:
    cache = PrefixCache.create_simulated(make_index(name, block_size=bs), capacity_tokens=4096)

    def run(rid: str, **ns: str) -> int:
        req = SimpleReq(rid, PROMPT, **ns)  # type: ignore[arg-type]
        hit = alloc_for_extend(cache, req)
        assert hit is not None
        req.output_ids.append(1)
        cache.cache_finished_req(req)
        return hit

    assert run("a1", extra_key="lora-x") == 0
    assert run("b1", cache_salt="lora-x") == 0  # same string, other kind: no hit
    assert run("c1", extra_key="lora-y") == 0
    assert run("a2", extra_key="lora-x") > 0
    assert run("e1", extra_key="") == 0  # "" is a namespace of its own, as in SGLang
    assert run("s1", extra_key="lora-x", cache_salt="") > 0  # an empty salt is no salt


def test_a_lora_and_a_salt_with_the_same_string_are_different_namespaces() -> None:
    lora, salt = make_extra_key(lora="x"), make_extra_key(cache_salt="x")
    assert lora != salt
    chain = HashChainIndex(4, seed=0)
    chain.insert(TokenKey([1, 2, 3, 4], lora), [0])
    assert chain.match_prefix(TokenKey([1, 2, 3, 4, 5], salt)).num_tokens == 0
    tree = RadixIndex(1)
    tree.insert(TokenKey([1, 2, 3, 4], lora), [0, 1, 2, 3])
    assert tree.match_prefix(TokenKey([1, 2, 3, 4, 5], salt)).num_tokens == 0


def _colliding(data: bytes) -> bytes:
    # Every block of every sequence gets one hash: the worst possible collision.
    return b"\x00" * 16


@pytest.mark.parametrize(("verify", "wrong_hit"), [(False, True), (True, False)])
def test_verify_turns_hash_collisions_into_misses(verify: bool, wrong_hit: bool) -> None:
    index = HashChainIndex(4, hash_algorithm=_colliding, seed=0, verify=verify)
    m = CacheManager(index, BlockAllocator(64))
    served(m, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hit = served(m, "b", [9, 9, 9, 9, 8, 8, 8, 8, 7])  # other content, same hashes
    assert (hit > 0) is wrong_hit
    # With verify, equal content still hits (the colliding hash is not a miss by itself).
    assert served(m, "c", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8
    m.check_invariants()


def test_verify_checks_the_parent_so_a_collision_deeper_in_the_chain_misses() -> None:
    index = HashChainIndex(2, hash_algorithm=_colliding, seed=0, verify=True)
    index.insert(TokenKey([1, 1, 5, 5]), [0, 1])
    index.insert(TokenKey([2, 2, 7, 7]), [2, 3])
    # Same second block [5, 5] as the first sequence, after a different first block.
    m = index.match_prefix(TokenKey([2, 2, 5, 5, 9]))
    assert m.num_tokens == 2 and m.block_ids == [2]


class _Probe:
    """Delegates to a real index and records how many threads are inside at once."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.block_size = inner.block_size  # type: ignore[attr-defined]
        self.inside = 0
        self.max_inside = 0
        self._count = threading.Lock()

    def __getattr__(self, name: str) -> object:
        method = getattr(self.inner, name)

        def call(*args: object, **kwargs: object) -> object:
            with self._count:
                self.inside += 1
                self.max_inside = max(self.max_inside, self.inside)
            time.sleep(0.0002)  # widen the window a race would need
            try:
                return method(*args, **kwargs)
            finally:
                with self._count:
                    self.inside -= 1

        return call


def _hammer(index: SynchronizedIndex) -> None:
    def worker(tid: int) -> None:
        rng = random.Random(tid)
        for _ in range(40):
            key = TokenKey([rng.randrange(1, 4) for _ in range(8)])
            index.match_prefix(key)
            index.stats()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("name", ["hash_chain", "radix"])
def test_synchronized_index_serializes_every_call(name: str) -> None:
    probe = _Probe(make_index(name, block_size=4))
    _hammer(SynchronizedIndex(probe))  # type: ignore[arg-type]
    assert probe.max_inside == 1
    # The probe does see overlap when nothing serializes the calls.
    unguarded = _Probe(make_index(name, block_size=4))
    broken = SynchronizedIndex(unguarded)  # type: ignore[arg-type]
    broken.mutex = contextlib.nullcontext()  # type: ignore[assignment]
    _hammer(broken)
    assert unguarded.max_inside > 1


@pytest.mark.parametrize("name", ["hash_chain", "radix"])
def test_synchronized_index_under_a_shared_manager(name: str) -> None:
    index = SynchronizedIndex(make_index(name, block_size=4))
    alloc = BlockAllocator(512)
    m = CacheManager(index, alloc)
    lock = index.mutex
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        rng = random.Random(tid)
        try:
            for i in range(150):
                prompt = [rng.randrange(1, 6) for _ in range(rng.randrange(4, 24))]
                with lock:  # the manager is single-threaded; the index is shared
                    adm = m.admit(f"{tid}-{i}", prompt)
                    if adm is not None:
                        m.commit(f"{tid}-{i}", len(prompt))
                        m.finish(f"{tid}-{i}")
                # A reader thread's lookups interleave with the writers' calls.
                index.match_prefix(TokenKey(prompt))
                index.stats()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    m.check_invariants()
    assert index.stats().num_locked_blocks == 0
