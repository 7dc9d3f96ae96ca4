"""A trace on disk as a re-readable stream of requests, with a cheap sizes-only scan."""

from __future__ import annotations

import heapq
import itertools
import os
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Literal, NamedTuple, get_args

import msgspec
import numpy as np
import xxhash

from prefixkv.adapters.inputs import StrPath

from .base import ReadSettings, TraceFormatError, TraceOptionError, TraceRequest
from .hashid import BAILIAN, MOONCAKE, HashIdFormat, iter_hashid, rows_hashid
from .kvcache_tester import (
    KVCT_BLOCK_SIZE,
    conversation_files,
    is_archive,
    iter_kvcache_tester,
    rows_kvcache_tester,
)
from .prefixkv import RequestSize, iter_prefixkv, rows_prefixkv
from .reading import Progress, decode, iter_lines

TraceFormat = Literal["prefixkv", "mooncake", "bailian", "kv-cache-tester"]
FORMATS: tuple[TraceFormat, ...] = get_args(TraceFormat)

_LARGEST = 256  # the largest requests a scan remembers (the tight capacity's K)
_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])


class _Reader(NamedTuple):
    description: str
    native_tokens_per_id: int | None
    requests: Callable[[StrPath, ReadSettings], Iterator[TraceRequest]]
    rows: Callable[[StrPath, ReadSettings, Progress | None], Iterator[tuple[RequestSize, object]]]


def _hashid(description: str, fmt: HashIdFormat) -> _Reader:
    return _Reader(
        description, fmt.block_size, partial(iter_hashid, fmt), partial(rows_hashid, fmt)
    )


_READERS: dict[TraceFormat, _Reader] = {
    "prefixkv": _Reader("prefixkv token trace", None, iter_prefixkv, rows_prefixkv),
    "mooncake": _hashid("Mooncake hash-id trace", MOONCAKE),
    "bailian": _hashid("Qwen-Bailian hash-id trace", BAILIAN),
    "kv-cache-tester": _Reader(
        "kv-cache-tester agentic trace", KVCT_BLOCK_SIZE, iter_kvcache_tester, rows_kvcache_tester
    ),
}


@dataclass(slots=True)
class TraceStats:
    """What a scan learns of a trace: counts, token totals, and the prompt + output
    tokens of the 256 largest requests (largest first once finished)."""

    num_requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    largest: list[int] = field(default_factory=list)

    def add(self, prompt_tokens: int, output_tokens: int) -> None:
        """Count one request."""
        self.num_requests += 1
        self.prompt_tokens += prompt_tokens
        self.output_tokens += output_tokens
        size = prompt_tokens + output_tokens
        if len(self.largest) < _LARGEST:
            heapq.heappush(self.largest, size)
        elif size > self.largest[0]:
            heapq.heapreplace(self.largest, size)

    def finish(self) -> TraceStats:
        """Sort ``largest`` largest first (after the last ``add``)."""
        self.largest.sort(reverse=True)
        return self


def stats_of(requests: Iterable[TraceRequest]) -> TraceStats:
    """The stats of requests already in memory (a built-in workload)."""
    stats = TraceStats()
    for r in requests:
        stats.add(len(r.tokens), len(r.output))
    return stats.finish()


def detect_format(path: StrPath) -> TraceFormat:
    """The format of a trace from its shape and first record's keys: a folder, an archive,
    ``"requests"`` or a ``.json`` of many lines is kv-cache-tester's, ``"tokens"``
    prefixkv's, ``"hash_ids"`` Qwen-Bailian's with ``"chat_id"``, else Mooncake's.

    Raises:
        TraceFormatError: an empty file, or a first record of no known format.
    """
    p = Path(path)
    if p.is_dir() or is_archive(p):
        return "kv-cache-tester"
    for lineno, line in iter_lines(p, 64 * 2**20):
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        try:
            keys = decode(_KEYS, line, where)
        except TraceFormatError:
            if p.suffix == ".json":
                return "kv-cache-tester"
            raise
        if "requests" in keys:
            return "kv-cache-tester"
        if "tokens" in keys:
            return "prefixkv"
        if "hash_ids" in keys:
            return "bailian" if "chat_id" in keys else "mooncake"
        raise TraceFormatError(
            f'{where}: not a trace format prefixkv reads (prefixkv needs "tokens", Mooncake '
            f'and Qwen-Bailian "hash_ids", kv-cache-tester "requests"); keys {sorted(keys)}'
        )
    raise TraceFormatError(f"{p}: empty trace (no non-blank line)")


