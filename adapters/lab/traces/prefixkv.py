"""prefixkv's own trace format: JSON lines of real token ids (plain or gzip).

One request a line: ``{"id": str | int, "tokens": [int, ...], "output": [int, ...]}``
with optional ``"arrival"``, ``"session"``, ``"parent"``, ``"turn"`` and ``"think_s"``;
other keys are ignored. A line with more numbers than the limits allow has its token
lists counted, not built, before it is refused.
"""

from __future__ import annotations

import gzip
from array import array
from collections.abc import Iterable, Iterator
from typing import Annotated

import msgspec

from prefixkv.adapters.inputs import StrPath
from prefixkv.adapters.outputs import atomic_writer
from prefixkv.indexes.errors import InvalidTokenError
from prefixkv.indexes.tokens import as_token_array

from .base import ArrivalOrder, ReadSettings, TraceFormatError, TraceRequest, check_request_id
from .reading import Progress, count_items, decode, iter_lines

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
    tokens: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    output: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)


_COUNTS = msgspec.json.Decoder(_Counts)
_TOKEN_BYTES = 12  # text of one token id at most: 10 digits and ", "
_OTHER_NUMBERS = 64  # commas a line may hold outside its token lists before they are counted


class RequestSize(msgspec.Struct, frozen=True):
    """What the sizes pass learns of one request without building its tokens."""

    id: str
    prompt_tokens: int
    output_tokens: int
    where: str


def rows_prefixkv(
    path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[tuple[RequestSize, _Line]]:
    """Per line, checked against the schema, the limits and the arrival order: its
    sizes and its record."""
    decoder = msgspec.json.Decoder(_Line)
    limits = opts.limits
    most = limits.max_prompt_tokens + limits.max_output_tokens
    max_line, limit_name = limits.line_bytes(most, _TOKEN_BYTES)
    order = ArrivalOrder(opts.sorted_arrivals)
    for lineno, line in iter_lines(path, max_line, progress, limit_name=limit_name):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        if line.count(b",") > most + _OTHER_NUMBERS:
            counts = decode(_COUNTS, line, where)
            limits.check(count_items(counts.tokens), count_items(counts.output), where)
        record = decode(decoder, line, where)
        try:
            record.id = rid = check_request_id(record.id)
        except TraceFormatError as exc:
            raise TraceFormatError(f"{where}: {exc}") from None
        limits.check(len(record.tokens), len(record.output), f"{where}: request {rid!r}")
        order.check(record.arrival, where, rid)
        output = len(record.output) if opts.output else 0
        yield RequestSize(rid, len(record.tokens), output, where), record


def iter_prefixkv(path: StrPath, opts: ReadSettings) -> Iterator[TraceRequest]:
    """Yield the requests of a prefixkv trace, one line at a time.

    Raises:
        TraceFormatError: a line not of the schema, a bad id, a size past the limits or
            an arrival out of order, naming the line.
    """
    for _, r in rows_prefixkv(path, opts):
        out = array("I", r.output) if opts.output else array("I")
        yield TraceRequest(
            str(r.id), array("I", r.tokens), out, r.arrival, r.session, r.parent, r.turn, r.think_s
        )


def write_trace(path: StrPath, requests: Iterable[TraceRequest]) -> int:
    """Write requests as a prefixkv trace, atomically (gzip when the name ends in ``.gz``);
    return how many.

    Raises:
        TraceFormatError: a bad or repeated id, an empty prompt or a bad token, naming
            the request's position; the file is left as it was.
    """
    encoder = msgspec.json.Encoder()
    seen: set[str] = set()
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
            record: dict[str, object] = {"id": rid}
            for key in ("tokens", "output"):
                try:
                    record[key] = tokens = as_token_array(getattr(request, key)).tolist()
                except InvalidTokenError as exc:
                    raise TraceFormatError(f'{where}: "{key}": {exc}') from None
                if not tokens and key == "tokens":
                    raise TraceFormatError(f'{where}: "tokens" must not be empty')
            for key in ("arrival", "session", "parent", "turn", "think_s"):
                value = getattr(request, key, None)
                if value is not None:
                    record[key] = value
            f.write(encoder.encode(record) + b"\n")
        if f is not raw:
            f.close()
    return len(seen)
