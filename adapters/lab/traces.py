"""Request traces on disk: prefixkv's token JSONL format and Mooncake's hash-id traces.

A prefixkv trace holds real token ids, one request a line. A Mooncake trace (FAST'25
release) holds only 512-token block hash ids; :func:`load_mooncake` turns each id into
a fixed block of pseudo-random tokens, so token- and block-granular indexes replay it alike.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import sys
from array import array
from collections.abc import Iterable, Iterator
from os import PathLike
from typing import Literal, NamedTuple, TextIO, Union, cast

from prefixkv.indexes.errors import InvalidTokenError, PrefixKVError
from prefixkv.indexes.tokens import as_token_array

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "TraceFormat",
    "TraceFormatError",
    "TraceOptionError",
    "TraceRequest",
    "detect_format",
    "iter_mooncake",
    "iter_trace",
    "load_any",
    "load_mooncake",
    "mooncake_lengths",
    "open_text",
    "read_trace",
    "write_trace",
]

StrPath = Union[str, "PathLike[str]"]
TraceFormat = Literal["prefixkv", "mooncake"]

MOONCAKE_BLOCK_SIZE = 512
"""Tokens per hash id in Mooncake traces."""


class TraceFormatError(PrefixKVError):
    """A trace line is malformed; the message gives file, line number and the fault."""


class TraceOptionError(PrefixKVError):
    """A loader option (``max_requests``, ``scale_block``, ``vocab_size``) is invalid."""


class TraceRequest(NamedTuple):
    """One request of a trace.

    Attributes:
        id: unique request id.
        tokens: the prompt's token ids (non-empty).
        output: the token ids decoded after the prompt (may be empty).
    """

    id: str
    tokens: list[int]
    output: list[int]


def open_text(path: StrPath, mode: str = "r") -> TextIO:
    """Open a trace file as UTF-8 text; a name ending in ``.gz`` is gzip-compressed."""
    if str(path).endswith(".gz"):
        return cast(TextIO, gzip.open(path, mode + "t", encoding="utf-8"))
    return cast(TextIO, open(path, mode, encoding="utf-8"))


def _check_max_requests(max_requests: int | None) -> None:
    if max_requests is not None and (type(max_requests) is not int or max_requests < 0):
        raise TraceOptionError(f"max_requests must be None or an int >= 0, got {max_requests!r}")


def _token_list(value: object, field: str, *, allow_empty: bool) -> list[int]:
    """Validate a JSON token list; raises ``InvalidTokenError`` with what is wrong."""
    if not isinstance(value, list):
        raise InvalidTokenError(f'"{field}" must be a list of token ids, got {value!r:.80}')
    if not value and not allow_empty:
        raise InvalidTokenError(f'"{field}" must not be empty')
    try:
        return as_token_array(value).tolist()
    except InvalidTokenError as exc:
        raise InvalidTokenError(f'"{field}": {exc}') from None


def _parse_line(line: str, where: str) -> dict[str, object]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc.msg}): {line.strip()!r:.80}") from None
    if not isinstance(record, dict):
        raise TraceFormatError(f"{where}: expected a JSON object, got {record!r:.80}")
    return record


def iter_trace(path: StrPath, *, max_requests: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a prefixkv JSONL trace, reading lazily.

    Each non-blank line is ``{"id": str | int, "tokens": [int, ...], "output": [int, ...]}``;
    int ids become strings, ``"output"`` defaults to ``[]``, other keys are ignored.
    Lines past ``max_requests`` are not read (nor checked).

    Args:
        path: the JSONL file.
        max_requests: stop after this many requests (``None``: all).

    Raises:
        TraceFormatError: a line is not a JSON object, lacks a non-empty ``"tokens"``
            list of ints in ``[0, 2**32)`` (bools rejected), has a bad ``"output"``, a
            missing or non-str/int id, or repeats an earlier line's id.
        TraceOptionError: ``max_requests`` is not ``None`` or an int >= 0.
    """
    _check_max_requests(max_requests)
    if max_requests == 0:
        return
    seen: dict[str, int] = {}
    count = 0
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            record = _parse_line(line, where)
            if "id" not in record:
                raise TraceFormatError(f'{where}: missing "id"')
            request_id = record["id"]
            if type(request_id) is int:
                request_id = str(request_id)
            if not isinstance(request_id, str) or not request_id:
                raise TraceFormatError(
                    f'{where}: "id" must be a non-empty str or an int, got {request_id!r}'
                )
            if request_id in seen:
                raise TraceFormatError(
                    f"{where}: duplicate id {request_id!r} (first on line {seen[request_id]})"
                )
            seen[request_id] = lineno
            if "tokens" not in record:
                raise TraceFormatError(f'{where}: missing "tokens" (request {request_id!r})')
            try:
                tokens = _token_list(record["tokens"], "tokens", allow_empty=False)
                output = _token_list(record.get("output", []), "output", allow_empty=True)
            except InvalidTokenError as exc:
                raise TraceFormatError(f"{where}: {exc} (request {request_id!r})") from None
            yield TraceRequest(request_id, tokens, output)
            count += 1
            if count == max_requests:
                return


