"""Tests of the trace formats: each reader on small fixtures, and every way a file can be bad.

Fixtures live in ``tests/data/traces/`` (hand-written, a few lines each); corrupt,
truncated and oversized variants are made here in ``tmp_path``. The public traces
themselves are for the benchmarks only.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import tarfile
import tracemalloc
from array import array
from pathlib import Path

import pytest
from helpers import TEST_DATA, common_prefix

from prefixkv.adapters.lab.traces import (
    ReadSettings,
    TraceFormatError,
    TraceLimits,
    TraceOptionError,
    TraceRequest,
    detect_format,
    load_any,
    make_request,
    open_trace,
    write_trace,
)
from prefixkv.adapters.outputs import OutputError, atomic_writer, refuse_overwrite
from prefixkv.indexes.errors import PrefixKVError

DATA = TEST_DATA / "traces"
MOONCAKE = DATA / "mooncake_small.jsonl"
BAILIAN = DATA / "bailian_small.jsonl"
KVCT = DATA / "kv_cache_tester"
PREFIXKV = DATA / "prefixkv_small.jsonl"

REQUESTS = [
    make_request("a", [1, 2, 3, 4], [5, 6]),
    make_request("b", [1, 2, 7], []),
    make_request("c", [0, 2**32 - 1], [9], arrival=1.5, session="s", parent="a", turn=2),
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def error_of(path: Path, **kwargs: object) -> str:
    """The one-line message reading ``path`` fails with."""
    with pytest.raises(TraceFormatError) as info:
        load_any(path, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, PrefixKVError)
    return message


# --- prefixkv JSONL -------------------------------------------------------------------


def test_round_trip_keeps_arrays_and_links(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    assert write_trace(path, REQUESTS) == 3
    back = load_any(path, trace_format="prefixkv")
    assert back == REQUESTS
    assert all(isinstance(r.tokens, array) and r.tokens.typecode == "I" for r in back)
    assert back[2][3:] == (1.5, "s", "a", 2, None)
    assert list(open_trace(str(path), "prefixkv")) == REQUESTS


def test_gzip_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    write_trace(path, REQUESTS)
    assert path.read_bytes()[:2] == b"\x1f\x8b"
    assert load_any(path, trace_format="prefixkv") == REQUESTS
    renamed = tmp_path / "no_suffix.jsonl"  # gzip is known by its magic, not its name
    shutil.copy(path, renamed)
    assert load_any(renamed, trace_format="prefixkv") == REQUESTS


def test_fixture_ids_defaults_and_extra_keys() -> None:
    a, b, c = load_any(PREFIXKV)
    assert (a.id, a.arrival, a.session, a.turn) == ("a", 0.0, "s1", 1)
    assert (b.parent, b.output) == ("a", array("I"))
    assert c.id == "7" and c.tokens == array("I", [0, 2**32 - 1]) and c.arrival is None
    assert detect_format(PREFIXKV) == "prefixkv"


def test_max_requests_stops_reading(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        ['{"id": "a", "tokens": [1]}', '{"id": "b", "tokens": [2]}', "not json at all"],
    )
    assert [r.id for r in load_any(path, max_requests=2, trace_format="prefixkv")] == ["a", "b"]
    assert load_any(path, max_requests=0, trace_format="prefixkv") == []
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:3: not JSON"):
        load_any(path, trace_format="prefixkv")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_bad_max_requests(bad: object) -> None:
    with pytest.raises(TraceOptionError, match="max_requests"):
        load_any(PREFIXKV, max_requests=bad, trace_format="prefixkv")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "fault"),
    [
        ("{not json", "not JSON"),
        ("[1, 2, 3]", "Expected `object`"),
        ('"tokens"', "Expected `object`"),
        ('{"id": "z"}', "`tokens`"),
        ('{"id": "z", "tokens": []}', "length >= 1"),
        ('{"id": "z", "tokens": "1 2"}', "$.tokens"),
        ('{"id": "z", "tokens": null}', "$.tokens"),
        ('{"id": "z", "tokens": [1, -1]}', "$.tokens[1]"),
        ('{"id": "z", "tokens": [4294967296]}', "$.tokens[0]"),
        ('{"id": "z", "tokens": [1, true]}', "got `bool` - at `$.tokens[1]`"),
        ('{"id": "z", "tokens": [1.5]}', "got `float`"),
        ('{"id": "z", "tokens": [[1]]}', "$.tokens[0]"),
        ('{"id": "z", "tokens": [1], "output": 5}', "$.output"),
        ('{"id": "z", "tokens": [1], "output": [2, -3]}', "$.output[1]"),
        ('{"id": "z", "tokens": [1], "output": null}', "$.output"),
        ('{"id": "z", "tokens": [1], "arrival": -1}', "$.arrival"),
        ('{"tokens": [1]}', "`id`"),
        ('{"id": 1.5, "tokens": [1]}', "$.id"),
        ('{"id": null, "tokens": [1]}', "$.id"),
        ('{"id": true, "tokens": [1]}', "$.id"),
        ('{"id": "", "tokens": [1]}', '"id" must be a non-empty'),
        ('{"id": ["a"], "tokens": [1]}', "$.id"),
        ('{"id": "\\ud800", "tokens": [1]}', "not JSON"),  # a lone surrogate
        ('{"id": "z", "tokens": [1' + "0" * 5000 + "]}", "out of range"),
        ('{"id": 1' + "0" * 5000 + ', "tokens": [1]}', "out of range"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, fault: str) -> None:
    path = write_lines(
        tmp_path / "bad.jsonl",
        ['{"id": "a", "tokens": [1]}', "", line, '{"id": "b", "tokens": [2]}'],
    )
    message = error_of(path)
    assert "bad.jsonl:3:" in message
    assert fault in message


def test_bad_utf8_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"id": "a", "tokens": [1]}\n{"id": "caf\xe9", "tokens": [2]}\n')
    message = error_of(path)
    assert "latin1.jsonl:2:" in message and "UTF-8" in message


def test_lone_surrogate_id_fails_at_load() -> None:
    with pytest.raises(TraceFormatError, match="lone surrogate"):
        make_request("a\ud800", [1])


def test_duplicate_id_gives_both_lines(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "dup.jsonl",
        ['{"id": "a", "tokens": [1]}', '{"id": 5, "tokens": [2]}', '{"id": "5", "tokens": [3]}'],
    )
    assert "dup.jsonl:3: duplicate id '5' (first at " in error_of(path)
    assert f"{path}:2)" in error_of(path)


def test_write_rejects_bad_requests_and_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    write_trace(path, REQUESTS[:1])
    before = path.read_bytes()
    with pytest.raises(TraceFormatError, match="duplicate id"):
        write_trace(path, [REQUESTS[0], REQUESTS[0]])
    with pytest.raises(TraceFormatError, match="must not be empty"):
        write_trace(path, [TraceRequest("e", [], [])])
    with pytest.raises(TraceFormatError, match="request #1"):
        write_trace(path, [REQUESTS[0], TraceRequest("n", [1, -2], [])])
    assert path.read_bytes() == before  # atomic: a failed write leaves the old file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.jsonl"]  # no temporary left


# --- broken files: gzip, sizes, limits -------------------------------------------------


def _gzip_lines(n: int) -> bytes:
    lines = "".join(
        json.dumps({"id": f"r{i}", "tokens": [i % 97 + 1] * 50}) + "\n" for i in range(n)
    )
    return gzip.compress(lines.encode(), mtime=0)


def test_truncated_gzip_is_one_line_with_its_position(tmp_path: Path) -> None:
    data = _gzip_lines(400)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    message = error_of(path)
    assert "cut.jsonl.gz:" in message and "gzip" in message and "EOFError" in message


def test_corrupt_gzip_is_one_line(tmp_path: Path) -> None:
    data = bytearray(_gzip_lines(400))
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64
    path = tmp_path / "bad.jsonl.gz"
    path.write_bytes(bytes(data))
    message = error_of(path)
    # zlib notices a bad code at once, or the garbled text fails as JSON first.
    assert "bad.jsonl.gz:" in message
    assert "corrupt or truncated gzip" in message or "not JSON" in message


def test_overlong_line_stops_before_buffering_it(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "long.jsonl", ['{"id": "a", "tokens": [' + "1," * 600 + "1]}"])
    opts = ReadSettings(limits=TraceLimits(max_document_bytes=1000))
    with pytest.raises(TraceFormatError, match=r"long\.jsonl:1: line longer than 1,000 bytes"):
        open_trace(path, settings=opts).scan()


def test_prompt_and_output_limits(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "big.jsonl", ['{"id": "a", "tokens": [1, 2, 3], "output": [4, 5]}']
    )
    small = ReadSettings(limits=TraceLimits(max_prompt_tokens=2))
    with pytest.raises(TraceFormatError, match=r"big\.jsonl:1: request 'a': prompt of 3 tokens"):
        open_trace(path, settings=small).scan()
    short = ReadSettings(limits=TraceLimits(max_output_tokens=1))
    with pytest.raises(TraceFormatError, match="--max-output-tokens"):
        list(open_trace(path, settings=short))
    with pytest.raises(TraceOptionError, match="max_prompt_tokens"):
        TraceLimits(max_prompt_tokens=0)


def test_giant_mooncake_output_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    line = '{"timestamp": 0, "input_length": 1, "output_length": 1000000000, "hash_ids": [1]}'
    assert len(line) < 100
    path = write_lines(tmp_path / "huge.jsonl", [line])
    tracemalloc.start()
    try:
        message = error_of(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "huge.jsonl:1: request 'mc-1': output of 1,000,000,000 tokens exceeds" in message
    assert peak < 4 * 2**20


def test_repeated_hash_ids_stay_small(tmp_path: Path) -> None:
    # 60 KB of repeated ids: within the limits each line is ~1.5M tokens, but the
    # reader holds one request at a time and the block cache stays bounded.
    ids = [7] * 3000
    line = json.dumps({"input_length": 512 * 3000, "output_length": 1, "hash_ids": ids})
    path = write_lines(tmp_path / "rep.jsonl", [line] * 7)
    assert path.stat().st_size < 70_000
    tracemalloc.start()
    try:
        for r in open_trace(path):
            assert len(r.tokens) == 512 * 3000
            del r
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20  # one request's 6 MB of tokens and its copy, not 7
    one = write_lines(
        tmp_path / "one.jsonl",
        [json.dumps({"input_length": 512 * 30000, "output_length": 1, "hash_ids": [7] * 30000})],
    )
    assert "exceeds the limit of 2,097,152" in error_of(one)


# --- Mooncake -------------------------------------------------------------------------


def test_mooncake_lengths_ids_and_arrival() -> None:
    reqs = load_any(MOONCAKE, trace_format="mooncake")
    assert [r.id for r in reqs] == ["mc-1", "mc-2", "mc-4", "mc-5"]
    assert [len(r.tokens) for r in reqs] == [1200, 1100, 300, 512]
    assert [len(r.output) for r in reqs] == [10, 0, 7, 600]
    assert [r.arrival for r in reqs] == [0.0, 0.25, 1.5, 4.0]  # the trace says ms
    assert detect_format(MOONCAKE) == "mooncake"


def test_mooncake_sharing_follows_hash_ids() -> None:
    a, b, c, d = load_any(MOONCAKE, trace_format="mooncake")
    assert common_prefix(a.tokens, b.tokens) == 1024  # blocks 10, 11 equal, 12 != 13
    assert c.tokens == a.tokens[:300]  # a partial block is a prefix of the full one
    assert common_prefix(a.tokens, d.tokens) == 0
    assert a.output != c.output[:7]
    assert all(1 <= t < 32000 for r in (a, b, c, d) for t in r.tokens)


def test_mooncake_tokens_per_id_keeps_pattern() -> None:
    a, b, c, d = load_any(MOONCAKE, tokens_per_id=16)
    # last block: ceil(partial * 16 / 512): 176 -> 6, 76 -> 3, 300 -> 10, 512 -> 16
    assert [len(r.tokens) for r in (a, b, c, d)] == [38, 35, 10, 16]
    # output: ceil(output_length * 16 / 512): 10 -> 1, 0 -> 0, 7 -> 1, 600 -> 19
    assert [len(r.output) for r in (a, b, c, d)] == [1, 0, 1, 19]
    assert common_prefix(a.tokens, b.tokens) == 32
    assert c.tokens == a.tokens[:10]
    unscaled = load_any(MOONCAKE, trace_format="mooncake")
    assert a.tokens[:16] == unscaled[0].tokens[:16]  # a scaled block is a prefix


def test_mooncake_deterministic_and_seeded() -> None:
    first = load_any(MOONCAKE, trace_format="mooncake")
    assert load_any(MOONCAKE, trace_format="mooncake") == first
    # Pinned values: any process, platform or Python version must give these. The
    # first four tokens of a block are SHAKE-128 (recorded fixtures depend on them).
    assert first[0].tokens[:4] == array("I", [24376, 12749, 2402, 10190])
    assert first[0].tokens[4:8] == array("I", [30951, 14960, 15121, 16343])
    assert first[0].output[:4] == array("I", [22211, 27506, 10692, 24584])
    other = load_any(MOONCAKE, seed=1, trace_format="mooncake")
    assert other[0].tokens[:16] != first[0].tokens[:16]
    assert common_prefix(other[0].tokens, other[1].tokens) == 1024


def test_mooncake_vocab_output_and_max_requests() -> None:
    reqs = load_any(MOONCAKE, vocab_size=7, output=False, max_requests=3, trace_format="mooncake")
    assert [r.id for r in reqs] == ["mc-1", "mc-2", "mc-4"]
    assert all(len(r.output) == 0 for r in reqs)
    assert {t for r in reqs for t in r.tokens} <= set(range(1, 7))


def test_mooncake_requests_do_not_alias() -> None:
    a, b, c, _ = load_any(MOONCAKE, trace_format="mooncake")
    before = array("I", b.tokens)
    a.tokens[0] = 99
    assert b.tokens == before
    assert c.tokens[0] != 99


@pytest.mark.parametrize(
    ("record", "fault"),
    [
        ('{"input_length": 10, "output_length": 1}', "`hash_ids`"),
        ('{"output_length": 1, "hash_ids": [1]}', "`input_length`"),
        ('{"input_length": 10, "hash_ids": [1]}', "`output_length`"),
        ('{"input_length": 0, "output_length": 1, "hash_ids": []}', "$.input_length"),
        ('{"input_length": true, "output_length": 1, "hash_ids": [1]}', "$.input_length"),
        ('{"input_length": 10, "output_length": -1, "hash_ids": [1]}', "$.output_length"),
        ('{"input_length": 10, "output_length": 1.0, "hash_ids": [1]}', "$.output_length"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": "1"}', "$.hash_ids"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [1.0]}', "$.hash_ids[0]"),
        ('{"input_length": 513, "output_length": 1, "hash_ids": [1]}', "ceil(513 / 512) = 2"),
        ('{"input_length": 10, "output_length": 1, "hash_ids": [1, 2]}', "ceil(10 / 512) = 1"),
        ('{"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        ('{"input_length": 1, "output_length": 1, "hash_ids": [1' + "0" * 5000 + "]}", "range"),
        ("[1]", "Expected `object`"),
        ("{oops", "not JSON"),
    ],
)
def test_mooncake_malformed_line(tmp_path: Path, record: str, fault: str) -> None:
    good = MOONCAKE.read_text().splitlines()[0]
    path = write_lines(tmp_path / "mc.jsonl", [good, good, record])
    message = error_of(path, trace_format="mooncake")
    assert "mc.jsonl:3:" in message
    assert fault in message


@pytest.mark.parametrize(
    ("options", "fault"),
    [
        ({"tokens_per_id": 0}, "tokens_per_id"),
        ({"tokens_per_id": 16.0}, "tokens_per_id"),
        ({"vocab_size": 1}, "vocab_size"),
        ({"max_requests": -1}, "max_requests"),
    ],
)
def test_bad_options(options: dict[str, object], fault: str) -> None:
    with pytest.raises(TraceOptionError, match=fault):
        load_any(MOONCAKE, **options)  # type: ignore[arg-type]


# --- Qwen-Bailian ---------------------------------------------------------------------


def test_bailian_ids_links_and_sharing() -> None:
    a, b, c = load_any(BAILIAN)
    assert detect_format(BAILIAN) == "bailian"
    assert [r.id for r in (a, b, c)] == ["chat-159", "chat-160", "chat-161"]
    assert (b.parent, b.turn, a.parent, c.turn) == ("chat-159", 2, None, 1)
    assert [r.arrival for r in (a, b, c)] == [61.114, 62.5, 63.0]  # already seconds
    assert [len(r.tokens) for r in (a, b, c)] == [40, 60, 16]
    assert [len(r.output) for r in (a, b, c)] == [6, 5, 0]
    assert common_prefix(a.tokens, b.tokens) == 32  # ids 1089, 1090 shared, then 1091 != 1092
    assert c.tokens == a.tokens[:16]
    # Another format's id 1089 is other content: formats never share by accident.
    moon = load_any(MOONCAKE, tokens_per_id=16)
    assert common_prefix(moon[0].tokens, a.tokens) == 0


def test_bailian_block_count_must_match(tmp_path: Path) -> None:
    line = '{"chat_id": 1, "input_length": 40, "output_length": 1, "hash_ids": [1, 2]}'
    path = write_lines(tmp_path / "q.jsonl", [line])
    assert 'q.jsonl:1: 2 "hash_ids" but input_length 40 needs ceil(40 / 16) = 3' in error_of(path)


# --- kv-cache-tester ------------------------------------------------------------------

KVCT_ORDER = [
    "conv_a/1",
    "conv_a/agent_001/1",
    "conv_a/2",
    "conv_a/agent_001/2",
    "conv_a/3",
    "conv_b/1",
]


def test_kvct_interleaves_conversations_by_their_time_by_default() -> None:
    sequential = load_any(KVCT, session_order="sequential")
    interleaved = load_any(KVCT)
    assert sorted(r.id for r in interleaved) == sorted(r.id for r in sequential)
    by_id = {r.id: r for r in sequential}
    assert all(r == by_id[r.id] for r in interleaved)  # the same requests, reordered
    times = [r.arrival for r in interleaved]
    assert times == sorted(times)  # all conversations start together
    assert [r.id for r in interleaved] == [KVCT_ORDER[0], KVCT_ORDER[-1], *KVCT_ORDER[1:-1]]
    with pytest.raises(TraceOptionError, match="session_order"):
        load_any(KVCT, session_order="random")


def test_kvct_folder_order_sessions_and_sizes() -> None:
    reqs = {r.id: r for r in load_any(KVCT, session_order="sequential")}
    assert detect_format(KVCT) == "kv-cache-tester"
    assert list(reqs) == KVCT_ORDER  # by time within a conversation, then the next file
    a1, s1, a2, s2, a3, b1 = (reqs[i] for i in KVCT_ORDER)
    assert [len(r.tokens) for r in (a1, s1, a2, s2, a3, b1)] == [150, 70, 200, 140, 200, 130]
    assert [len(r.output) for r in (a1, a2, b1)] == [20, 30, 4]
    assert (s2.session, s2.parent, s2.turn, s2.arrival) == (
        "conv_a/agent_001",
        "conv_a/agent_001/1",
        2,
        7.0,
    )
    assert (a2.parent, a3.parent, b1.session) == ("conv_a/1", "conv_a/2", "conv_b")
    assert common_prefix(a1.tokens, a2.tokens) == 128  # ids 1, 2; a1's 22-token tail is its own
    assert common_prefix(a2.tokens, a3.tokens) == 192  # a repeated request: only its tail differs
    assert common_prefix(s1.tokens, s2.tokens) == 64
    assert common_prefix(a1.tokens, b1.tokens) == 0  # "local" ids: conv_b's 1 is not conv_a's


def test_kvct_single_file_archive_and_global_scope(tmp_path: Path) -> None:
    folder = load_any(KVCT)
    single = load_any(KVCT / "conv_a.json")
    assert single == [r for r in folder if r.id.startswith("conv_a/")]
    archive = tmp_path / "convs.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        for f in sorted(KVCT.iterdir()):
            tar.add(f, arcname=f"traces/{f.name}")
    assert detect_format(archive) == "kv-cache-tester"
    assert load_any(archive) == folder
    for name in ("conv_a.json", "conv_b.json"):
        doc = json.loads((KVCT / name).read_text())
        doc["hash_id_scope"] = "global"
        (tmp_path / name).write_text(json.dumps(doc))
    shared = {r.id: r for r in load_any(tmp_path / "conv_a.json")}
    other = load_any(tmp_path / "conv_b.json")[0]
    assert common_prefix(shared["conv_a/1"].tokens, other.tokens) == 128


def test_kvct_tokens_per_id() -> None:
    reqs = {r.id: r for r in load_any(KVCT, tokens_per_id=16)}
    # 2 ids of 64 -> 32 tokens, 22-token tail -> ceil(22 * 16 / 64) = 6; out 20 -> 5
    assert (len(reqs["conv_a/1"].tokens), len(reqs["conv_a/1"].output)) == (38, 5)


@pytest.mark.parametrize(
    ("edit", "fault"),
    [
        (lambda d: d["requests"][0].pop("in"), 'needs "in", "out" and "hash_ids"'),
        (lambda d: d["requests"][0].update(hash_ids=[1]), '$.requests[0]: 1 "hash_ids" but'),
        (lambda d: d["requests"][1]["requests"][0].update(out=-1), "$.requests[1].requests[0].out"),
        (lambda d: d.update(hash_id_scope="galaxy"), "hash_id_scope"),
        (lambda d: d.update(requests=5), "$.requests"),
    ],
)
def test_kvct_malformed(tmp_path: Path, edit: object, fault: str) -> None:
    doc = json.loads((KVCT / "conv_a.json").read_text())
    edit(doc)  # type: ignore[operator]
    path = tmp_path / "conv.json"
    path.write_text(json.dumps(doc))
    message = error_of(path, trace_format="kv-cache-tester")
    assert str(path) in message and fault in message


def test_kvct_truncated_archive(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for f in sorted(KVCT.iterdir()):
            tar.add(f, arcname=f.name)
    path = tmp_path / "cut.tar.xz"
    path.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    assert "corrupt or truncated archive" in error_of(path)


# --- detection, scan, output files ----------------------------------------------------


def test_detect_rejects_unknown_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="empty trace"):
        detect_format(write_lines(tmp_path / "e.jsonl", ["", "  "]))
    with pytest.raises(TraceFormatError, match=r"u\.jsonl:2: not a trace format"):
        detect_format(write_lines(tmp_path / "u.jsonl", ["", '{"prompt": "hi"}']))
    with pytest.raises(TraceOptionError, match="hash-id traces only"):
        open_trace(PREFIXKV, settings=ReadSettings(tokens_per_id=16))


def test_scan_counts_sizes_without_building_tokens() -> None:
    stats = open_trace(MOONCAKE).scan()
    assert (stats.num_requests, stats.prompt_tokens, stats.output_tokens) == (4, 3112, 617)
    assert stats.largest == [1210, 1112, 1100, 307]
    scaled = open_trace(MOONCAKE, settings=ReadSettings(tokens_per_id=16)).scan()
    assert scaled.prompt_tokens == 38 + 35 + 10 + 16
    assert open_trace(MOONCAKE, max_requests=2).scan().num_requests == 2


def test_source_describes_granularity() -> None:
    src = open_trace(MOONCAKE, settings=ReadSettings(tokens_per_id=16))
    assert src.describe() == "Mooncake hash-id trace, 16 tokens per id (published: 512)"
    note = src.granularity_note()
    assert note is not None and "cannot show any sub-block gain" in note
    assert open_trace(PREFIXKV).granularity_note() is None


def test_atomic_writer_and_refuse_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.txt"
    with atomic_writer(target) as f:
        f.write(b"one")
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"torn")
        raise RuntimeError("boom")
    assert target.read_bytes() == b"one"
    assert [p.name for p in target.parent.iterdir()] == ["out.txt"]
    umask = os.umask(0o022)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600
    refuse_overwrite([tmp_path / "x.jsonl"], [target])
    for out in (target, tmp_path / "sub" / ".." / "sub" / "out.txt"):
        with pytest.raises(OutputError, match="is the input"):
            refuse_overwrite([out], [target])
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    with pytest.raises(OutputError, match="is the input"):
        refuse_overwrite([link], [target])
    with pytest.raises(OutputError, match="input folder"):
        refuse_overwrite([KVCT / "results.json"], [KVCT])


# --- sizes refused while streaming, compressions, arrival order -----------------------


def _peak_of(read: object) -> tuple[str, int]:
    """The one-line error ``read()`` fails with, and the peak Python allocation meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(TraceFormatError) as info:
            read()  # type: ignore[operator]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return str(info.value), peak


