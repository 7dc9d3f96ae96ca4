"""Hash-id JSON-lines traces: Mooncake FAST'25 (512-token blocks, ids ``mc-<line>``)
and Qwen-Bailian (16-token blocks, ids ``chat-<chat_id>``, ``parent_chat_id`` links).

Each line gives one id per block of prompt tokens (equal ids: equal prefixes),
``ceil(input_length / block)`` of them; each expands to tokens (:mod:`.blocks`) at the
block size or at ``tokens_per_id`` (the last block and the output scaled alike).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any, NamedTuple

import msgspec

from prefixkv.adapters.inputs import StrPath

from .base import ArrivalOrder, ReadSettings, TraceFormatError, TraceRequest
from .blocks import BlockTokens, TokenDeriver
from .prefixkv import RequestSize
from .reading import Progress, count_items, decode, iter_lines

_Count = Annotated[int, msgspec.Meta(ge=0)]
_Positive = Annotated[int, msgspec.Meta(ge=1)]


# hash_ids stay text until the sizes they imply are checked
class _MooncakeLine(msgspec.Struct):
    input_length: _Positive
    output_length: _Count
    hash_ids: msgspec.Raw
    timestamp: float = 0.0

    def names(self, lineno: int) -> tuple[str, str, str | None, int | None]:
        """``(id, output's name, parent, turn)``."""
        return f"mc-{lineno}", str(lineno), None, None


class _BailianLine(msgspec.Struct):
    chat_id: int
    input_length: _Positive
    output_length: _Count
    hash_ids: msgspec.Raw
    parent_chat_id: int = -1
    timestamp: float = 0.0
    turn: int | None = None
    type: str | None = None

    def names(self, lineno: int) -> tuple[str, str, str | None, int | None]:
        rid = f"chat-{self.chat_id}"
        parent = None if self.parent_chat_id < 0 else f"chat-{self.parent_chat_id}"
        return rid, rid, parent, self.turn


class _Ids(msgspec.Struct):
    hash_ids: list[int]


_IDS = msgspec.json.Decoder(_Ids)
_ID_BYTES = 23  # text of one hash id at most: 20 digits, a sign and ", "


class HashIdFormat(NamedTuple):
    """One hash-id JSONL format: its tag in the token derivation, block size, line
    schema and timestamp unit in seconds."""

    tag: str
    block_size: int
    line_type: type[Any]
    seconds_per_unit: float


MOONCAKE = HashIdFormat("mooncake", 512, _MooncakeLine, 1e-3)
"""Mooncake FAST'25 traces: 512 tokens per hash id, timestamps in milliseconds."""
BAILIAN = HashIdFormat("bailian", 16, _BailianLine, 1.0)
"""Qwen-Bailian usage traces: 16 tokens per hash id, timestamps in seconds."""


def _plans(
    fmt: HashIdFormat, path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[tuple[int, str, Any, list[int], int, int]]:
    """Per line: ``(lineno, where, record, hash ids, prompt tokens, output tokens)``,
    checked: the sizes before the ids are built."""
    decoder = msgspec.json.Decoder(fmt.line_type)
    block = fmt.block_size
    limits = opts.limits
    s = block if opts.tokens_per_id is None else opts.tokens_per_id
    max_line, limit_name = limits.line_bytes(limits.max_prompt_tokens // s + 1, _ID_BYTES)
    order = ArrivalOrder(opts.sorted_arrivals)
    for lineno, line in iter_lines(path, max_line, progress, limit_name=limit_name):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        record = decode(decoder, line, where)
        expected = -(-record.input_length // block)
        partial = record.input_length - block * (expected - 1)
        prompt = s * (expected - 1) + -(-partial * s // block)
        output = -(-record.output_length * s // block) if opts.output else 0
        rid = record.names(lineno)[0]
        limits.check(prompt, output, f"{where}: request {rid!r}")
        n = count_items(record.hash_ids)  # an array far longer than said is never built
        hash_ids: list[int] = []
        if n <= expected:  # decoded inside their key, so a fault names $.hash_ids[i]
            hash_ids = decode(_IDS, b'{"hash_ids":' + bytes(record.hash_ids) + b"}", where).hash_ids
            n = len(hash_ids)
        if n != expected:
            raise TraceFormatError(
                f'{where}: {n} "hash_ids" but input_length {record.input_length} needs '
                f"ceil({record.input_length} / {block}) = {expected}"
            )
        order.check(record.timestamp * fmt.seconds_per_unit, where, rid)
        yield lineno, where, record, hash_ids, prompt, output


def iter_hashid(fmt: HashIdFormat, path: StrPath, opts: ReadSettings) -> Iterator[TraceRequest]:
    """Yield a hash-id trace as token requests, one line at a time.

    Raises:
        TraceFormatError: a line that is not the schema, a wrong number of ``hash_ids``
            or sizes past ``opts.limits``, naming the line.
    """
    per_id = fmt.block_size if opts.tokens_per_id is None else opts.tokens_per_id
    deriver = TokenDeriver(opts.vocab_size)
    blocks = BlockTokens(deriver, f"{fmt.tag}-block:{opts.seed}:", per_id, opts.block_cache_bytes)
    for lineno, _, record, hash_ids, prompt_len, output_len in _plans(fmt, path, opts):
        rid, output_name, parent, turn = record.names(lineno)
        tokens = blocks.prompt("", hash_ids, prompt_len)
        out = deriver.named(f"{fmt.tag}-output:{opts.seed}:{output_name}", output_len)
        arrival = record.timestamp * fmt.seconds_per_unit
        yield TraceRequest(rid, tokens, out, arrival, None, parent, turn)


def sizes_hashid(
    fmt: HashIdFormat, path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[RequestSize]:
    """Every request's id and sizes, validated as :func:`iter_hashid` does."""
    for lineno, where, record, _, prompt_len, output_len in _plans(fmt, path, opts, progress):
        yield RequestSize(record.names(lineno)[0], prompt_len, output_len, where)