def read_trace(path: StrPath, *, max_requests: int | None = None) -> list[TraceRequest]:
    """Read a prefixkv JSONL trace; see :func:`iter_trace` for the format and errors."""
    return list(iter_trace(path, max_requests=max_requests))


def write_trace(path: StrPath, requests: Iterable[TraceRequest]) -> int:
    """Write requests as a prefixkv JSONL trace (one compact object a line).

    Args:
        path: the file to create or overwrite.
        requests: the requests, written in order.

    Returns:
        The number of requests written.

    Raises:
        TraceFormatError: a request has a non-str or empty id, a repeated id, an empty
            prompt or a bad token id; it names the request's position. Requests before
            it are already in the file.
    """
    seen: set[str] = set()
    count = 0
    with open_text(path, "w") as f:
        for position, request in enumerate(requests):
            where = f"{path}: request #{position} (id {request.id!r})"
            if not isinstance(request.id, str) or not request.id:
                raise TraceFormatError(f"{where}: id must be a non-empty str")
            if request.id in seen:
                raise TraceFormatError(f"{where}: duplicate id")
            seen.add(request.id)
            try:
                tokens = _token_list(list(request.tokens), "tokens", allow_empty=False)
                output = _token_list(list(request.output), "output", allow_empty=True)
            except InvalidTokenError as exc:
                raise TraceFormatError(f"{where}: {exc}") from None
            record = {"id": request.id, "tokens": tokens, "output": output}
            f.write(json.dumps(record, separators=(",", ":")))
            f.write("\n")
            count += 1
    return count


