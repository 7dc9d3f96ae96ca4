"""Tests of the trace formats: prefixkv JSONL round trips and errors, Mooncake loading.

The Mooncake fixtures are written here into ``tmp_path`` (the full public traces are
for manual checks only), so CI needs nothing but the repository.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import common_prefix

from prefixkv.adapters.lab.traces import (
    TraceFormatError,
    TraceOptionError,
    TraceRequest,
    detect_format,
    iter_trace,
    load_any,
    load_mooncake,
    mooncake_lengths,
    read_trace,
    write_trace,
)
from prefixkv.indexes.errors import PrefixKVError

REQUESTS = [
    TraceRequest("a", [1, 2, 3, 4], [5, 6]),
    TraceRequest("b", [1, 2, 7], []),
    TraceRequest("c", [0, 2**32 - 1], [9]),
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- prefixkv JSONL -------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert write_trace(path, REQUESTS) == 3
    assert read_trace(path) == REQUESTS
    assert list(iter_trace(str(path))) == REQUESTS


def test_int_ids_blank_lines_and_default_output(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        ["", '{"id": 7, "tokens": [3, 4]}', "   ", '{"id": "x", "tokens": [5], "extra": 1}', ""],
    )
    assert read_trace(path) == [TraceRequest("7", [3, 4], []), TraceRequest("x", [5], [])]


def test_max_requests_stops_reading(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        ['{"id": "a", "tokens": [1]}', '{"id": "b", "tokens": [2]}', "not json at all"],
    )
    assert [r.id for r in read_trace(path, max_requests=2)] == ["a", "b"]
    assert read_trace(path, max_requests=0) == []
    with pytest.raises(TraceFormatError):
        read_trace(path)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_max_requests(tmp_path: Path, bad: object) -> None:
    path = write_lines(tmp_path / "t.jsonl", ['{"id": "a", "tokens": [1]}'])
    with pytest.raises(TraceOptionError, match="max_requests"):
        read_trace(path, max_requests=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "fault"),
    [
        ("{not json", "not JSON"),
        ("[1, 2, 3]", "JSON object"),
        ('"tokens"', "JSON object"),
        ('{"id": "z"}', 'missing "tokens"'),
        ('{"id": "z", "tokens": []}', "must not be empty"),
        ('{"id": "z", "tokens": "1 2"}', "list of token ids"),
        ('{"id": "z", "tokens": null}', "list of token ids"),
        ('{"id": "z", "tokens": [1, -1]}', "position 1"),
        ('{"id": "z", "tokens": [4294967296]}', "4294967296"),
        ('{"id": "z", "tokens": [1, true]}', "True"),
        ('{"id": "z", "tokens": [1.5]}', "1.5"),
        ('{"id": "z", "tokens": [[1]]}', "position 0"),
        ('{"id": "z", "tokens": [1], "output": 5}', '"output"'),
        ('{"id": "z", "tokens": [1], "output": [2, -3]}', '"output"'),
        ('{"id": "z", "tokens": [1], "output": null}', '"output"'),
        ('{"tokens": [1]}', 'missing "id"'),
        ('{"id": 1.5, "tokens": [1]}', '"id"'),
        ('{"id": null, "tokens": [1]}', '"id"'),
        ('{"id": true, "tokens": [1]}', '"id"'),
        ('{"id": "", "tokens": [1]}', '"id"'),
        ('{"id": ["a"], "tokens": [1]}', '"id"'),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, fault: str) -> None:
    path = write_lines(
        tmp_path / "bad.jsonl",
        ['{"id": "a", "tokens": [1]}', "", line, '{"id": "b", "tokens": [2]}'],
    )
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    message = str(info.value)
    assert "bad.jsonl:3:" in message
    assert fault in message
    assert isinstance(info.value, PrefixKVError)


def test_duplicate_id_gives_both_lines(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "dup.jsonl",
        ['{"id": "a", "tokens": [1]}', '{"id": 5, "tokens": [2]}', '{"id": "5", "tokens": [3]}'],
    )
    with pytest.raises(
        TraceFormatError, match=r"dup\.jsonl:3: duplicate id '5' \(first on line 2\)"
    ):
        read_trace(path)


def test_write_rejects_bad_requests(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with pytest.raises(TraceFormatError, match="duplicate id"):
        write_trace(path, [REQUESTS[0], REQUESTS[0]])
    with pytest.raises(TraceFormatError, match="must not be empty"):
        write_trace(path, [TraceRequest("e", [], [])])
    with pytest.raises(TraceFormatError, match="request #1"):
        write_trace(path, [REQUESTS[0], TraceRequest("n", [1, -2], [])])


# --- Mooncake -------------------------------------------------------------------------

# Lines 1-2 share blocks 10, 11 (1024 tokens); line 4 is the partial first block 10;
# line 5 a single full block. Line 3 is blank, so ids are mc-1, mc-2, mc-4, mc-5.
MOONCAKE = [
    {"timestamp": 0, "input_length": 1200, "output_length": 10, "hash_ids": [10, 11, 12]},
    {"timestamp": 5, "input_length": 1100, "output_length": 0, "hash_ids": [10, 11, 13]},
    None,
    {"timestamp": 9, "input_length": 300, "output_length": 7, "hash_ids": [10]},
    {"timestamp": 12, "input_length": 512, "output_length": 600, "hash_ids": [14]},
]


@pytest.fixture
def mooncake_path(tmp_path: Path) -> Path:
    lines = ["" if r is None else json.dumps(r) for r in MOONCAKE]
    return write_lines(tmp_path / "mooncake.jsonl", lines)


def test_mooncake_lengths_and_ids(mooncake_path: Path) -> None:
    reqs = load_mooncake(mooncake_path)
    assert [r.id for r in reqs] == ["mc-1", "mc-2", "mc-4", "mc-5"]
    assert [len(r.tokens) for r in reqs] == [1200, 1100, 300, 512]
    assert [len(r.output) for r in reqs] == [10, 0, 7, 600]


def test_mooncake_sharing_follows_hash_ids(mooncake_path: Path) -> None:
    a, b, c, d = load_mooncake(mooncake_path)
    assert common_prefix(a.tokens, b.tokens) == 1024  # blocks 10, 11 equal, 12 != 13
    assert c.tokens == a.tokens[:300]  # a partial block is a prefix of the full one
    assert common_prefix(a.tokens, d.tokens) == 0
    assert a.tokens[1024:1100] != b.tokens[1024:1100]
    assert a.output != c.output


def test_mooncake_scaled_keeps_pattern(mooncake_path: Path) -> None:
    a, b, c, d = load_mooncake(mooncake_path, scale_block=16)
    # last block: ceil(partial * 16 / 512): 176 -> 6, 76 -> 3, 300 -> 10, 512 -> 16
    assert [len(r.tokens) for r in (a, b, c, d)] == [38, 35, 10, 16]
    # output: ceil(output_length * 16 / 512): 10 -> 1, 0 -> 0, 7 -> 1, 600 -> 19
    assert [len(r.output) for r in (a, b, c, d)] == [1, 0, 1, 19]
    assert common_prefix(a.tokens, b.tokens) == 32
    assert c.tokens == a.tokens[:10]
    assert common_prefix(a.tokens, d.tokens) == 0
    unscaled = load_mooncake(mooncake_path)
    assert a.tokens[:16] == unscaled[0].tokens[:16]  # a scaled block is a prefix


def test_mooncake_lengths_rule() -> None:
    assert mooncake_lengths(1200, 3, None) == [512, 512, 176]
    assert mooncake_lengths(1200, 3, 16) == [16, 16, 6]
    assert mooncake_lengths(513, 2, 16) == [16, 1]
    assert mooncake_lengths(1024, 2, 1) == [1, 1]


def test_mooncake_deterministic_and_seeded(mooncake_path: Path) -> None:
    first = load_mooncake(mooncake_path)
    assert load_mooncake(mooncake_path) == first
    # Pinned values: any process, platform or Python version must give these.
    assert first[0].tokens[:4] == [24376, 12749, 2402, 10190]
    assert first[0].output[:4] == [22211, 27506, 10692, 24584]
    other = load_mooncake(mooncake_path, seed=1)
    assert other[0].tokens[:16] != first[0].tokens[:16]
    assert common_prefix(other[0].tokens, other[1].tokens) == 1024


def test_mooncake_vocab_output_and_max_requests(mooncake_path: Path) -> None:
    reqs = load_mooncake(mooncake_path, vocab_size=7, output=False, max_requests=3)
    assert [r.id for r in reqs] == ["mc-1", "mc-2", "mc-4"]
    assert all(r.output == [] for r in reqs)
    assert {t for r in reqs for t in r.tokens} <= set(range(1, 7))


def test_mooncake_requests_do_not_alias(mooncake_path: Path) -> None:
    a, b, c, _ = load_mooncake(mooncake_path)
    before = list(b.tokens)
    a.tokens[0] = 99
    assert b.tokens == before
    assert c.tokens[0] != 99


@pytest.mark.parametrize(
    ("record", "fault"),
    [
        ('{"input_length": 10, "output_length": 1}', 'missing "hash_ids"'),
        ('{"output_length": 1, "hash_ids": [1]}', 'missing "input_length"'),
        ('{"input_length": 10, "hash_ids": [1]}', 'missing "output_length"'),
        ('{"input_length": 0, "output_length": 1, "hash_ids": []}', '"input_length"'),
        ('{"input_length": true, "output_length": 1, "hash_ids": [1]}', '"input_length"'),
        ('{"input_length": 10, "output_length": -1, "hash_ids": [1]}', '"output_length"'),
        ('{"input_length": 10, "output_length": 1.0, "hash_ids": [1]}', '"output_length"'),
        ('{"input_length": 10, "output_length": 1, "hash_ids": "1"}', '"hash_ids"'),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [1.0]}', '"hash_ids"'),
        ('{"input_length": 513, "output_length": 1, "hash_ids": [1]}', "ceil(513 / 512) = 2"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [1, 2]}', "ceil(10 / 512) = 1"),
        ('{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        ("[1]", "JSON object"),
        ("{oops", "not JSON"),
    ],
)
def test_mooncake_malformed_line(tmp_path: Path, record: str, fault: str) -> None:
    good = json.dumps(MOONCAKE[0])
    path = write_lines(tmp_path / "mc.jsonl", [good, good, record])
    with pytest.raises(TraceFormatError) as info:
        load_mooncake(path)
    assert "mc.jsonl:3:" in str(info.value)
    assert fault in str(info.value)


@pytest.mark.parametrize(
    ("options", "fault"),
    [
        ({"scale_block": 0}, "scale_block"),
        ({"scale_block": 513}, "scale_block"),
        ({"scale_block": 16.0}, "scale_block"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"max_requests": -1}, "max_requests"),
    ],
)
def test_mooncake_bad_options(mooncake_path: Path, options: dict[str, object], fault: str) -> None:
    with pytest.raises(TraceOptionError, match=fault):
        load_mooncake(mooncake_path, **options)  # type: ignore[arg-type]


# --- format detection ---------------------------------------------------------------


def test_detect_and_load_any(tmp_path: Path, mooncake_path: Path) -> None:
    ours = tmp_path / "ours.jsonl"
    write_trace(ours, REQUESTS)
    assert detect_format(ours) == "prefixkv"
    assert detect_format(mooncake_path) == "mooncake"
    assert load_any(ours) == REQUESTS
    assert load_any(ours, output=False)[0] == TraceRequest("a", [1, 2, 3, 4], [])
    assert load_any(mooncake_path, scale_block=16) == load_mooncake(mooncake_path, scale_block=16)
    with pytest.raises(TraceOptionError, match="Mooncake traces only"):
        load_any(ours, scale_block=16)


def test_detect_rejects_unknown_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="empty trace"):
        detect_format(write_lines(tmp_path / "e.jsonl", ["", "  "]))
    with pytest.raises(TraceFormatError, match=r"u\.jsonl:2: neither"):
        detect_format(write_lines(tmp_path / "u.jsonl", ["", '{"prompt": "hi"}']))
