"""Request traces on disk, read as streams: prefixkv JSONL and the public hash-id traces.

Formats: prefixkv's token JSONL (plain or gzip), Mooncake FAST'25 (512 tokens per
hash id), Qwen-Bailian (16 tokens per id, ``chat_id`` chains) and kv-cache-tester's
Claude Code conversations (64 tokens per id, sub-agents; a folder, a ``.json`` or a
``.tar.xz``). :func:`open_trace` returns a re-readable :class:`TraceSource`; the list
helpers below are for small traces and tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypedDict

from prefixkv.adapters.outputs import OutputError, atomic_writer, refuse_overwrite

from .base import (
    DEFAULT_LIMITS,
    ReadSettings,
    TraceFormatError,
    TraceLimits,
    TraceOptionError,
    TraceRequest,
    check_request_id,
    make_request,
    tokens_of,
)
from .hashid import BAILIAN_BLOCK_SIZE, MOONCAKE_BLOCK_SIZE, scaled_lengths
from .kvcache_tester import KVCT_BLOCK_SIZE
from .prefixkv import write_trace
from .reading import StrPath
from .source import (
    FORMATS,
    TraceFormat,
    TraceSource,
    TraceStats,
    detect_format,
    open_trace,
    stats_of,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "BAILIAN_BLOCK_SIZE",
    "DEFAULT_LIMITS",
    "FORMATS",
    "KVCT_BLOCK_SIZE",
    "MOONCAKE_BLOCK_SIZE",
    "LoadOptions",
    "OutputError",
    "ReadSettings",
    "TraceFormat",
    "TraceFormatError",
    "TraceLimits",
    "TraceOptionError",
    "TraceRequest",
    "TraceSource",
    "TraceStats",
    "atomic_writer",
    "check_request_id",
    "detect_format",
    "iter_mooncake",
    "iter_trace",
    "load_any",
    "load_mooncake",
    "make_request",
    "open_trace",
    "read_trace",
    "refuse_overwrite",
    "scaled_lengths",
    "stats_of",
    "tokens_of",
    "write_trace",
]


class LoadOptions(TypedDict, total=False):
    """The keyword options of :func:`iter_mooncake`, :func:`load_mooncake`, :func:`load_any`.

    Attributes:
        max_requests: read at most this many requests (default: all).
        tokens_per_id: tokens each hash id stands for (default: the format's own).
        vocab_size: token ids are drawn from ``[1, vocab_size)`` (default 32000).
        seed: selects the token content (default 0).
        output: ``False`` empties every output (default ``True``).
        session_order: kv-cache-tester conversations ``"interleaved"`` by time (the
            default) or ``"sequential"``.
    """

    max_requests: int | None
    tokens_per_id: int | None
    vocab_size: int
    seed: int
    output: bool
    session_order: str


def _open(
    path: StrPath,
    trace_format: TraceFormat | None,
    *,
    max_requests: int | None = None,
    tokens_per_id: int | None = None,
    vocab_size: int = 32000,
    seed: int = 0,
    output: bool = True,
    session_order: str = "interleaved",
) -> TraceSource:
    # The one place that reads LoadOptions, defaults included.
    settings = ReadSettings(
        tokens_per_id=tokens_per_id,
        vocab_size=vocab_size,
        seed=seed,
        output=output,
        session_order=session_order,
    )
    return open_trace(path, trace_format, max_requests=max_requests, settings=settings)


def iter_trace(path: StrPath, *, max_requests: int | None = None) -> Iterator[TraceRequest]:
    """Yield the requests of a prefixkv JSONL trace lazily (no duplicate-id check)."""
    return iter(open_trace(path, "prefixkv", max_requests=max_requests))


def read_trace(path: StrPath, *, max_requests: int | None = None) -> list[TraceRequest]:
    """Read a small prefixkv trace into a list, rejecting duplicate ids.

    Raises:
        TraceFormatError: a malformed line or a repeated id (both lines named).
    """
    return load_any(path, max_requests=max_requests, trace_format="prefixkv")


def iter_mooncake(path: StrPath, **options: Unpack[LoadOptions]) -> Iterator[TraceRequest]:
    """Yield a Mooncake hash-id trace as token requests (options: :class:`LoadOptions`)."""
    return iter(_open(path, "mooncake", **options))


def load_mooncake(path: StrPath, **options: Unpack[LoadOptions]) -> list[TraceRequest]:
    """A small Mooncake trace as a list; see :func:`iter_mooncake`."""
    return list(iter_mooncake(path, **options))


def load_any(
    path: StrPath, *, trace_format: TraceFormat | None = None, **options: Unpack[LoadOptions]
) -> list[TraceRequest]:
    """A small trace of any format as a list, validated by a scan first.

    Holds every request's tokens: for long traces iterate :func:`open_trace` instead.
    Options: :class:`LoadOptions`.

    Raises:
        TraceFormatError: as :meth:`TraceSource.scan`.
        TraceOptionError: a bad option, or ``tokens_per_id`` for a token trace.
    """
    source = _open(path, trace_format, **options)
    if options.get("max_requests") == 0:
        return []
    source.scan()
    return list(source)
