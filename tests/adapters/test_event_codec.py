"""The KV-event codec against batches recorded from vLLM 0.33 and SGLang 0.5.23.

Fixtures (``tests/data/events``, from ``tests/engines/recorders/record_kv_event_fixtures.py``):
each line is one batch as the engine's own ``ZmqEventPublisher`` sent it (topic,
sequence number, msgpack payload) and as msgspec's JSON encoder writes the engine's
own struct. Decoding and re-encoding must give the same bytes.

Set ``PREFIXKV_VLLM_PYTHON`` to a python with vLLM to also check that vLLM's own
structs read prefixkv's JSON lines and msgpack payloads.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest
from helpers import TEST_DATA

from prefixkv.adapters.events.codec import EventDecodeError, EventDecoder, encode, encode_json
from prefixkv.adapters.events.files import EventFileWriter
from prefixkv.adapters.events.sglang_wire import SGLangBlockStored
from prefixkv.adapters.events.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from prefixkv.indexes.errors import PrefixKVError

DATA = TEST_DATA / "events"
VLLM_FILES = ["vllm_sha256_cbor.jsonl", "vllm_sha256.jsonl"]
SGLANG_FILES = ["sglang_page1.jsonl", "sglang_page4.jsonl"]


def load(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, batches) of a recorded events file; each batch gets its payload bytes."""
    lines = [json.loads(x) for x in (DATA / name).read_text().splitlines()]
    batches = lines[1:]
    for b in batches:
        b["payload"] = base64.b64decode(b["msgpack"])
    return lines[0]["header"], batches


@pytest.mark.parametrize("name", VLLM_FILES)
def test_vllm_batches_round_trip_byte_for_byte(name: str) -> None:
    header, batches = load(name)
    settings = json.loads((DATA / "settings.json").read_text())
    dec = EventDecoder()
    assert header["batches"] == len(batches) > 10
    assert [b["seq"] for b in batches] == list(range(len(batches)))
    kinds: set[str] = set()
    for b in batches:
        assert b["topic"] == settings["topic"]
        strict = dec.decode_vllm(b["payload"])
        assert encode(strict) == b["payload"]
        assert encode_json(strict) == b["json"].encode()
        lenient = dec.decode(b["payload"])
        assert encode(lenient) == b["payload"]
        assert lenient.data_parallel_rank == settings["data_parallel_rank"]
        kinds.update(type(e).__name__ for e in lenient.events)
    assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


@pytest.mark.parametrize("name", SGLANG_FILES)
def test_sglang_batches_round_trip_and_normalize(name: str) -> None:
    _, batches = load(name)
    dec = EventDecoder()
    for b in batches:
        sg = dec.decode_sglang(b["payload"])
        assert encode(sg) == b["payload"]
        assert encode_json(sg) == b["json"].encode()
        ours = dec.decode(b["payload"])
        assert ours.ts == sg.ts and ours.data_parallel_rank == sg.attn_dp_rank == 0
        assert len(ours.events) == len(sg.events)
        for mine, theirs in zip(ours.events, sg.events, strict=True):
            assert type(mine).__name__ == type(theirs).__struct_config__.tag
            if isinstance(theirs, SGLangBlockStored):
                assert isinstance(mine, BlockStored)
                assert mine.block_hashes == theirs.block_hashes
                assert mine.parent_block_hash == theirs.parent_block_hash
                assert mine.token_ids == theirs.token_ids
                assert mine.medium == theirs.medium == "GPU"
    assert dec.num_skipped_events == 0


def test_sglang_hashes_are_signed() -> None:
    dec = EventDecoder()
    hashes = [
        h
        for b in load("sglang_page4.jsonl")[1]
        for e in dec.decode(b["payload"]).events
        if isinstance(e, BlockStored)
        for h in e.block_hashes
    ]
    assert any(isinstance(h, int) and h < 0 for h in hashes)


# Older vLLM declared KVCacheEvent(array_like=True): three generations of its layout.


class _OldBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Old(msgspec.Struct, array_like=True, omit_defaults=True, tag=True):
    pass