def test_a_giant_compressed_request_is_refused_within_the_limits_memory(tmp_path: Path) -> None:
    # 290 KB of gzip could hold 1.5e8 tokens; here 5e6 (10 MB of text in 10 KB) against
    # limits that a 1.1 MB line can reach: the reader stops there, nothing is built.
    path = tmp_path / "giant.jsonl.gz"
    with gzip.open(path, "wb") as f:
        f.write(b'{"id": "a", "tokens": [' + b"1," * 5_000_000 + b"1]}\n")
    assert path.stat().st_size < 50_000
    limits = TraceLimits(max_prompt_tokens=1000, max_output_tokens=100)
    source = open_trace(path, "prefixkv", settings=ReadSettings(limits=limits))
    message, peak = _peak_of(source.scan)
    assert peak < 3 * 2**20
    assert "giant.jsonl.gz:1: line longer than 1,061,776 bytes (more than a request" in message


def test_too_many_tokens_within_the_line_budget_are_counted_not_built(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "many.jsonl", ['{"id": "a", "tokens": [' + "1," * 400_000 + "1]}"]
    )
    limits = TraceLimits(max_prompt_tokens=10_000, max_output_tokens=10)
    source = open_trace(path, settings=ReadSettings(limits=limits))
    message, peak = _peak_of(source.scan)
    assert peak < 2.5 * 2**20  # the 800 KB line and one copy; a list would be 3.2 MB more
    assert "many.jsonl:1: prompt of 400,001 tokens exceeds the limit of 10,000" in message


