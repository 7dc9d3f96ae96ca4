"""Hash-id JSON-lines traces: Mooncake (512-token blocks) and Qwen-Bailian (16-token blocks).

Both publish, per request, one integer per block of prompt tokens (equal ids: equal
prefixes through that block), ``ceil(input_length / block)`` ids with the last block
partial, and an output length:

- Mooncake FAST'25 (``kvcache-ai/Mooncake``, ``FAST25-release/traces``):
  ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``; ids ``mc-<line>``.
- Qwen-Bailian (``alibaba-edu/qwen-bailian-usagetraces-anon``): ``{"chat_id",
  "parent_chat_id" (-1 for a root), "timestamp": s, "input_length", "output_length",
  "type", "turn", "hash_ids"}`` (salted SipHash of 16-token blocks, remapped to
  integers); ids ``chat-<chat_id>``, the parent chat as ``parent``.

Each block id expands to tokens (:mod:`.blocks`) at the format's real block size, or
at ``tokens_per_id`` tokens to keep the sharing pattern at another granularity (the
last block and the output are scaled alike, rounding up).

Memory stays bounded by the size limits: a line is read at most as far as a request
within them can reach, and the size limits are checked from ``input_length`` and
``output_length`` before ``hash_ids`` are built.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from .base import ArrivalOrder, ReadSettings, TraceFormatError, TraceRequest
from .blocks import BlockTokens, TokenDeriver
from .prefixkv import RequestSize
from .reading import Progress, StrPath, count_items, decode, iter_lines

__all__ = [
    "BAILIAN",
    "BAILIAN_BLOCK_SIZE",
    "MOONCAKE",
    "MOONCAKE_BLOCK_SIZE",
    "HashIdFormat",
    "iter_hashid",
    "scaled_lengths",
    "sizes_hashid",
]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per hash id in Mooncake traces."""

BAILIAN_BLOCK_SIZE = 16
"""Tokens per hash id in Qwen-Bailian traces."""

_Count = Annotated[int, msgspec.Meta(ge=0)]
_Positive = Annotated[int, msgspec.Meta(ge=1)]


# hash_ids stay text until the sizes they imply are checked (_IDS builds them)
class _MooncakeLine(msgspec.Struct):
    input_length: _Positive
    output_length: _Count
    hash_ids: msgspec.Raw
    timestamp: float = 0.0


class _BailianLine(msgspec.Struct):
    chat_id: int
    input_length: _Positive
    output_length: _Count
    hash_ids: msgspec.Raw
    parent_chat_id: int = -1
    timestamp: float = 0.0
    turn: int | None = None
    type: str | None = None


class _Ids(msgspec.Struct):
    hash_ids: list[int]


_IDS = msgspec.json.Decoder(_Ids)

_ID_BYTES = 23
"""Text of one hash id at most: 20 digits (a 64-bit int), a sign and ``", "``."""


@dataclass(frozen=True, slots=True)
class HashIdFormat:
    """One hash-id JSONL format: its block size, line schema and naming.

    Attributes:
        name: the format's name (``"mooncake"``, ``"bailian"``).
        block_size: tokens per hash id in the published trace.
        line_type: the msgspec schema of one line.
        seconds_per_unit: the timestamp unit in seconds (Mooncake: ms).
        tag: names the format in the token derivation.
    """

    name: str
    block_size: int
    line_type: type[Any]
    seconds_per_unit: float
    tag: str

    def request_id(self, lineno: int, record: Any) -> str:
        """The id a line's request gets."""
        if self.name == "bailian":
            return f"chat-{record.chat_id}"
        return f"mc-{lineno}"

    def output_name(self, lineno: int, request_id: str) -> str:
        """What names a request's output in the token derivation."""
        return str(lineno) if self.name == "mooncake" else request_id

    def links(self, record: Any) -> tuple[str | None, int | None]:
        """``(parent, turn)`` of a line."""
        if self.name == "bailian":
            parent = None if record.parent_chat_id < 0 else f"chat-{record.parent_chat_id}"
            return parent, record.turn
        return None, None


MOONCAKE = HashIdFormat("mooncake", MOONCAKE_BLOCK_SIZE, _MooncakeLine, 1e-3, "mooncake")
"""Mooncake FAST'25 traces (timestamps in milliseconds)."""

BAILIAN = HashIdFormat("bailian", BAILIAN_BLOCK_SIZE, _BailianLine, 1.0, "bailian")
"""Qwen-Bailian usage traces (timestamps in seconds)."""