class TraceSource:
    """A trace file (or folder) read lazily, as often as needed: each iteration
    re-reads it and yields the first ``max_requests`` requests one at a time
    (``max_requests=None``: all; ``trace_format`` ``None``: :func:`detect_format`);
    ``settings`` holds the token content, outputs and size limits.

    Raises:
        TraceOptionError: a bad option, or ``tokens_per_id`` for a token trace.
        TraceFormatError: the format cannot be detected.
    """

    def __init__(
        self,
        path: StrPath,
        trace_format: TraceFormat | None = None,
        *,
        max_requests: int | None = None,
        settings: ReadSettings | None = None,
    ) -> None:
        if max_requests is not None and (type(max_requests) is not int or max_requests < 0):
            raise TraceOptionError(
                f"max_requests must be None or an int >= 0, got {max_requests!r}"
            )
        if trace_format is not None and trace_format not in FORMATS:
            raise TraceOptionError(
                f"unknown trace format {trace_format!r}; known: {', '.join(FORMATS)}"
            )
        self.path = path
        self.format: TraceFormat = detect_format(path) if trace_format is None else trace_format
        self.max_requests = max_requests
        self.settings = ReadSettings() if settings is None else settings
        self._reader = _READERS[self.format]
        if self.format == "prefixkv" and self.settings.tokens_per_id is not None:
            raise TraceOptionError(
                f"tokens_per_id={self.settings.tokens_per_id!r} applies to hash-id traces only; "
                f"{path} is a prefixkv token trace"
            )

    @property
    def tokens_per_id(self) -> int | None:
        """Tokens each hash id expands to here (``None`` for token traces)."""
        native = self._reader.native_tokens_per_id
        return None if native is None else self.settings.tokens_per_id or native

    def __iter__(self) -> Iterator[TraceRequest]:
        return itertools.islice(self._reader.requests(self.path, self.settings), self.max_requests)

    def sizes(self, progress: Progress | None = None) -> Iterator[RequestSize]:
        """Each request's id and sizes, validated, without building tokens."""
        rows = self._reader.rows(self.path, self.settings, progress)
        return itertools.islice((size for size, _ in rows), self.max_requests)

    def input_bytes(self) -> int | None:
        """Bytes a scan reads (for a progress bar); ``None`` when unknown (archives)."""
        p = Path(self.path)
        if p.is_dir():
            return sum(f.stat().st_size for f in conversation_files(p))
        return None if is_archive(p) else os.path.getsize(p)

    def scan(self, progress: Progress | None = None) -> TraceStats:
        """Read the whole trace once, checking every request (ids by a 64-bit hash, a
        second pass locating a duplicate); return its sizes.

        Raises:
            TraceFormatError: the first malformed request (file and line), a duplicate
                id (both places), or a trace with no request.
        """
        stats = TraceStats()
        digests: array[int] = array("Q")
        for size in self.sizes(progress):
            stats.add(size.prompt_tokens, size.output_tokens)
            digests.append(xxhash.xxh3_64_intdigest(size.id.encode()))
        if not stats.num_requests:
            raise TraceFormatError(f"{self.path}: the trace holds no request")
        ordered = np.sort(np.frombuffer(digests, dtype=np.uint64))
        repeats = ordered[1:][ordered[1:] == ordered[:-1]]
        if len(repeats):
            self._locate_duplicate({int(x) for x in repeats[:64]})
        return stats.finish()

    def _locate_duplicate(self, wanted: set[int]) -> None:
        first: dict[str, str] = {}
        for size in self.sizes():
            if xxhash.xxh3_64_intdigest(size.id.encode()) not in wanted:
                continue
            if size.id in first:
                raise TraceFormatError(
                    f"{size.where}: duplicate id {size.id!r} (first at {first[size.id]})"
                )
            first[size.id] = size.where

    def describe(self) -> str:
        """``"Mooncake hash-id trace, 512 tokens per id"``."""
        text = self._reader.description
        if self.format == "kv-cache-tester":
            text += f", conversations {self.settings.session_order}"
        per_id = self.tokens_per_id
        if per_id is None:
            return text
        native = self._reader.native_tokens_per_id
        if per_id == native:
            return f"{text}, {per_id} tokens per id"
        return f"{text}, {per_id} tokens per id (published: {native})"

    def order_note(self) -> str | None:
        """For kv-cache-tester traces: in which order the conversations replay."""
        if self.format != "kv-cache-tester":
            return None
        if self.settings.session_order == "sequential":
            return (
                "kv-cache-tester conversations replay one after another (--session-order "
                "sequential): each finds its own blocks still cached, the easy case for any "
                "cache; concurrent agents interleave (the default)."
            )
        return (
            "kv-cache-tester conversations are interleaved by their time from each "
            "conversation's start, all starting together, as concurrent agents run "
            "(--session-order sequential replays them one after another, the easy case for "
            "any cache)."
        )

    def granularity_note(self) -> str | None:
        """For hash-id traces: why a token-granular index cannot gain from sub-block sharing."""
        per_id = self.tokens_per_id
        if per_id is None:
            return None
        return (
            f"{self._reader.description}: the trace only says which {per_id}-token blocks "
            "requests share, so prompts here share whole blocks and nothing in between by "
            "construction. A radix tree at page size 1 therefore cannot show any sub-block "
            "gain over block-granular caching on this trace; where their hits differ, it is "
            "from partial last blocks, block sizes that do not divide the id's block, and "
            "eviction, not from finer sharing."
        )

    def __repr__(self) -> str:
        return f"TraceSource({str(self.path)!r}, {self.format!r})"


open_trace = TraceSource
"""Open a trace for streaming: ``open_trace(path, trace_format, *, max_requests, settings)``."""
