"""vLLM-identical block hashes: golden values recorded from vLLM 0.33 itself.

``tests/data/events/vllm_block_hashes.json`` comes from
``benchmarks/peers/record_kv_event_fixtures.py`` (vLLM's own ``Request`` and
``get_request_block_hasher``); these tests recompute every hash with
``VllmBlockHasher`` and compare bytes and wire integers.
"""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest

from prefixkv.indexes import TokenKey
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.tokens import ExtraKey, normalize_extra_key
from prefixkv.indexes.vllm_hashing import (
    DEFAULT_NONE_HASH_SEED,
    VllmBlockHasher,
    block_extra_keys,
    hash_block_tokens,
    none_hash,
    resolve_none_hash_seed,
    sha256_cbor,
    to_external_block_hash,
)

GOLDEN = json.loads(
    (Path(__file__).parent / "data" / "events" / "vllm_block_hashes.json").read_text()
)
CASES = [
    pytest.param(case, req, id=f"{case['algorithm']}-seed{case['pythonhashseed']}-r{i}")
    for case in GOLDEN["cases"]
    for i, req in enumerate(case["requests"])
]


def namespace_of(req: dict[str, Any]) -> ExtraKey | None:
    """The prefixkv namespace of a golden request (LoRA name and path, cache salt)."""
    parts: list[tuple[str, str | int]] = []
    if "lora" in req:
        parts += [("lora", req["lora"]["name"]), ("lora_path", req["lora"]["path"])]
    if "cache_salt" in req:
        parts.append(("cache_salt", req["cache_salt"]))
    return normalize_extra_key(tuple(parts)) if parts else None


@pytest.mark.parametrize(("case", "req"), CASES)
def test_hashes_equal_vllm(case: dict[str, Any], req: dict[str, Any]) -> None:
    hasher = VllmBlockHasher(GOLDEN["block_size"], case["algorithm"], case["none_hash_seed"])
    assert hasher.root.hex() == case["none_hash"]
    hashes: list[bytes] = []
    hasher.extend(hashes, array("I", req["tokens"]), namespace_of(req))
    assert [h.hex() for h in hashes] == req["block_hashes"]
    assert [to_external_block_hash(h) for h in hashes] == req["external"]


def test_none_hash_seed_follows_vllms_rule() -> None:
    # PYTHONHASHSEED wins; else the fixed seed for sha256 and a random one for xxhash.
    assert resolve_none_hash_seed("sha256_cbor", {"PYTHONHASHSEED": "7"}) == "7"
    assert resolve_none_hash_seed("xxhash", {"PYTHONHASHSEED": "7"}) == "7"
    assert resolve_none_hash_seed("sha256", {}) == DEFAULT_NONE_HASH_SEED
    a, b = resolve_none_hash_seed("xxhash_cbor", {}), resolve_none_hash_seed("xxhash_cbor", {})
    assert a != b and len(a) == 64
    unseeded = next(c for c in GOLDEN["cases"] if c["pythonhashseed"] is None)
    assert none_hash(unseeded["algorithm"], DEFAULT_NONE_HASH_SEED).hex() == unseeded["none_hash"]


def test_hasher_reads_pythonhashseed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    assert VllmBlockHasher(4, "sha256").none_hash_seed == "1234"
    monkeypatch.delenv("PYTHONHASHSEED")
    assert VllmBlockHasher(4, "sha256").none_hash_seed == DEFAULT_NONE_HASH_SEED


def test_extra_keys_per_block() -> None:
    ns = normalize_extra_key(
        (("lora", "sql"), ("lora_path", "/a"), ("cache_salt", "s"), ("tenant", "t"))
    )
    assert block_extra_keys(ns, 0) == (("lora", "sql", "/a"), ("cache_salt", "s"), ("tenant", "t"))
    assert block_extra_keys(ns, 3) == (("lora", "sql", "/a"),)
    assert block_extra_keys(None, 0) is None
    assert block_extra_keys((("cache_salt", ""),), 0) is None  # vLLM skips an empty salt
    assert block_extra_keys((("cache_salt", "s"),), 1) is None
    # a lone path (no LoRA name) has no vLLM meaning: kept as a block-0 key
    assert block_extra_keys((("lora_path", "/a"),), 0) == (("lora_path", "/a"),)
    # vLLM hashes a LoRA by name and path, not by its int id
    with_id = normalize_extra_key((("lora", "sql"), ("lora_id", 3), ("lora_path", "/a")))
    assert block_extra_keys(with_id, 0) == (("lora", "sql", "/a"),)


def test_incremental_equals_whole_and_matches_the_formula() -> None:
    hasher = VllmBlockHasher(4, "sha256_cbor", "0")
    tokens = array("I", range(1, 15))
    whole: list[bytes] = []
    hasher.extend(whole, tokens, None)
    parts: list[bytes] = []
    for end in (3, 4, 9, 14):
        hasher.extend(parts, tokens[:end], None)
    assert parts == whole and len(whole) == 3
    assert whole[0] == hash_block_tokens(sha256_cbor, hasher.root, [1, 2, 3, 4])
    assert whole[1] == sha256_cbor((whole[0], (5, 6, 7, 8), None))


def test_token_key_memo_uses_the_hasher() -> None:
    hasher = VllmBlockHasher(4, "sha256", "0")
    key = TokenKey(range(10), extra_key=(("cache_salt", "x"),))
    expected: list[bytes] = []
    hasher.extend(expected, key.tokens, key.extra_key)
    assert key.block_hashes(hasher) == expected


def test_namespaces_without_vllm_equivalent_stay_isolated() -> None:
    hasher = VllmBlockHasher(4, "sha256_cbor", "0")
    tokens = array("I", range(8))
    out = {}
    for ns in (None, (("tenant", "a"),), (("tenant", "b"),), (("extra", "a"),)):
        hashes: list[bytes] = []
        hasher.extend(hashes, tokens, ns)
        out[ns] = hashes
    assert len({tuple(h) for h in out.values()}) == 4


def test_external_hash_is_the_low_64_bits() -> None:
    digest = bytes(range(32))
    assert to_external_block_hash(digest) == int.from_bytes(digest[-8:], "big")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0},
        {"block_size": 4, "algorithm": "md5"},
        {"block_size": 4, "none_hash_seed": 0},
    ],
)
def test_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(PrefixKVError):
        VllmBlockHasher(**kwargs)
