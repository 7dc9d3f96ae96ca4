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
    ReadOptions,
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
    "ReadOptions",
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
    "mooncake_lengths",
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
        scale_block: the old name of ``tokens_per_id`` (give one of the two).
        tokens_per_id: tokens each hash id stands for (default: the format's own).
        vocab_size: token ids are drawn from ``[1, vocab_size)`` (default 32000).
        seed: selects the token content (default 0).
        output: ``False`` empties every output (default ``True``).
        session_order: kv-cache-tester conversations ``"interleaved"`` by time (the
            default) or ``"sequential"``.
    """

    max_requests: int | None
    scale_block: int | None
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
    scale_block: int | None = None,
    tokens_per_id: int | None = None,
    vocab_size: int = 32000,
    seed: int = 0,
    output: bool = True,
    session_order: str = "interleaved",
) -> TraceSource:
    # The one place that reads LoadOptions, defaults included.
    if scale_block is not None and tokens_per_id is not None:
        raise TraceOptionError("give tokens_per_id or its old name scale_block, not both")
    options = ReadOptions(
        tokens_per_id=tokens_per_id if scale_block is None else scale_block,
        vocab_size=vocab_size,
        seed=seed,
        output=output,
        session_order=session_order,
    )
    return open_trace(path, trace_format, max_requests=max_requests, options=options)


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


def mooncake_lengths(input_length: int, num_blocks: int, scale_block: int | None) -> list[int]:
    """Token count of each block of a Mooncake request, after optional scaling.

    Unscaled: ``num_blocks - 1`` blocks of 512 and a last one of
    ``input_length - 512 * (num_blocks - 1)`` tokens; with ``scale_block = s`` every
    full block is ``s`` tokens and the last ``ceil(partial * s / 512)``.
    """
    partial = input_length - MOONCAKE_BLOCK_SIZE * (num_blocks - 1)
    if scale_block is None:
        return [MOONCAKE_BLOCK_SIZE] * (num_blocks - 1) + [partial]
    last = -(-partial * scale_block // MOONCAKE_BLOCK_SIZE)
    return [scale_block] * (num_blocks - 1) + [last]
