"""vLLM-identical block hashes: golden values recorded from vLLM 0.33 itself.

``tests/data/events/vllm_block_hashes.json`` comes from
``tests/engines/recorders/record_kv_event_fixtures.py`` (vLLM's own ``Request`` and
``get_request_block_hasher``); these tests recompute every hash with
``VllmBlockHasher`` and compare bytes and wire integers.
"""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest
from helpers import TEST_DATA

from prefixkv.indexes import (
    BLOCK_HASH_ALGORITHMS,
    BlockHasher,
    HashChainIndex,
    TokenKey,
    make_block_hasher,
    make_extra_key,
    make_index,
)
from prefixkv.indexes.errors import InvalidTokenError, PrefixKVError
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

GOLDEN = json.loads((TEST_DATA / "events" / "vllm_block_hashes.json").read_text())
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


@pytest.mark.parametrize(("case", "req"), CASES)
def test_hash_chain_by_name_hashes_as_vllm(
    case: dict[str, Any], req: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # make_index's hash_algorithm and seed (vLLM's PYTHONHASHSEED), with the namespace
    # built by make_extra_key from vLLM's request fields.
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    index = make_index(
        "hash_chain",
        block_size=GOLDEN["block_size"],
        hash_algorithm=case["algorithm"],
        seed=case["pythonhashseed"],
    )
    assert isinstance(index, HashChainIndex)
    lora = req.get("lora")
    ns = make_extra_key(
        lora=lora and lora["name"],
        lora_path=lora and lora["path"],
        lora_id=lora and lora["id"],
        cache_salt=req.get("cache_salt"),
    )
    key = TokenKey(req["tokens"], ns)
    assert [h.hex() for h in key.block_hashes(index.hasher)] == req["block_hashes"]


def test_hash_algorithm_names() -> None:
    assert BLOCK_HASH_ALGORITHMS == (
        "xxh3_128",
        "sha256_raw",
        "sha256",
        "sha256_cbor",
        "xxhash",
        "xxhash_cbor",
    )
    assert isinstance(make_block_hasher(4, "sha256", seed=0), VllmBlockHasher)
    assert isinstance(make_block_hasher(4, "sha256_raw", seed=0), BlockHasher)
    key = TokenKey([1, 2, 3, 4])
    # an int seed is PYTHONHASHSEED's string; prefixkv's raw sha256 is another chain
    assert key.block_hashes(make_block_hasher(4, "sha256", 0)) == TokenKey(
        [1, 2, 3, 4]
    ).block_hashes(make_block_hasher(4, "sha256", "0"))
    raw = TokenKey([1, 2, 3, 4]).block_hashes(make_block_hasher(4, "sha256_raw", 0))
    assert raw != key.block_hashes(make_block_hasher(4, "sha256", 0))
    with pytest.raises(PrefixKVError, match="known: xxh3_128, sha256_raw, sha256, sha256_cbor"):
        make_index("hash_chain", hash_algorithm="md5")
    with pytest.raises(PrefixKVError, match="PYTHONHASHSEED"):
        make_block_hasher(4, "sha256_cbor", seed=b"\x00")
    with pytest.raises(PrefixKVError, match="PYTHONHASHSEED"):
        make_block_hasher(4, "sha256_cbor", seed=True)


def test_make_extra_key_lora_path_and_id() -> None:
    assert make_extra_key(lora="sql", lora_path="/p", lora_id=3) == (
        ("lora", "sql"),
        ("lora_id", 3),
        ("lora_path", "/p"),
    )
    for bad in ({"lora_path": "/p"}, {"lora_id": 3}):
        with pytest.raises(InvalidTokenError, match="give lora too"):
            make_extra_key(**bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidTokenError, match="lora_id must be an int"):
        make_extra_key(lora="sql", lora_id="3")  # type: ignore[arg-type]
    with pytest.raises(InvalidTokenError, match="lora_path must be a str"):
        make_extra_key(lora="sql", lora_path=3)  # type: ignore[arg-type]
