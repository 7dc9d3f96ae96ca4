"""Reading trace files safely: numbered byte lines from plain, gzip or xz files, JSON by msgspec.

Every fault a file can have (corrupt compression, bad UTF-8, not JSON, a line past its
limit, a FIFO or device) becomes a :class:`TraceFormatError` naming ``file:line``; a
line is read at most up to its limit, so an oversized line costs its limit, never its size.
"""

from __future__ import annotations

import gzip
import lzma
import zlib
from collections.abc import Callable, Iterator
from typing import IO, TypeVar, cast

import msgspec

from prefixkv.adapters.inputs import StrPath, open_input

from ..messages import one_line
from .base import TraceFormatError

Progress = Callable[[int], object]
"""Told how many more input bytes were read."""
T = TypeVar("T")

_STREAM_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)

_UNREAD = {b"BZh": "bzip2", b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip"}
"""Magic bytes of the compressions prefixkv does not decompress."""


def open_stream(raw: IO[bytes], path: StrPath) -> tuple[IO[bytes], str]:
    """``raw`` decompressed by its magic bytes (not its suffix), and the compression's
    name; a bzip2, zstd or zip file is a TraceFormatError."""
    head = raw.read(6)
    raw.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw)), "gzip"
    if head.startswith(b"\xfd7zXZ\x00"):
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
    """Yield ``(line number, line bytes)`` for every line (blank ones too) of a plain,
    gzip or xz file; ``progress`` is told the file bytes each line consumed.

    Raises:
        TraceFormatError: an unreadable or corrupt file, or a line longer than
            ``max_line_bytes`` (``limit_name`` says what bounds it).
    """
    with open_input(path, what="trace", error=TraceFormatError) as raw:
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
    """The elements of a JSON array of numbers, from its text alone (commas plus one);
    0 for ``[]`` or anything but an array, an upper bound for nested arrays."""
    text = bytes(raw)
    if text.lstrip()[:1] != b"[":
        return 0
    commas = text.count(b",")
    if commas:
        return commas + 1
    return 1 if text.strip()[1:-1].strip() else 0


def decode(decoder: msgspec.json.Decoder[T], data: bytes | bytearray, where: str) -> T:
    """Decode one JSON document with a typed msgspec decoder; a fault is a
    TraceFormatError after ``where`` (msgspec names the JSON path of a bad field)."""
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
