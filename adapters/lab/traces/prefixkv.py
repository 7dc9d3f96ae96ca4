"""prefixkv's own trace format: JSON lines of real token ids (plain or gzip).

One request a line: ``{"id": str | int, "tokens": [int, ...], "output": [int, ...]}``
with optional ``"arrival"`` (seconds from the trace's start), ``"session"``,
``"parent"``, ``"turn"`` and ``"think_s"`` (seconds after the previous turn's answer);
other keys are ignored. Lines are decoded and validated by msgspec in C, and the ids
go straight into ``array('I')``.

Memory stays bounded by the size limits: a line is read at most as far as a request
within them can reach (12 bytes a token), and a line with more numbers than the
limits allow has its token lists counted, not built, before it is refused.
"""

from __future__ import annotations

import gzip
from array import array
from collections.abc import Iterable, Iterator
from typing import Annotated

import msgspec

from prefixkv.adapters.outputs import atomic_writer
from prefixkv.indexes.errors import InvalidTokenError

from .base import (
    ArrivalOrder,
    TraceFormatError,
    TraceLimits,
    TraceRequest,
    check_request_id,
    tokens_of,
)
from .reading import Progress, StrPath, count_items, decode, iter_lines

__all__ = ["RequestSize", "iter_prefixkv", "sizes_prefixkv", "write_trace"]

_Token = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]


class _Line(msgspec.Struct):
    id: str | int
    tokens: Annotated[list[_Token], msgspec.Meta(min_length=1)]
    output: list[_Token] = msgspec.field(default_factory=list)
    arrival: Annotated[float, msgspec.Meta(ge=0)] | None = None
    session: str | None = None
    parent: str | None = None
    turn: int | None = None
    think_s: Annotated[float, msgspec.Meta(ge=0)] | None = None


class _Counts(msgspec.Struct):
    """A line with its token lists left as text: what is counted before they are built."""

    tokens: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    output: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


_COUNTS = msgspec.json.Decoder(_Counts)

_TOKEN_BYTES = 12
"""Text of one token id at most: 10 digits (below 2**32) and ``", "``."""

_OTHER_NUMBERS = 64
"""Commas a line may hold outside its token lists before they are counted first."""


class RequestSize(msgspec.Struct, frozen=True):
    """What the sizes pass learns of one request without building its tokens."""

    id: str
    prompt_tokens: int
    output_tokens: int
    where: str


def _records(
    path: StrPath,
    limits: TraceLimits,
    progress: Progress | None = None,
    *,
    sorted_arrivals: bool = False,
) -> Iterator[tuple[str, _Line]]:
    decoder = msgspec.json.Decoder(_Line)
    most = limits.max_prompt_tokens + limits.max_output_tokens
    max_line, limit_name = limits.line_bytes(most, _TOKEN_BYTES)
    order = ArrivalOrder(sorted_arrivals)
    for lineno, line in iter_lines(path, max_line, progress, limit_name=limit_name):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        if line.count(b",") > most + _OTHER_NUMBERS:
            _refuse_oversized(line, where, limits)
        record = decode(decoder, line, where)
        try:
            record.id = check_request_id(record.id)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{where}: {exc}") from None
        fault = limits.check_prompt(len(record.tokens)) or limits.check_output(len(record.output))
        if fault:
            raise TraceFormatError(f"{where}: request {record.id!r}: {fault}")
        order.check(record.arrival, where, record.id)
        yield where, record


def _refuse_oversized(line: bytes, where: str, limits: TraceLimits) -> None:
    """Refuse a line whose token lists exceed the limits, counting them without
    building them; return when they are within (the commas were elsewhere)."""
    counts = decode(_COUNTS, line, where)
    fault = limits.check_prompt(count_items(counts.tokens)) or limits.check_output(
        count_items(counts.output)
    )
    if fault:
        raise TraceFormatError(f"{where}: {fault}")


def iter_prefixkv(
    path: StrPath, *, limits: TraceLimits, output: bool = True, sorted_arrivals: bool = False
) -> Iterator[TraceRequest]:
    """Yield the requests of a prefixkv trace, one line at a time.

    Raises:
        TraceFormatError: a line that is not JSON, lacks ``"id"`` or a non-empty
            ``"tokens"`` list, holds a token outside ``[0, 2**32)`` (or a bool, a
            float), a bad id, a size past ``limits``, or (``sorted_arrivals``) an
            arrival before the previous one; the message names the line.
        OSError: the file cannot be read.
    """
    for _, r in _records(path, limits, sorted_arrivals=sorted_arrivals):
        tokens = array("I", r.tokens)
        out = array("I", r.output) if output else array("I")
        yield TraceRequest(
            str(r.id), tokens, out, r.arrival, r.session, r.parent, r.turn, r.think_s
        )


def sizes_prefixkv(
    path: StrPath,
    *,
    limits: TraceLimits,
    output: bool = True,
    progress: Progress | None = None,
    sorted_arrivals: bool = False,
) -> Iterator[RequestSize]:
    """Every request's id and sizes, validating each line as :func:`iter_prefixkv` does."""
    for where, r in _records(path, limits, progress, sorted_arrivals=sorted_arrivals):
        yield RequestSize(str(r.id), len(r.tokens), len(r.output) if output else 0, where)


def write_trace(path: StrPath, requests: Iterable[TraceRequest]) -> int:
    """Write requests as a prefixkv trace, atomically (gzip when the name ends in ``.gz``).

    Returns:
        The number of requests written.

    Raises:
        TraceFormatError: a request has a bad id, a repeated id (within the file), an
            empty prompt or a bad token; it names the request's position, and the
            file is left as it was.
    """
    encoder = msgspec.json.Encoder()
    seen: set[str] = set()
    count = 0
    with atomic_writer(path) as raw:
        f = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if str(path).endswith(".gz") else raw
        for position, request in enumerate(requests):
            try:
                rid = check_request_id(request.id)
            except TraceFormatError as exc:
                raise TraceFormatError(f"{path}: request #{position}: {exc}") from None
            where = f"{path}: request #{position} (id {rid!r})"
            if rid in seen:
                raise TraceFormatError(f"{where}: duplicate id")
            seen.add(rid)
            record: dict[str, object] = {
                "id": rid,
                "tokens": _token_list(request.tokens, where, "tokens", allow_empty=False),
                "output": _token_list(request.output, where, "output", allow_empty=True),
            }
            for key in ("arrival", "session", "parent", "turn", "think_s"):
                value = getattr(request, key, None)
                if value is not None:
                    record[key] = value
            f.write(encoder.encode(record))
            f.write(b"\n")
            count += 1
        if f is not raw:
            f.close()
    return count


def _token_list(values: Iterable[int], where: str, field: str, *, allow_empty: bool) -> list[int]:
    try:
        tokens = tokens_of(values)
    except InvalidTokenError as exc:
        raise TraceFormatError(f'{where}: "{field}": {exc}') from None
    if not tokens and not allow_empty:
        raise TraceFormatError(f'{where}: "{field}" must not be empty')
    return tokens.tolist()
