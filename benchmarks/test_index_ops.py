"""Index operations head to head: match_prefix, insert, evict, a whole request, hashing.

Per backend x prompt length x cache size. What the tables show (benchmarks/README.md,
"Index operations"): the hash chain's lookup stays flat as the cache grows (one dict
probe per block) and grows with the matched length for both backends; eviction
costs O(log n) per leaf in the radix tree and O(1) per block in the hash chain.

    make bench                         # medium sizes
    PREFIXKV_BENCH=full make bench     # the README's sizes
"""

from __future__ import annotations

import pytest
from conftest import CACHE_BLOCKS, PROMPT_LENS, per_second, tokens
from pytest_benchmark.fixture import BenchmarkFixture

from prefixkv.adapters import CacheManager
from prefixkv.indexes import PrefixIndex, TokenKey, make_block_hasher, make_index
from prefixkv.indexes.registry import pool_owned_options
from prefixkv.storage import BlockAllocator

BACKENDS = [("hash_chain", 16), ("radix", 1), ("radix", 16)]


def build(name: str, bs: int) -> PrefixIndex:
    return make_index(name, block_size=bs, **pool_owned_options(name))


def filled(name: str, bs: int, cache_blocks: int, seq_tokens: int = 512) -> PrefixIndex:
    """An index holding ``cache_blocks`` blocks of unrelated sequences (the "cache size")."""
    index = build(name, bs)
    per_seq = max(1, seq_tokens // bs)
    next_block = 10_000_000  # far from the ids the measured operation uses
    for s in range(cache_blocks // per_seq):
        key = TokenKey(tokens(per_seq * bs, seed=1_000_000 + s))
        index.insert(key, list(range(next_block, next_block + per_seq)))
        next_block += per_seq
    return index


@pytest.mark.parametrize("cache_blocks", CACHE_BLOCKS)
@pytest.mark.parametrize("prompt_len", PROMPT_LENS)
@pytest.mark.parametrize(("name", "bs"), BACKENDS, ids=[f"{n}-{b}" for n, b in BACKENDS])
def test_match_prefix(
    benchmark: BenchmarkFixture, name: str, bs: int, prompt_len: int, cache_blocks: int
) -> None:
    """A full hit of ``prompt_len`` tokens against a cache of ``cache_blocks`` blocks."""
    index = filled(name, bs, cache_blocks)
    prompt = tokens(prompt_len, seed=7)
    index.insert(TokenKey(prompt), list(range(-(-prompt_len // bs))))
    key = TokenKey(prompt)
    index.match_prefix(key)  # memoizes the key's hashes: this measures the lookup alone
    m = benchmark(index.match_prefix, key)
    assert m.num_tokens == prompt_len // bs * bs
    per_second(benchmark, prompt_len, "tokens")


@pytest.mark.parametrize("prompt_len", PROMPT_LENS)
@pytest.mark.parametrize(("name", "bs"), BACKENDS, ids=[f"{n}-{b}" for n, b in BACKENDS])
def test_insert(benchmark: BenchmarkFixture, name: str, bs: int, prompt_len: int) -> None:
    """Registering a fresh ``prompt_len``-token sequence (hashes included for the chain)."""
    prompt = tokens(prompt_len, seed=8)
    ids = list(range(-(-prompt_len // bs)))

    def setup() -> tuple[tuple[PrefixIndex, TokenKey, list[int]], dict[str, object]]:
        return (build(name, bs), TokenKey(prompt), ids), {}

    benchmark.pedantic(lambda i, k, b: i.insert(k, b), setup=setup, rounds=30)


@pytest.mark.parametrize("cache_blocks", CACHE_BLOCKS[1:])
@pytest.mark.parametrize(("name", "bs"), BACKENDS, ids=[f"{n}-{b}" for n, b in BACKENDS])
def test_evict(benchmark: BenchmarkFixture, name: str, bs: int, cache_blocks: int) -> None:
    """Evicting 64 blocks from a cache of ``cache_blocks`` unlocked blocks."""

    def setup() -> tuple[tuple[PrefixIndex], dict[str, object]]:
        return (filled(name, bs, cache_blocks, seq_tokens=64 * bs),), {}

    out = benchmark.pedantic(lambda i: i.evict(64), setup=setup, rounds=5)
    assert len(out) >= 64


@pytest.mark.parametrize("prompt_len", PROMPT_LENS[:4])
@pytest.mark.parametrize(
    ("name", "bs"),
    [*BACKENDS, ("none", 16)],
    ids=[f"{n}-{b}" for n, b in [*BACKENDS, ("none", 16)]],
)
def test_request_lifecycle(
    benchmark: BenchmarkFixture, name: str, bs: int, prompt_len: int
) -> None:
    """admit -> commit -> 16 decode tokens -> finish, half the prompt shared."""
    shared = tokens(prompt_len // 2, seed=9)
    m = CacheManager(build(name, bs), BlockAllocator(4 * (prompt_len + 64) // bs + 64))
    counter = iter(range(10**9))

    def one() -> None:
        rid = next(counter)
        prompt = shared + tokens(prompt_len - len(shared), seed=rid)
        m.admit(rid, prompt)
        m.commit(rid, len(prompt))
        for t in range(16):
            m.append(rid, [t + 1])
            m.commit(rid, len(prompt) + t + 1)
        m.finish(rid)

    benchmark(one)
    m.check_invariants()


@pytest.mark.parametrize("prompt_len", PROMPT_LENS)
@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256_raw", "sha256", "sha256_cbor"])
def test_hashing(benchmark: BenchmarkFixture, algorithm: str, prompt_len: int) -> None:
    """Chained block hashes of a whole prompt (the README's tokens/s figure at 32K);
    ``sha256``/``sha256_cbor`` are vLLM's (a pickle or CBOR encoding per block)."""
    hasher = make_block_hasher(16, algorithm, seed=0)
    prompt = tokens(prompt_len, seed=10)
    key = TokenKey(prompt)
    benchmark(lambda: hasher.extend([], key.tokens, None))
    per_second(benchmark, prompt_len, "tokens")


@pytest.mark.parametrize("path", ["request", "warm"])
@pytest.mark.parametrize("verify", [False, True])
def test_verify_cost_on_lookup(benchmark: BenchmarkFixture, verify: bool, path: str) -> None:
    """The hash chain's lookup with and without ``verify`` (goal: <= 15% slower).

    ``request``: what an engine pays per new request (key, hashes, probes);
    ``warm``: the probes alone, hashes memoized (verify's worst case).
    """
    index = make_index("hash_chain", block_size=16, verify=verify, seed=0)
    prompt = tokens(PROMPT_LENS[-1], seed=11)
    index.insert(TokenKey(prompt), list(range(len(prompt) // 16)))
    if path == "request":
        benchmark(lambda: index.match_prefix(TokenKey(prompt)))
    else:
        key = TokenKey(prompt)
        benchmark(index.match_prefix, key)
