"""Request traces on disk, read as streams: prefixkv JSONL and the public hash-id traces.

Formats: prefixkv's token JSONL (plain or gzip), Mooncake FAST'25 (512 tokens per hash
id), Qwen-Bailian (16, ``chat_id`` chains) and kv-cache-tester's Claude Code
conversations (64, sub-agents). :func:`open_trace` returns a re-readable
:class:`TraceSource`; :func:`load_any` reads a small trace into a list.
"""

from __future__ import annotations

from prefixkv.adapters.inputs import StrPath

from .base import (
    ReadSettings,
    TraceFormatError,
    TraceLimits,
    TraceOptionError,
    TraceRequest,
    make_request,
)
from .prefixkv import write_trace
from .source import (
    FORMATS,
    TraceFormat,
    TraceSource,
    TraceStats,
    detect_format,
    open_trace,
    stats_of,
)

__all__ = [
    "FORMATS",
    "ReadSettings",
    "TraceFormat",
    "TraceFormatError",
    "TraceLimits",
    "TraceOptionError",
    "TraceRequest",
    "TraceSource",
    "TraceStats",
    "detect_format",
    "load_any",
    "make_request",
    "open_trace",
    "stats_of",
    "write_trace",
]


def load_any(
    path: StrPath,
    *,
    trace_format: TraceFormat | None = None,
    max_requests: int | None = None,
    tokens_per_id: int | None = None,
    vocab_size: int = 32000,
    seed: int = 0,
    output: bool = True,
    session_order: str = "interleaved",
) -> list[TraceRequest]:
    """A small trace of any format as a list, validated by a scan first (long traces:
    iterate :func:`open_trace`); the options are :class:`ReadSettings`' and
    :class:`TraceSource`'s, and it raises what they and :meth:`TraceSource.scan` raise."""
    settings = ReadSettings(tokens_per_id, vocab_size, seed, output, session_order=session_order)
    source = open_trace(path, trace_format, max_requests=max_requests, settings=settings)
    if max_requests == 0:
        return []
    source.scan()
    return list(source)
