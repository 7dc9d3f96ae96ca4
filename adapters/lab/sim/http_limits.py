"""Every answer of a served engine bounded: one deadline and a byte budget per request,
and every number it sends range-checked; each failure is one :class:`ServerError` line.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from ..messages import one_line
from .errors import ServerError, SimSettingsError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "RequestLimits",
    "json_object",
    "parse_json",
    "read_body",
    "server_fraction",
    "server_int",
    "sse_data",
    "within",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request to a server may cost: seconds to the end of its answer, bytes
    of one answer (a whole stream), bytes of one stream line.

    Raises:
        SimSettingsError: a bound that is not positive.
    """

    deadline_s: float = 300.0
    max_response_bytes: int = 64 * 2**20
    max_line_bytes: int = 2**20

    def __post_init__(self) -> None:
        d = self.deadline_s
        if type(d) not in (int, float) or not math.isfinite(d) or d <= 0:
            raise SimSettingsError(f"deadline_s must be a finite number > 0, got {d!r}")
        for name in ("max_response_bytes", "max_line_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise SimSettingsError(f"{name} must be a positive int, got {value!r}")


async def within(limits: RequestLimits, where: str, request: Awaitable[T]) -> T:
    """``await request``, or a :class:`ServerError` once ``limits.deadline_s`` passed or
    the transport failed."""
    import httpx

    try:
        return await asyncio.wait_for(request, limits.deadline_s)
    except asyncio.TimeoutError:
        raise ServerError(
            f"{where}: no whole answer within {limits.deadline_s:g} s (calibrate --request-timeout)"
        ) from None
    except httpx.HTTPError as exc:
        raise ServerError(f"{where}: {type(exc).__name__}: {exc}") from None


def _check_encoding(response: httpx.Response, where: str) -> None:
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ServerError(
            f"{where}: answered with Content-Encoding {_show(encoding)}, though the client "
            "asked for none"
        )


async def read_body(response: httpx.Response, limits: RequestLimits, where: str) -> bytes:
    """The body of ``response`` as sent; a :class:`ServerError` when longer than
    ``limits.max_response_bytes`` or compressed."""
    _check_encoding(response, where)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limits.max_response_bytes:
            raise ServerError(f"{where}: an answer longer than {limits.max_response_bytes:,} bytes")
    return bytes(body)


async def sse_data(
    response: httpx.Response, limits: RequestLimits, where: str
) -> AsyncGenerator[str, None]:
    """The ``data:`` fields of a server-sent event stream, in order (other lines count
    in the byte budget); a :class:`ServerError` past a budget, not UTF-8 or compressed."""
    _check_encoding(response, where)
    total = 0
    pending = bytearray()
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > limits.max_response_bytes:
            raise ServerError(f"{where}: a stream longer than {limits.max_response_bytes:,} bytes")
        *lines, rest = chunk.split(b"\n")
        for piece in lines:
            pending += piece
            line = _line(pending, limits, where)
            pending.clear()
            if line.startswith("data:"):
                yield line[5:].strip()
        pending += rest
        _line_length(pending, limits, where)
    if pending:
        line = _line(pending, limits, where)
        if line.startswith("data:"):
            yield line[5:].strip()


def _line_length(line: bytearray, limits: RequestLimits, where: str) -> None:
    if len(line) > limits.max_line_bytes:
        raise ServerError(f"{where}: a stream line longer than {limits.max_line_bytes:,} bytes")


def _line(raw: bytearray, limits: RequestLimits, where: str) -> str:
    _line_length(raw, limits, where)
    try:
        return raw.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        raise ServerError(f"{where}: a stream line that is not UTF-8") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str | bytes, where: str) -> Any:
    """Strict JSON (no ``NaN``/``Infinity``), or a :class:`ServerError` naming ``where``."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        reason = _show(str(exc), 120).strip("'\"")
        raise ServerError(f"{where}: not JSON ({reason}): {_show(text)}") from None


def json_object(value: Any, where: str, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object, else a :class:`ServerError`."""
    if not isinstance(value, dict):
        raise ServerError(f"{where}: {what} is not a JSON object: {_show(value)}")
    return value


def server_int(value: Any, where: str, what: str, low: int, high: int) -> int:
    """``value`` when it is a whole number in ``[low, high]``, else a :class:`ServerError`."""
    if type(value) is not int or not low <= value <= high:
        raise ServerError(
            f"{where}: {what} {_show(value)} is not a whole number in [{low:,}, {high:,}]"
        )
    return value


def server_fraction(value: str, where: str, what: str) -> str:
    """``value`` when it is a number in ``(0, 1]`` written as text, else a :class:`ServerError`."""
    try:
        number = float(value) if len(value) <= 32 else math.nan
    except ValueError:
        number = math.nan
    if not 0 < number <= 1:
        raise ServerError(f"{where}: {what} {_show(value)} is not a number in (0, 1]")
    return value


def _show(value: Any, limit: int = 60) -> str:
    """``value`` for a message: short, on one line."""
    if type(value) is int and value.bit_length() > 64:
        return f"({value.bit_length()}-bit number)"
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value[: limit * 4]).decode("utf-8", "replace")
    return one_line(repr(value if not isinstance(value, str) else value[: limit * 4]), limit)
