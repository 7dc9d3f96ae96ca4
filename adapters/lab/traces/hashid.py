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
from prefixkv.indexes.validation import ceil_div

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


def rows_hashid(
    fmt: HashIdFormat, path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[tuple[RequestSize, tuple[int, Any, list[int]]]]:
    """Per line, checked (the sizes before the ids are built): its sizes, and its line
    number, record and hash ids."""
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
        expected = ceil_div(record.input_length, block)
        prompt = ceil_div(record.input_length * s, block)
        output = ceil_div(record.output_length * s, block) if opts.output else 0
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
        yield RequestSize(rid, prompt, output, where), (lineno, record, hash_ids)


def iter_hashid(fmt: HashIdFormat, path: StrPath, opts: ReadSettings) -> Iterator[TraceRequest]:
    """Yield a hash-id trace as token requests, one line at a time.

    Raises:
        TraceFormatError: a line that is not the schema, a wrong number of ``hash_ids``
            or sizes past ``opts.limits``, naming the line.
    """
    per_id = fmt.block_size if opts.tokens_per_id is None else opts.tokens_per_id
    deriver = TokenDeriver(opts.vocab_size)
    blocks = BlockTokens(deriver, f"{fmt.tag}-block:{opts.seed}:", per_id, opts.block_cache_bytes)
    for size, (lineno, record, hash_ids) in rows_hashid(fmt, path, opts):
        rid, output_name, parent, turn = record.names(lineno)
        tokens = blocks.prompt("", hash_ids, size.prompt_tokens)
        out = deriver.named(f"{fmt.tag}-output:{opts.seed}:{output_name}", size.output_tokens)
        arrival = record.timestamp * fmt.seconds_per_unit
        yield TraceRequest(rid, tokens, out, arrival, None, parent, turn)
