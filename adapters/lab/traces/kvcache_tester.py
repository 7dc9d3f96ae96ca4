"""kv-cache-tester's agentic coding traces (Claude Code conversations with sub-agents).

One JSON document per conversation (``{"id", "block_size", "hash_id_scope", "requests"}``),
read from a folder of ``.json`` files, one ``.json``, or a ``.tar.xz`` (``.tar.gz``,
``.tar``) of them. A request has one hash id per *full* block of its input; an entry
with ``agent_id`` and ``requests`` of its own is a sub-agent, timed from its start.
Conversations are interleaved by time from their start (concurrent agents) or replayed
one after another (``session_order``); local ids are namespaced by conversation.
"""

from __future__ import annotations

import heapq
import itertools
import lzma
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Annotated, Any, NamedTuple, cast

import msgspec

from prefixkv.adapters.inputs import StrPath, open_input, read_input
from prefixkv.indexes.validation import ceil_div

from ..messages import one_line
from .base import ReadSettings, TraceFormatError, TraceRequest
from .blocks import BlockTokens, TokenDeriver
from .prefixkv import RequestSize
from .reading import Progress, count_items, decode, open_stream

KVCT_BLOCK_SIZE = 64
"""Tokens per hash id in the published traces (each document states its own)."""

EXPANSION_FLOOR_BYTES = 32 * 2**20
"""Bytes any member of a compressed archive may decompress to, whatever its ratio."""
MAX_EXPANSION = 100
"""Past the floor, the most bytes a member may decompress to per compressed byte read:
a compression bomb stops early, a genuine larger conversation is read extracted."""

_ARCHIVE_SUFFIXES = (".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar")
_IDS = msgspec.json.Decoder(list[int])


class _Request(msgspec.Struct):
    t: float = 0.0
    type: str = "n"
    in_: Annotated[int, msgspec.Meta(ge=0)] | None = msgspec.field(default=None, name="in")
    out: Annotated[int, msgspec.Meta(ge=0)] | None = None
    hash_ids: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    requests: list[_Request] | None = None
    agent_id: str | None = None
    think_time: Annotated[float, msgspec.Meta(ge=0)] | None = None
    api_time: Annotated[float, msgspec.Meta(ge=0)] | None = None


class _Conversation(msgspec.Struct):
    requests: list[_Request]
    id: str | int | None = None
    block_size: Annotated[int, msgspec.Meta(ge=1)] = KVCT_BLOCK_SIZE
    hash_id_scope: str = "local"


class _Item(NamedTuple):
    """A request at its time, with its conversation's id scope, block size and tokens per id."""

    arrival: float
    session: str
    where: str
    request: _Request
    scope: str
    block: int
    tokens_per_id: int


def is_archive(path: StrPath) -> bool:
    """Whether the name is a tar archive this reader opens."""
    return str(path).lower().endswith(_ARCHIVE_SUFFIXES)


def conversation_files(path: StrPath) -> list[Path]:
    """The ``.json`` files of a folder in name order (one conversation each)."""
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.suffix == ".json" and f.is_file())
    if not files:
        raise TraceFormatError(f"{p}: no .json conversation file in the folder")
    return files


def _documents(
    path: StrPath, max_bytes: int, progress: Progress | None = None
) -> Iterator[tuple[str, str, bytes | bytearray]]:
    """``(where, default conversation id, bytes)`` per document, one at a time."""
    p = Path(path)
    if p.is_dir() or not is_archive(p):
        for f in conversation_files(p) if p.is_dir() else [p]:
            data = read_input(f, max_bytes, what="document", error=TraceFormatError)
            yield str(f), f.stem, data
            if progress is not None:
                progress(len(data))
    else:
        yield from _archive(p, max_bytes)