class _Gen1Stored(_Old, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _Gen1Removed(_Old, tag="BlockRemoved"):
    block_hashes: list[int]


class _Gen2Stored(_Gen1Stored, tag="BlockStored"):
    medium: str | None


class _Gen3Stored(_Gen2Stored, tag="BlockStored"):
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None


class _Gen3Removed(_Old, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class _OldCleared(_Old, tag="AllBlocksCleared"):
    pass


def test_decodes_older_array_encoded_events() -> None:
    dec = EventDecoder()
    gen1 = _OldBatch(1.5, [_Gen1Stored([7, 8], None, [1, 2, 3, 4], 2, None), _Gen1Removed([7])])
    out = dec.decode(msgspec.msgpack.encode(gen1))
    assert out.ts == 1.5 and out.data_parallel_rank is None
    assert out.events == [
        BlockStored([7, 8], None, [1, 2, 3, 4], 2, None, None, None),
        BlockRemoved([7], None),
    ]
    gen3 = _OldBatch(
        2.0,
        [
            _Gen3Stored([9], 8, [5, 6], 2, 3, "GPU", "sql", [("sql",)], 1),
            _Gen3Removed([9], "GPU", 1),
            _OldCleared(),
        ],
        data_parallel_rank=2,
    )
    out = dec.decode(msgspec.msgpack.encode(gen3))
    assert out.data_parallel_rank == 2
    assert out.events == [
        BlockStored([9], 8, [5, 6], 2, 3, "GPU", "sql", extra_keys=[("sql",)], group_idx=1),
        BlockRemoved([9], "GPU", group_idx=1),
        AllBlocksCleared(),
    ]
    gen2 = _OldBatch(3.0, [_Gen2Stored([1], None, [0, 0], 2, None, "CPU")])
    (stored,) = dec.decode(msgspec.msgpack.encode(gen2)).events
    assert isinstance(stored, BlockStored) and stored.medium == "CPU"


def test_unknown_fields_and_event_types() -> None:
    dec = EventDecoder()
    stored = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [4, 5],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "from_the_future": {"x": 1},
    }
    batch = dec.decode(msgspec.msgpack.encode([0.5, [stored], 1]))
    assert batch.events == [BlockStored([1], None, [4, 5], 2, None, "GPU", None)]
    assert dec.num_skipped_events == 0
    # an unknown event type is skipped (and counted), the rest kept
    mixed = [0.5, [{"type": "BlockPinned", "block_hashes": [1]}, stored, ["BlockMoved", 1]]]
    batch = dec.decode(msgspec.msgpack.encode(mixed))
    assert batch.events == [BlockStored([1], None, [4, 5], 2, None, "GPU", None)]
    assert dec.num_skipped_events == 2
    # an array event with fields a newer layout appended
    longer = [0.5, [["BlockRemoved", [3], "GPU", 0, "LOCAL", "tier-2", "more"]]]
    assert dec.decode(msgspec.msgpack.encode(longer)).events == [
        BlockRemoved([3], "GPU", group_idx=0)
    ]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        msgspec.msgpack.encode({"ts": 1.0}),
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockStored"}]]),  # block_hashes missing
        msgspec.msgpack.encode([1.0, [42]]),
        msgspec.msgpack.encode([1.0, [], "rank"]),
    ],
)
def test_bad_payloads_raise_a_named_error(payload: bytes) -> None:
    with pytest.raises(EventDecodeError):
        EventDecoder().decode(payload)


def _deep(depth: int) -> bytes:
    """msgpack ``[[[...nil...]]]`` nested ``depth`` arrays deep."""
    return b"\x91" * depth + b"\xc0"


def _batch_with(event: bytes) -> bytes:
    """``[1.0, [event]]`` with ``event``'s msgpack bytes spliced in as they are."""
    return msgspec.msgpack.encode([1.0, []])[:-1] + b"\x91" + event


def _map_event(**fields: Any) -> bytes:
    return msgspec.msgpack.encode(fields)


