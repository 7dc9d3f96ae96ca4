"""VllmEventRecorder: index sink calls become the bytes vLLM 0.33 publishes.

For every batch vLLM published on the recorded trace, the sink calls an index would
make (digests from ``VllmBlockHasher`` over the request's tokens and namespace) are
fed to the recorder; its batch must encode to vLLM's payload byte for byte. That
checks the hashes, their wire form, the namespace fields and every default at once.
"""

from __future__ import annotations

import base64
import json
from array import array
from typing import Any

import pytest
from helpers import TEST_DATA

from prefixkv.adapters.events.codec import EventDecoder, encode
from prefixkv.adapters.events.recorder import VllmEventRecorder, event_extra_keys
from prefixkv.adapters.events.wire import AllBlocksCleared, BlockRemoved, BlockStored
from prefixkv.indexes.tokens import ExtraKey, normalize_extra_key
from prefixkv.indexes.vllm_hashing import VllmBlockHasher, to_external_block_hash

DATA = TEST_DATA / "events"


def namespace(rec: dict[str, Any]) -> ExtraKey | None:
    parts: list[tuple[str, str | int]] = []
    if "lora" in rec:
        lora = rec["lora"]
        parts += [("lora", lora["name"]), ("lora_id", lora["id"]), ("lora_path", lora["path"])]
    if "cache_salt" in rec:
        parts.append(("cache_salt", rec["cache_salt"]))
    return normalize_extra_key(tuple(parts)) if parts else None


@pytest.mark.parametrize("algo", ["sha256_cbor", "sha256"])
def test_recorder_reproduces_vllms_batches(algo: str) -> None:
    settings = json.loads((DATA / "settings.json").read_text())
    lines = (DATA / f"vllm_{algo}.jsonl").read_text().splitlines()
    header = json.loads(lines[0])["header"]
    bs = settings["block_size"]
    hasher = VllmBlockHasher(bs, algo, header["none_hash_seed"])
    # wire hash -> (digest, tokens of its block, namespace), from every request's tokens
    blocks: dict[int, tuple[bytes, list[int], ExtraKey | None]] = {}
    for line in (DATA / "trace.jsonl").read_text().splitlines():
        rec = json.loads(line)
        tokens, ns = rec["tokens"] + rec["output"], namespace(rec)
        digests: list[bytes] = []
        hasher.extend(digests, array("I", tokens), ns)
        for i, d in enumerate(digests):
            blocks[to_external_block_hash(d)] = (d, tokens[i * bs : (i + 1) * bs], ns)
    recorder, dec = VllmEventRecorder(), EventDecoder()
    for line in lines[1:]:
        recorded = json.loads(line)
        payload = base64.b64decode(recorded["msgpack"])
        theirs = dec.decode_vllm(payload)
        for event in theirs.events:
            if isinstance(event, BlockStored):
                found = [blocks[h] for h in event.block_hashes]  # type: ignore[index]
                parent = event.parent_block_hash
                recorder.on_stored(
                    [d for d, _, _ in found],
                    None if parent is None else blocks[parent][0],  # type: ignore[index]
                    [t for _, toks, _ in found for t in toks],
                    bs,
                    found[0][2],
                )
            elif isinstance(event, BlockRemoved):
                recorder.on_removed([blocks[h][0] for h in event.block_hashes])  # type: ignore[index]
            else:
                recorder.on_cleared()
        ours = recorder.take_batch(theirs.ts, theirs.data_parallel_rank)
        assert ours is not None and encode(ours) == payload, recorded["seq"]
    assert recorder.take_batch(0.0) is None


def test_event_extra_keys_untag_per_block() -> None:
    ns = normalize_extra_key((("lora", "sql"), ("lora_path", "/a"), ("cache_salt", "s")))
    assert event_extra_keys(ns, 0, 3) == [("sql", "s"), ("sql",), ("sql",)]
    assert event_extra_keys(None, 0, 2) == [None, None]
    # a kind vLLM lacks keeps its tag: never read as a salt "t"
    assert event_extra_keys((("tenant", "t"),), 0, 2) == [(("tenant", "t"),), None]


def test_raw_digest_hashes_and_removed_events_per_hash() -> None:
    rec = VllmEventRecorder(int_hashes=False, medium="CPU", group_idx=2)
    rec.on_removed([b"a", b"b"])
    rec.on_cleared()
    assert rec.take_events() == [
        BlockRemoved([b"a"], "CPU", group_idx=2),
        BlockRemoved([b"b"], "CPU", group_idx=2),
        AllBlocksCleared(),
    ]
    assert rec.take_events() == []