def mooncake_lengths(input_length: int, num_blocks: int, scale_block: int | None) -> list[int]:
    """Token count of each block of a Mooncake request, after optional scaling.

    Unscaled: ``num_blocks - 1`` blocks of 512 and a last block of
    ``input_length - 512 * (num_blocks - 1)`` tokens (1..512). With ``scale_block = s``
    every full block becomes ``s`` tokens and the last one
    ``ceil(partial * s / 512)`` tokens (1..s), so the prompt has
    ``s * (num_blocks - 1) + ceil(partial * s / 512)`` tokens.

    Args:
        input_length: the line's ``input_length``.
        num_blocks: ``len(hash_ids)``, assumed ``ceil(input_length / 512)``.
        scale_block: tokens per scaled block, or ``None`` for the real 512.
    """
    partial = input_length - MOONCAKE_BLOCK_SIZE * (num_blocks - 1)
    if scale_block is None:
        return [MOONCAKE_BLOCK_SIZE] * (num_blocks - 1) + [partial]
    last = -(-partial * scale_block // MOONCAKE_BLOCK_SIZE)
    return [scale_block] * (num_blocks - 1) + [last]


def _pseudo_random_tokens(tag: str, length: int, vocab_size: int) -> list[int]:
    """``length`` ids in ``[1, vocab_size)`` from SHAKE-128 of ``tag``.

    An extendable-output hash is stable across processes, platforms and Python
    versions (unlike ``hash()`` or ``random``'s non-``random()`` methods), and a
    shorter output is a prefix of a longer one, so a partial block is a prefix of
    the full block with the same id.
    """
    words = array("I", hashlib.shake_128(tag.encode()).digest(4 * length))
    if sys.byteorder == "big":  # pragma: no cover - the digest is read as little-endian
        words.byteswap()
    modulus = vocab_size - 1
    return [w % modulus + 1 for w in words]


def _check_mooncake_options(scale_block: int | None, vocab_size: int) -> None:
    if scale_block is not None and (
        type(scale_block) is not int or not 1 <= scale_block <= MOONCAKE_BLOCK_SIZE
    ):
        raise TraceOptionError(
            f"scale_block must be None or an int in [1, {MOONCAKE_BLOCK_SIZE}], got {scale_block!r}"
        )
    if type(vocab_size) is not int or vocab_size < 2:
        raise TraceOptionError(f"vocab_size must be an int >= 2, got {vocab_size!r}")


def _mooncake_fields(record: dict[str, object], where: str) -> tuple[int, int, list[int]]:
    """Check one Mooncake record; return ``(input_length, output_length, hash_ids)``."""
    for key in ("input_length", "output_length", "hash_ids"):
        if key not in record:
            raise TraceFormatError(f'{where}: missing "{key}"')
    input_length = record["input_length"]
    output_length = record["output_length"]
    hash_ids = record["hash_ids"]
    if type(input_length) is not int or input_length < 1:
        raise TraceFormatError(f'{where}: "input_length" must be an int >= 1, got {input_length!r}')
    if type(output_length) is not int or output_length < 0:
        raise TraceFormatError(
            f'{where}: "output_length" must be an int >= 0, got {output_length!r}'
        )
    if not isinstance(hash_ids, list) or not all(type(h) is int for h in hash_ids):
        raise TraceFormatError(f'{where}: "hash_ids" must be a list of ints, got {hash_ids!r:.80}')
    expected = -(-input_length // MOONCAKE_BLOCK_SIZE)
    if len(hash_ids) != expected:
        raise TraceFormatError(
            f'{where}: {len(hash_ids)} "hash_ids" but input_length {input_length} needs '
            f"ceil({input_length} / {MOONCAKE_BLOCK_SIZE}) = {expected}"
        )
    timestamp = record.get("timestamp", 0)
    if (
        isinstance(timestamp, bool)
        or not isinstance(timestamp, (int, float))
        or not math.isfinite(timestamp)
    ):
        raise TraceFormatError(f'{where}: "timestamp" must be a number, got {timestamp!r}')
    return input_length, output_length, hash_ids


def iter_mooncake(
    path: StrPath,
    *,
    max_requests: int | None = None,
    scale_block: int | None = None,
    vocab_size: int = 32000,
    seed: int = 0,
    output: bool = True,
) -> Iterator[TraceRequest]:
    """Yield a Mooncake hash-id trace as token requests, reading lazily.

    Each line ``{"timestamp", "input_length", "output_length", "hash_ids"}`` becomes
    ``TraceRequest("mc-<line number>", tokens, output)``. Hash id ``h`` stands for a
    fixed block of pseudo-random tokens in ``[1, vocab_size)`` derived from
    ``(seed, h)``; a request's prompt is its blocks in order, the last one cut to its
    length (see :func:`mooncake_lengths` for the lengths, scaled or not). Equal id
    prefixes therefore give equal token prefixes, and different ids different blocks
    (barring a chance collision of leading tokens). Output: ``output_length`` tokens
    (scaled: ``ceil(output_length * scale_block / 512)``, so at least 1 unless the
    trace says 0) derived from ``(seed, line number)``, distinct for every request.

    Block contents are memoized per call, so each distinct id is generated once.
    Cost: O(total prompt tokens) list copying plus O(distinct ids * block) hashing.

    Args:
        path: the Mooncake JSONL file.
        max_requests: stop after this many requests (``None``: all).
        scale_block: tokens per block instead of 512 (e.g. 16), keeping the sharing
            pattern; ``None`` keeps the real lengths.
        vocab_size: token ids are drawn from ``[1, vocab_size)``.
        seed: selects the token content; the same seed gives the same tokens in any
            process on any platform.
        output: ``False`` gives every request an empty output (prompt-only replay).

    Raises:
        TraceFormatError: a line is not a JSON object, lacks a field, has a
            non-positive ``input_length``, a negative ``output_length``, non-int
            hash ids or ``len(hash_ids) != ceil(input_length / 512)``.
        TraceOptionError: a bad ``max_requests``, ``scale_block`` or ``vocab_size``.
    """
    _check_max_requests(max_requests)
    _check_mooncake_options(scale_block, vocab_size)
    if max_requests == 0:
        return
    full = MOONCAKE_BLOCK_SIZE if scale_block is None else scale_block
    blocks: dict[int, list[int]] = {}
    count = 0
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            input_length, output_length, hash_ids = _mooncake_fields(
                _parse_line(line, where), where
            )
            tokens: list[int] = []
            lengths = mooncake_lengths(input_length, len(hash_ids), scale_block)
            for hash_id, length in zip(hash_ids, lengths, strict=True):
                block = blocks.get(hash_id)
                if block is None:
                    block = _pseudo_random_tokens(
                        f"mooncake-block:{seed}:{hash_id}", full, vocab_size
                    )
                    blocks[hash_id] = block
                tokens += block if length == full else block[:length]
            out_len = (
                output_length
                if scale_block is None
                else -(-output_length * full // MOONCAKE_BLOCK_SIZE)
            )
            out = (
                _pseudo_random_tokens(f"mooncake-output:{seed}:{lineno}", out_len, vocab_size)
                if output
                else []
            )
            yield TraceRequest(f"mc-{lineno}", tokens, out)
            count += 1
            if count == max_requests:
                return


def load_mooncake(
    path: StrPath,
    *,
    max_requests: int | None = None,
    scale_block: int | None = None,
    vocab_size: int = 32000,
    seed: int = 0,
    output: bool = True,
) -> list[TraceRequest]:
    """Load a Mooncake hash-id trace; see :func:`iter_mooncake` for the rules and errors."""
    return list(
        iter_mooncake(
            path,
            max_requests=max_requests,
            scale_block=scale_block,
            vocab_size=vocab_size,
            seed=seed,
            output=output,
        )
    )


def detect_format(path: StrPath) -> TraceFormat:
    """Tell a prefixkv trace from a Mooncake one by the first non-blank line's keys.

    ``"tokens"`` means prefixkv, else ``"hash_ids"`` means Mooncake.

    Raises:
        TraceFormatError: the file has no non-blank line, or its first one is not a
            JSON object with either key.
    """
    with open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            record = _parse_line(line, f"{path}:{lineno}")
            if "tokens" in record:
                return "prefixkv"
            if "hash_ids" in record:
                return "mooncake"
            raise TraceFormatError(
                f'{path}:{lineno}: neither a prefixkv ("tokens") nor a Mooncake ("hash_ids") '
                f"record; keys {sorted(record)}"
            )
    raise TraceFormatError(f"{path}: empty trace (no non-blank line)")


def load_any(
    path: StrPath,
    *,
    max_requests: int | None = None,
    scale_block: int | None = None,
    vocab_size: int = 32000,
    seed: int = 0,
    output: bool = True,
) -> list[TraceRequest]:
    """Load either trace format, chosen by :func:`detect_format` (for the CLI).

    ``vocab_size`` and ``seed`` only matter for Mooncake traces; ``output=False``
    empties every request's output in both formats.

    Raises:
        TraceFormatError: as :func:`detect_format`, :func:`iter_trace` or
            :func:`iter_mooncake`.
        TraceOptionError: a bad option, or ``scale_block`` given for a prefixkv trace
            (whose tokens are concrete and cannot be rescaled).
    """
    if detect_format(path) == "mooncake":
        return load_mooncake(
            path,
            max_requests=max_requests,
            scale_block=scale_block,
            vocab_size=vocab_size,
            seed=seed,
            output=output,
        )
    if scale_block is not None:
        raise TraceOptionError(
            f"scale_block={scale_block!r} applies to Mooncake traces only; {path} is a "
            "prefixkv trace"
        )
    requests = read_trace(path, max_requests=max_requests)
    if output:
        return requests
    return [r._replace(output=[]) for r in requests]