_STORED = {"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None}


# What a hostile or broken peer may send: every one a named error, never a raw
# TypeError or RecursionError out of decode() (and so out of a subscriber's poll()).
HOSTILE = {
    "type is a list": msgspec.msgpack.encode([1.0, [{"type": [1], "block_hashes": [1]}]]),
    "type is a map": msgspec.msgpack.encode([1.0, [{"type": {"a": 1}, "block_hashes": [1]}]]),
    "type missing": msgspec.msgpack.encode([1.0, [{"block_hashes": [1]}]]),
    "array tag is a list": msgspec.msgpack.encode([1.0, [[[1], [1], "GPU"]]]),
    "nested 3000 deep": _deep(3000),
    "event nested 3000 deep": _batch_with(_deep(3000)),
    "known event, deep unknown field": _batch_with(
        _map_event(**_STORED)[:-1].replace(b"\x83", b"\x84", 1) + b"\xc0\xa1x" + _deep(3000)
    ),
    "ts is NaN": msgspec.msgpack.encode([float("nan"), []]),
    "ts is infinite": msgspec.msgpack.encode([float("inf"), []]),
    "ts is a bool": msgspec.msgpack.encode([True, []]),
    "rank is a bool": msgspec.msgpack.encode([1.0, [], True]),
    "rank is negative": msgspec.msgpack.encode([1.0, [], -1]),
    "hash is a map": msgspec.msgpack.encode([1.0, [{**_STORED, "block_hashes": [{}]}]]),
}


@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_payloads_raise_a_named_error(payload: bytes) -> None:
    dec = EventDecoder()
    with pytest.raises(EventDecodeError):
        dec.decode(payload)
    with pytest.raises(EventDecodeError):
        dec.decode_vllm(payload)
    # the decoder still works after each
    assert dec.decode(encode(KVEventBatch(1.0, [AllBlocksCleared()]))).ts == 1.0


def test_oversized_and_non_bytes_payloads_are_refused_before_decoding() -> None:
    small = EventDecoder(max_payload_bytes=64)
    ok = encode(KVEventBatch(1.0, [AllBlocksCleared()]))
    assert small.decode(ok).ts == 1.0
    big = encode(KVEventBatch(1.0, [BlockRemoved(list(range(100)), "GPU")]))
    for decode in (small.decode, small.decode_vllm, small.decode_sglang):
        with pytest.raises(EventDecodeError, match="64"):
            decode(big)
    with pytest.raises(EventDecodeError, match="str"):
        small.decode("not bytes")  # type: ignore[arg-type]
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(PrefixKVError, match="max_payload_bytes"):
            EventDecoder(max_payload_bytes=bad)  # type: ignore[arg-type]


def test_strict_decoders_reject_the_other_engine() -> None:
    dec = EventDecoder()
    sglang_payload = load("sglang_page1.jsonl")[1][1]["payload"]
    with pytest.raises(EventDecodeError):
        dec.decode_vllm(sglang_payload)
    with pytest.raises(EventDecodeError):
        dec.decode_sglang(b"\x00")


VLLM_PYTHON = os.environ.get("PREFIXKV_VLLM_PYTHON")
_VLLM_READS = """
import sys, msgspec
from vllm.distributed.kv_events import KVEventBatch
json_path, packed_path = sys.argv[1:]
n = 0
with open(json_path, "rb") as f:
    for line in f:
        msgspec.json.decode(line, type=KVEventBatch)
        n += 1
dec = msgspec.msgpack.Decoder(KVEventBatch)
with open(packed_path) as f:
    for hexed in f.read().split():
        payload = bytes.fromhex(hexed)
        assert msgspec.msgpack.encode(dec.decode(payload)) == payload
        n += 1
print(n)
"""


@pytest.mark.skipif(not VLLM_PYTHON, reason="set PREFIXKV_VLLM_PYTHON to a python with vLLM")
def test_vllm_reads_our_event_files_and_payloads(tmp_path: Path) -> None:
    dec = EventDecoder()
    batches = [
        dec.decode(b["payload"]) for name in VLLM_FILES + SGLANG_FILES for b in load(name)[1]
    ]
    batches.append(
        KVEventBatch(
            ts=3.25,
            events=[
                BlockStored([b"\x01" * 32], None, [1, 2], 2, None, "CPU", None),
                BlockRemoved([5], "GPU", group_idx=1, locality="LOCAL"),
                AllBlocksCleared(),
            ],
            data_parallel_rank=3,
        )
    )
    json_path, packed_path = tmp_path / "events.jsonl", tmp_path / "packed.txt"
    with EventFileWriter(json_path) as sink:
        for b in batches:
            sink.publish(b)
    packed_path.write_text(" ".join(encode(b).hex() for b in batches))
    assert VLLM_PYTHON is not None
    out = subprocess.run(
        [VLLM_PYTHON, "-c", _VLLM_READS, str(json_path), str(packed_path)],
        capture_output=True,
        check=True,
        timeout=300,
    )
    assert int(out.stdout.split()[-1]) == 2 * len(batches), out.stderr.decode()[-2000:]
