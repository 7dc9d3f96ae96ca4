"""Request traces on disk, read as streams: prefixkv JSONL and the public hash-id traces.

Formats: prefixkv's token JSONL (plain or gzip), Mooncake FAST'25 (512 tokens per
hash id), Qwen-Bailian (16 tokens per id, ``chat_id`` chains) and kv-cache-tester's
Claude Code conversations (64 tokens per id, sub-agents; a folder, a ``.json`` or a
``.tar.xz``). :func:`open_trace` returns a re-readable :class:`TraceSource`;
:func:`load_any` reads a small trace into a list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from prefixkv.adapters.outputs import OutputError, atomic_writer, refuse_overwrite

from .base import (
    ReadSettings,
    TraceFormatError,
    TraceLimits,
    TraceOptionError,
    TraceRequest,
    make_request,
)
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
    "FORMATS",
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
    "detect_format",
    "load_any",
    "make_request",
    "open_trace",
    "refuse_overwrite",
    "stats_of",
    "write_trace",
]


class LoadOptions(TypedDict, total=False):
    """The keyword options of :func:`load_any`.

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