def _archive(path: Path, max_bytes: int) -> Iterator[tuple[str, str, bytearray]]:
    """The ``.json`` members of a tar archive (plain, gzip or xz by its magic bytes),
    one at a time, each within the document limit and the decompression budget."""
    found = False
    with open_input(path, what="trace", error=TraceFormatError) as raw:
        stream, kind = open_stream(raw, path)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in iter(tar.next, None):
                    cast(Any, tar).members.clear()  # read once: keep no index of the stream
                    name = member.name
                    if not member.isfile() or not name.endswith(".json"):
                        continue
                    where = f"{path}:{name}"
                    if member.size > max_bytes:
                        raise TraceFormatError(
                            f"{where}: {member.size:,} bytes exceed the document limit of "
                            f"{max_bytes:,}"
                        )
                    f = tar.extractfile(member)
                    if f is None:  # pragma: no cover - isfile() members always have data
                        continue
                    found = True
                    compressed = raw if kind != "plain" else None
                    yield where, Path(name).stem, _read_member(f, compressed, where, max_bytes)
        except (tarfile.TarError, lzma.LZMAError, zlib.error, EOFError) as exc:
            raise TraceFormatError(
                f"{path}: corrupt or truncated archive ({type(exc).__name__}: {one_line(str(exc))})"
            ) from None
        except OSError as exc:  # gzip.BadGzipFile, or a read that fails
            raise TraceFormatError(
                f"{path}: cannot read the archive: {exc.strerror or one_line(str(exc))}"
            ) from None
    if not found:
        raise TraceFormatError(f"{path}: no .json conversation file in the archive")


def _read_member(
    f: IO[bytes], compressed: IO[bytes] | None, where: str, max_bytes: int
) -> bytearray:
    """A member's bytes, at most ``max_bytes`` and (from ``compressed``, the archive's
    file) the expansion budget of the compressed bytes read meanwhile."""
    start = compressed.tell() if compressed is not None else 0
    data = bytearray()
    while chunk := f.read(2**20):
        data += chunk
        if len(data) > max_bytes:
            raise TraceFormatError(f"{where}: more than the document limit of {max_bytes:,} bytes")
        if compressed is None:
            continue
        read = compressed.tell() - start
        if len(data) > EXPANSION_FLOOR_BYTES + MAX_EXPANSION * read:
            raise TraceFormatError(
                f"{where}: decompresses past {EXPANSION_FLOOR_BYTES:,} bytes and "
                f"{MAX_EXPANSION:,} times the compressed bytes read for it (a compression "
                "bomb?); if the trace is genuine, extract the archive and read the folder"
            )
    return data


def _flatten(
    conv: _Conversation, conv_id: str, where: str, scope: str, tokens_per_id: int
) -> list[_Item]:
    items: list[_Item] = []

    def walk(requests: list[_Request], base: float, session: str, path: str) -> None:
        for k, r in enumerate(requests):
            here = f"{path}[{k}]"
            if r.requests is not None or r.agent_id is not None:  # a sub-agent
                agent = r.agent_id or f"agent{k}"
                walk(r.requests or [], base + r.t, f"{session}/{agent}", f"{here}.requests")
            else:
                item = _Item(
                    base + r.t,
                    session,
                    f"{where}: {here}",
                    r,
                    scope=scope,
                    block=conv.block_size,
                    tokens_per_id=tokens_per_id,
                )
                items.append(item)

    walk(conv.requests, 0.0, conv_id, "$.requests")
    items.sort(key=lambda item: item.arrival)  # stable: ties keep the file's order
    return items