def scaled_lengths(
    input_length: int, output_length: int, num_ids: int, block: int, tokens_per_id: int | None
) -> tuple[int, int]:
    """``(prompt, output)`` token counts after expansion.

    Unscaled they are the trace's. With ``tokens_per_id = s`` every full block is
    ``s`` tokens, the last (``p = input_length - block * (num_ids - 1)`` tokens) is
    ``ceil(p * s / block)``, and the output ``ceil(output_length * s / block)``.
    """
    if tokens_per_id is None:
        return input_length, output_length
    s = tokens_per_id
    partial = input_length - block * (num_ids - 1)
    return s * (num_ids - 1) + -(-partial * s // block), -(-output_length * s // block)


def _plans(
    fmt: HashIdFormat, path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[tuple[int, str, str, Any, list[int], int, int]]:
    """Per line: ``(lineno, where, id, record, hash ids, prompt tokens, output tokens)``,
    checked: the sizes before the ids are built."""
    decoder = msgspec.json.Decoder(fmt.line_type)
    block = fmt.block_size
    limits = opts.limits
    per_id = block if opts.tokens_per_id is None else opts.tokens_per_id
    max_line, limit_name = limits.line_bytes(limits.max_prompt_tokens // per_id + 1, _ID_BYTES)
    order = ArrivalOrder(opts.sorted_arrivals)
    for lineno, line in iter_lines(path, max_line, progress, limit_name=limit_name):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        record = decode(decoder, line, where)
        expected = -(-record.input_length // block)
        prompt, output = scaled_lengths(
            record.input_length, record.output_length, expected, block, opts.tokens_per_id
        )
        if not opts.output:
            output = 0
        fault = limits.check_prompt(prompt) or limits.check_output(output)
        rid = fmt.request_id(lineno, record)
        if fault:
            raise TraceFormatError(f"{where}: request {rid!r}: {fault}")
        # counted first: an array far longer than input_length says is never built
        n = count_items(record.hash_ids)
        hash_ids: list[int] = []
        if n <= expected:  # decoded inside their key, so a fault names $.hash_ids[i]
            text = b'{"hash_ids":' + bytes(record.hash_ids) + b"}"
            hash_ids = decode(_IDS, text, where).hash_ids
            n = len(hash_ids)
        if n != expected:
            raise TraceFormatError(
                f'{where}: {n} "hash_ids" but input_length {record.input_length} needs '
                f"ceil({record.input_length} / {block}) = {expected}"
            )
        order.check(record.timestamp * fmt.seconds_per_unit, where, rid)
        yield lineno, where, rid, record, hash_ids, prompt, output


def iter_hashid(fmt: HashIdFormat, path: StrPath, opts: ReadSettings) -> Iterator[TraceRequest]:
    """Yield a hash-id trace as token requests, one line at a time.

    Equal id prefixes give equal token prefixes, different ids different blocks
    (barring a chance equal leading token), and a partial last block is a prefix of
    the full block with its id. The output is ``output_length`` tokens derived from
    the request, distinct for every request.

    Memory: one request's tokens and a bounded cache of recent blocks.

    Raises:
        TraceFormatError: a line that is not JSON, lacks a field, has a field of the
            wrong type or range, ``len(hash_ids) != ceil(input_length / block)``, or
            sizes past ``opts.limits``; the message names the line.
        TraceOptionError: a bad ``tokens_per_id`` or ``vocab_size``.
    """
    per_id = fmt.block_size if opts.tokens_per_id is None else opts.tokens_per_id
    deriver = TokenDeriver(opts.vocab_size)
    blocks = BlockTokens(deriver, f"{fmt.tag}-block:{opts.seed}:", per_id, opts.block_cache_bytes)
    output_tag = f"{fmt.tag}-output:{opts.seed}:"
    for lineno, _, rid, record, hash_ids, prompt_len, output_len in _plans(fmt, path, opts):
        tokens = blocks.prompt("", hash_ids, prompt_len)
        out = deriver.named(f"{output_tag}{fmt.output_name(lineno, rid)}", output_len)
        parent, turn = fmt.links(record)
        arrival = record.timestamp * fmt.seconds_per_unit
        yield TraceRequest(rid, tokens, out, arrival, None, parent, turn)


def sizes_hashid(
    fmt: HashIdFormat, path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[RequestSize]:
    """Every request's id and sizes, validated as :func:`iter_hashid` does, nothing expanded."""
    for _, where, rid, _, _, prompt_len, output_len in _plans(fmt, path, opts, progress):
        yield RequestSize(rid, prompt_len, output_len, where)
