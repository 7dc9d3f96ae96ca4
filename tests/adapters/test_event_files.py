"""KV-event files: one JSON line per batch, exactly as vLLM's structs encode."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from helpers import TEST_DATA

from prefixkv.adapters.events.codec import EventDecodeError, EventDecoder
from prefixkv.adapters.events.files import EventFileWriter, read_event_file
from prefixkv.adapters.events.wire import BlockStored, KVEventBatch

DATA = TEST_DATA / "events"


@pytest.mark.parametrize("name", ["vllm_sha256_cbor.jsonl", "sglang_page4.jsonl"])
def test_lines_are_the_engines_json(name: str, tmp_path: Path) -> None:
    recorded = [json.loads(x) for x in (DATA / name).read_text().splitlines()[1:]]
    dec = EventDecoder()
    batches = [dec.decode(base64.b64decode(r["msgpack"])) for r in recorded]
    path = tmp_path / "events.jsonl"
    with EventFileWriter(path) as sink:
        for b in batches:
            sink.publish(b)
    lines = path.read_bytes().splitlines()
    assert sink.num_batches == len(lines) == len(recorded)
    if name.startswith("vllm"):  # SGLang's own JSON has its field names; ours is vLLM's
        assert lines == [r["json"].encode() for r in recorded]
    assert list(read_event_file(path)) == batches


def test_writer_stamps_the_rank_and_keeps_a_given_file_open() -> None:
    buf = io.BytesIO()
    sink = EventFileWriter(buf, data_parallel_rank=2)
    sink.publish(KVEventBatch(ts=1.0, events=[]))
    sink.publish(KVEventBatch(ts=2.0, events=[], data_parallel_rank=0))
    sink.shutdown()
    assert buf.getvalue() == b"[1.0,[],2]\n[2.0,[],0]\n"


def test_bytes_hashes_are_base64(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    b = KVEventBatch(ts=0.5, events=[BlockStored([b"\x00\xff"], None, [1], 1, None, "GPU", None)])
    with EventFileWriter(path) as sink:
        sink.publish(b)
    assert b'"block_hashes":["AP8="]' in path.read_bytes()
    assert list(read_event_file(path)) == [b]


def test_a_bad_line_names_its_number(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'[1.0,[],0]\n\n{"not": "a batch"}\n')
    with pytest.raises(EventDecodeError, match=r"e\.jsonl:3"):
        list(read_event_file(path))


def test_a_line_nested_past_msgspecs_bound_is_a_named_error(tmp_path: Path) -> None:
    deep = "[" * 5000 + "]" * 5000  # in a field nobody declared, which is skipped
    path = tmp_path / "deep.jsonl"
    path.write_text(
        '[1.0, [{"type": "BlockRemoved", "block_hashes": [1], "medium": null, "x": '
        + deep
        + "}]]\n"
    )
    with pytest.raises(EventDecodeError, match=r"deep\.jsonl:1: not a KV-event batch: nested"):
        list(read_event_file(path))