def _in_order(path: StrPath, opts: ReadSettings, progress: Progress | None) -> Iterator[_Item]:
    """Every request in replay order: conversation by conversation, or all starting
    together, merged by time (ties keep the conversations' order)."""
    decoder = msgspec.json.Decoder(_Conversation)

    def conversations() -> Iterator[list[_Item]]:
        for where, stem, data in _documents(path, opts.limits.max_document_bytes, progress):
            conv = decode(decoder, data, where)
            conv_id = stem if conv.id is None else str(conv.id)
            scope = conv.hash_id_scope
            if scope not in ("local", "global"):
                raise TraceFormatError(
                    f'{where}: "hash_id_scope" must be "local" or "global", got {scope!r}'
                )
            per_id = conv.block_size if opts.tokens_per_id is None else opts.tokens_per_id
            yield _flatten(conv, conv_id, where, "" if scope == "global" else conv_id, per_id)

    if opts.session_order == "sequential":
        return itertools.chain.from_iterable(conversations())
    return heapq.merge(*conversations(), key=lambda item: item.arrival)


def rows_kvcache_tester(
    path: StrPath, opts: ReadSettings, progress: Progress | None = None
) -> Iterator[tuple[RequestSize, tuple[_Item, TraceRequest, list[int], int]]]:
    """Per request, checked against the schema and the limits: its sizes, and its item,
    the request without tokens, its hash ids and its tail tokens."""
    limits = opts.limits
    previous: dict[str, tuple[_Item, str, int]] = {}  # a session's last request, id, turn
    for item in _in_order(path, opts, progress):
        block, s = item.block, item.tokens_per_id
        r = item.request
        if r.in_ is None or r.out is None or not r.hash_ids:
            raise TraceFormatError(f'{item.where}: a request needs "in", "out" and "hash_ids"')
        if r.in_ == 0:
            raise TraceFormatError(f'{item.where}: "in" must be >= 1')
        full = r.in_ // block
        prompt = ceil_div(r.in_ * s, block)
        tail = prompt - s * full
        output = ceil_div(r.out * s, block) if opts.output else 0
        before = previous.get(item.session)
        turn = 1 if before is None else before[2] + 1
        rid = f"{item.session}/{turn}"
        limits.check(prompt, output, f"{item.where}: request {rid!r}")  # before the ids
        n = count_items(r.hash_ids)
        hash_ids: list[int] = []
        if n <= full:
            hash_ids = decode(_IDS, bytes(r.hash_ids), f"{item.where}.hash_ids")
            n = len(hash_ids)
        if n != full:
            raise TraceFormatError(
                f'{item.where}: {n} "hash_ids" but "in" {r.in_} needs {r.in_} // {block} = {full}'
            )
        think = r.think_time  # else the gap after the previous request's answer
        if think is None and before is not None and before[0].request.api_time is not None:
            think = max(0.0, item.arrival - before[0].arrival - before[0].request.api_time)
        previous[item.session] = (item, rid, turn)
        parent = None if before is None else before[1]
        request = TraceRequest(rid, (), (), item.arrival, item.session, parent, turn, think)
        yield RequestSize(rid, prompt, output, item.where), (item, request, hash_ids, tail)


def iter_kvcache_tester(path: StrPath, opts: ReadSettings) -> Iterator[TraceRequest]:
    """Yield the requests of kv-cache-tester traces, ids ``<conversation>[/<agent>]/<turn>``.

    Raises:
        TraceFormatError: a document not of the schema, a request without ``in``,
            ``out`` or the right number of ``hash_ids``, sizes past the limits, a
            corrupt archive; the message names the file and the JSON path.
    """
    seed = opts.seed
    deriver = TokenDeriver(opts.vocab_size)
    blocks: dict[int, BlockTokens] = {}
    for size, (item, request, hash_ids, tail) in rows_kvcache_tester(path, opts):
        s = item.tokens_per_id
        if s not in blocks:
            blocks[s] = BlockTokens(deriver, f"kvct-block:{seed}:", s, opts.block_cache_bytes)
        tokens = blocks[s].prompt(item.scope, hash_ids, size.prompt_tokens - tail)
        if tail:
            tokens += deriver.named(f"kvct-tail:{seed}:{request.id}", tail)
        out = deriver.named(f"kvct-output:{seed}:{request.id}", size.output_tokens)
        yield request._replace(tokens=tokens, output=out)