def test_hash_ids_are_counted_before_they_are_built(tmp_path: Path) -> None:
    many = ",".join(str(i) for i in range(200_000))  # 1.3 MB of ids
    path = write_lines(
        tmp_path / "mc.jsonl",
        [f'{{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [{many}]}}'],
    )
    opts = ReadSettings(limits=TraceLimits(max_prompt_tokens=2**21 * 64))
    message, peak = _peak_of(lambda: open_trace(path, "mooncake", settings=opts).scan())
    assert peak < 4 * 2**20  # the line and one copy; the ids would be 7 MB more
    assert 'mc.jsonl:1: 200000 "hash_ids" but input_length 10 needs' in message


def test_a_giant_kvct_request_is_refused_before_its_ids_are_built(tmp_path: Path) -> None:
    n = 15_000_000  # 234,375 ids of 64 tokens
    ids = ",".join(str(i) for i in range(n // 64))
    doc = f'{{"id": "c", "requests": [{{"in": {n}, "out": 1, "hash_ids": [{ids}]}}]}}'.encode()
    path = tmp_path / "giant.tar.gz"  # gzip: no 8 MiB xz dictionary in the peak
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo("c.json")
        info.size = len(doc)
        tar.addfile(info, io.BytesIO(doc))
    message, peak = _peak_of(lambda: open_trace(path).scan())
    assert peak < 3 * len(doc)  # the document; its ids would be 9 MB more
    assert "c.json: $.requests[0]: request 'c/1': prompt of 15,000,000 tokens exceeds" in message


def test_xz_traces_are_read_and_other_compressions_refused_by_name(tmp_path: Path) -> None:
    import bz2
    import lzma

    text = PREFIXKV.read_bytes()
    xz = tmp_path / "t.jsonl.xz"
    xz.write_bytes(lzma.compress(text))
    assert detect_format(xz) == "prefixkv"
    assert load_any(xz) == load_any(PREFIXKV)
    mc = tmp_path / "mc.jsonl.xz"
    mc.write_bytes(lzma.compress(MOONCAKE.read_bytes()))
    assert load_any(mc, trace_format="mooncake") == load_any(MOONCAKE)
    cut = tmp_path / "cut.jsonl.xz"
    cut.write_bytes(lzma.compress(text * 50)[:-40])
    assert "cut.jsonl.xz:" in error_of(cut) and "truncated xz stream" in error_of(cut)
    bz = tmp_path / "t.jsonl.bz2"
    bz.write_bytes(bz2.compress(text))
    assert "a bzip2-compressed file; prefixkv reads plain, gzip and xz" in error_of(bz)


def test_arrivals_out_of_order_name_both_lines_when_order_is_needed(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "late.jsonl",
        [
            '{"id": "a", "tokens": [1], "arrival": 3}',
            '{"id": "b", "tokens": [1], "arrival": 5}',
            '{"id": "c", "tokens": [1], "arrival": 4}',
        ],
    )
    assert len(load_any(path)) == 3  # order does not matter without a clock
    ordered = ReadSettings(sorted_arrivals=True)
    with pytest.raises(TraceFormatError) as info:
        open_trace(path, settings=ordered).scan()
    assert str(info.value) == (
        f"{path}:3: request 'c' arrives at 4 s, before the request at {path}:2 (5 s); a "
        "replay at the trace's own times needs it sorted by arrival (sort the file, or "
        "give a request rate instead)"
    )
    lines = MOONCAKE.read_text().splitlines()
    mc = write_lines(tmp_path / "mc.jsonl", [lines[1], lines[0]])
    with pytest.raises(TraceFormatError, match=r"mc\.jsonl:2: request 'mc-2' arrives at 0 s"):
        list(open_trace(mc, "mooncake", settings=ordered))
    assert len(list(open_trace(KVCT, settings=ordered))) > 0  # per-conversation clocks
    with pytest.raises(TraceOptionError, match="sorted_arrivals"):
        ReadSettings(sorted_arrivals=1)  # type: ignore[arg-type]
