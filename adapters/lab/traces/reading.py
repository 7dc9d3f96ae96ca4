"""Reading trace files safely: numbered byte lines from plain or gzip files, JSON by msgspec.

Every fault a file can have — a truncated or corrupt gzip stream, bad UTF-8, a line
that is not JSON, a 5000-digit integer, a line longer than the limit — becomes a
:class:`TraceFormatError` naming ``file:line``; nothing raw (``EOFError``,
``zlib.error``, ``UnicodeDecodeError``, ``MemoryError``) escapes a reader.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable, Iterator
from os import PathLike
from typing import IO, TypeVar, Union, cast

import msgspec

from .base import TraceFormatError

__all__ = ["GZIP_MAGIC", "Progress", "StrPath", "decode", "is_gzip", "iter_lines", "one_line"]

StrPath = Union[str, "PathLike[str]"]
Progress = Callable[[int], object]
"""Told how many more input bytes were read."""
T = TypeVar("T")

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of every gzip member."""

_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


def is_gzip(path: StrPath) -> bool:
    """Whether the file starts with the gzip magic (the name's suffix is not trusted)."""
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def one_line(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters, for error messages."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def iter_lines(
    path: StrPath, max_line_bytes: int, progress: Progress | None = None
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, line bytes)`` for every line of a plain or gzip file.

    Blank lines are yielded too (callers skip them, keeping the numbering).
    ``progress`` is told how many bytes of the file (compressed, for gzip) each line
    consumed, so a bar over the file size has a stable ETA.

    Raises:
        TraceFormatError: a corrupt or truncated gzip stream, or a line longer than
            ``max_line_bytes`` (it names the line and stops before buffering more).
        OSError: the file cannot be opened or read.
    """
    with open(path, "rb") as raw:
        f: IO[bytes] = (
            cast(IO[bytes], gzip.GzipFile(fileobj=raw)) if raw.read(2) == GZIP_MAGIC else raw
        )
        raw.seek(0)
        lineno = 0
        done = 0
        while True:
            try:
                line = f.readline(max_line_bytes + 1)
            except _STREAM_ERRORS as exc:
                raise TraceFormatError(
                    f"{path}:{lineno + 1}: corrupt or truncated gzip stream "
                    f"({type(exc).__name__}: {one_line(str(exc))})"
                ) from None
            if not line:
                return
            lineno += 1
            if progress is not None:
                now = raw.tell()
                progress(now - done)
                done = now
            if len(line) > max_line_bytes:
                raise TraceFormatError(
                    f"{path}:{lineno}: line longer than {max_line_bytes:,} bytes "
                    "(the document size limit)"
                )
            yield lineno, line


def decode(decoder: msgspec.json.Decoder[T], data: bytes, where: str) -> T:
    """Decode one JSON document with a typed msgspec decoder.

    Raises:
        TraceFormatError: ``where``, then what is wrong: not JSON (malformed, bad
            UTF-8, truncated) or a field of the wrong type or range (msgspec's
            message names the JSON path, e.g. ``$.tokens[3]``).
    """
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"{where}: {one_line(str(exc))}: {_head(data)}") from None
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({one_line(str(exc))}): {_head(data)}") from None
    except RecursionError:
        raise TraceFormatError(f"{where}: JSON nested too deeply: {_head(data)}") from None


def _head(data: bytes) -> str:
    return repr(data[:60].decode("utf-8", "replace").strip()) + ("..." if len(data) > 60 else "")
