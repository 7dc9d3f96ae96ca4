"""Reading trace files safely: numbered byte lines from plain, gzip or xz files, JSON by msgspec.

Every fault a file can have — a truncated or corrupt gzip or xz stream, a compression
prefixkv does not read (bzip2, zstd, zip: refused by name), bad UTF-8, a line that is
not JSON, a 5000-digit integer, a line longer than the limit — becomes a
:class:`TraceFormatError` naming ``file:line``; nothing raw (``EOFError``,
``zlib.error``, ``lzma.LZMAError``, ``UnicodeDecodeError``, ``MemoryError``) escapes
a reader. A line is read at most up to its limit, decompressed or not, so an
oversized line costs its limit, never its size. A trace is a regular file (or, for
kv-cache-tester, a folder): a FIFO, a device or a socket is refused by name before it
is opened (:mod:`prefixkv.adapters.inputs`), so nothing blocks or reads forever, and
every error names the file.
"""

from __future__ import annotations

import gzip
import lzma
import zlib
from collections.abc import Callable, Iterator
from os import PathLike
from typing import IO, TypeVar, Union, cast

import msgspec

from prefixkv.adapters.inputs import open_input

from ..messages import one_line
from .base import TraceFormatError

__all__ = [
    "GZIP_MAGIC",
    "XZ_MAGIC",
    "Progress",
    "StrPath",
    "count_items",
    "decode",
    "iter_lines",
    "open_stream",
    "open_trace_file",
]

StrPath = Union[str, "PathLike[str]"]
Progress = Callable[[int], object]
"""Told how many more input bytes were read."""
T = TypeVar("T")

GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of every gzip member."""

XZ_MAGIC = b"\xfd7zXZ\x00"
"""The first six bytes of every xz stream."""

_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)

_UNREAD = {  # magic -> the compression prefixkv does not decompress
    b"BZh": "bzip2",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}


def open_trace_file(path: StrPath) -> IO[bytes]:
    """A trace file opened for binary reading, once it is known to be a regular file.

    Raises:
        TraceFormatError: missing, unreadable, or a FIFO, device, socket or folder
            (refused before it is opened, so a FIFO without a writer cannot block).
    """
    return open_input(path, what="trace", error=TraceFormatError)


def open_stream(raw: IO[bytes], path: StrPath) -> tuple[IO[bytes], str]:
    """``raw`` decompressed by its magic bytes (the name's suffix is not trusted), and
    the name of its compression for messages (``"plain"``, ``"gzip"``, ``"xz"``).

    Raises:
        TraceFormatError: a bzip2, zstd or zip file (refused by name).
    """
    head = raw.read(6)
    raw.seek(0)
    if head.startswith(GZIP_MAGIC):
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw)), "gzip"
    if head.startswith(XZ_MAGIC):
        return cast(IO[bytes], lzma.LZMAFile(raw)), "xz"
    for magic, name in _UNREAD.items():
        if head.startswith(magic):
            raise TraceFormatError(
                f"{path}: a {name}-compressed file; prefixkv reads plain, gzip and xz "
                "traces: decompress it first"
            )
    return raw, "plain"


def iter_lines(
    path: StrPath,
    max_line_bytes: int,
    progress: Progress | None = None,
    *,
    limit_name: str = "the document size limit",
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(line number, line bytes)`` for every line of a plain, gzip or xz file.

    Blank lines are yielded too (callers skip them, keeping the numbering).
    ``progress`` is told how many bytes of the file (compressed, for gzip and xz) each
    line consumed, so a bar over the file size has a stable ETA.

    Args:
        path: the file.
        max_line_bytes: the longest line accepted; reading stops one byte past it.
        progress: told the bytes each line consumed.
        limit_name: what ``max_line_bytes`` is, for the message.

    Raises:
        TraceFormatError: not a regular file, a corrupt or truncated gzip or xz
            stream, a compression prefixkv does not read, or a line longer than
            ``max_line_bytes`` (it names the line and stops before buffering more),
            or a read that fails.
    """
    with open_trace_file(path) as raw:
        f, kind = open_stream(raw, path)
        lineno = 0
        done = 0
        while True:
            try:
                line = f.readline(max_line_bytes + 1)
            except _STREAM_ERRORS as exc:
                raise TraceFormatError(
                    f"{path}:{lineno + 1}: corrupt or truncated {kind} stream "
                    f"({type(exc).__name__}: {one_line(str(exc))})"
                ) from None
            except OSError as exc:
                raise TraceFormatError(
                    f"{path}:{lineno + 1}: cannot read the trace: {exc.strerror or exc}"
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
                    f"{path}:{lineno}: line longer than {max_line_bytes:,} bytes ({limit_name})"
                )
            yield lineno, line


def count_items(raw: bytes | msgspec.Raw) -> int:
    """How many elements a JSON array of numbers holds, from its text alone (no list is
    built): its commas plus one, 0 for ``[]``. Anything but an array counts 0 (the
    typed decoding that follows reports it). For an array that holds strings or
    arrays the count is an upper bound. O(len(raw)), in C.
    """
    text = bytes(raw)  # the one copy: no slice of it is taken unless it is tiny
    if text.lstrip()[:1] != b"[":
        return 0
    commas = text.count(b",")
    if commas:
        return commas + 1
    return 1 if text.strip()[1:-1].strip() else 0


def decode(decoder: msgspec.json.Decoder[T], data: bytes | bytearray, where: str) -> T:
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


def _head(data: bytes | bytearray) -> str:
    return repr(data[:60].decode("utf-8", "replace").strip()) + ("..." if len(data) > 60 else "")
