"""Encode and decode KV-event batches: vLLM 0.33's wire format, older vLLM, SGLang 0.5.23.

Encoding is msgspec over the structs of :mod:`.wire` (vLLM) or :mod:`.sglang_wire`
(SGLang), which gives each engine's bytes exactly. :class:`EventDecoder` reads
whatever a router may meet and returns vLLM structs:

* vLLM 0.33: events as tagged maps (one typed msgspec pass, the fast path);
* older vLLM: events as tagged arrays ``[tag, field, ...]`` in declaration order
  (``KVCacheEvent(array_like=True)``), down to the first layout without ``medium``;
* SGLang 0.5.23: ``[ts, events, attn_dp_rank]`` (the rank becomes
  ``data_parallel_rank``), signed hashes, ``cache_salt`` as block 0's extra key of a
  chain from the root (where vLLM puts a salt; its hashes are already namespaced by
  it), ``medium``/``lora_name`` possibly absent;
* fields nobody declared are ignored and unknown event types skipped (counted).

The decoder is the boundary for bytes from the network: whatever a payload holds, it
either returns a batch or raises :class:`EventDecodeError`. It refuses payloads over
``max_payload_bytes`` before reading them, nesting deeper than the interpreter's
recursion limit (msgspec's own bound, 1000 by default), an event whose ``"type"`` is
missing or not a string, a ``ts`` that is not a finite number and a rank that is not
a non-negative int.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
from msgspec.structs import astuple

from prefixkv.indexes.errors import PrefixKVError

from .sglang_wire import SGLangBlockRemoved, SGLangBlockStored, SGLangEventBatch
from .wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEventBatch

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "EventDecodeError",
    "EventDecoder",
    "as_engine_events",
    "encode",
    "encode_json",
    "from_sglang",
    "to_vllm_event",
]

T = TypeVar("T")
KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


DEFAULT_MAX_PAYLOAD_BYTES = 64 << 20
"""The largest payload :class:`EventDecoder` reads by default (64 MiB): far above one
engine step's events (a few MB for a million stored tokens), far below what would
hurt a router."""


class EventDecodeError(PrefixKVError):
    """A payload is not a KV-event batch in any known layout, or is beyond the
    decoder's bounds (size, nesting depth)."""


def encode(batch: EventBatch | SGLangEventBatch) -> bytes:
    """The msgpack payload of a batch, as the engine's ``ZmqEventPublisher`` sends it."""
    return msgspec.msgpack.encode(batch)


def encode_json(batch: EventBatch | SGLangEventBatch) -> bytes:
    """The batch through msgspec's JSON encoder: one line of a KV-event file."""
    return msgspec.json.encode(batch)


def as_engine_events(events: Sequence[Any], event_type: Any) -> list[Any]:
    """``events`` as an engine's own event classes, whose fields prefixkv's structs
    repeat one for one: a msgpack round trip, so a consumer sees what it expects.

    Args:
        events: prefixkv's events (vLLM's or SGLang's structs).
        event_type: the union of the engine's event classes.
    """
    out: list[Any] = msgspec.msgpack.decode(msgspec.msgpack.encode(events), type=list[event_type])
    return out


# Lenient shapes of vLLM's own events: everything after block_hashes may be missing
# (older vLLM, SGLang). Older vLLM declared the events array_like: positional
# fields, tag first, down to the first layout without ``medium``.


def _lenient(
    event: type[msgspec.Struct],
    array_like: bool,
    num_fields: int | None = None,
    extra: tuple[tuple[str, Any, Any], ...] = (),
) -> Any:
    """``event``'s first ``num_fields`` fields, every one after ``block_hashes`` optional
    (an empty ``token_ids``, a ``block_size`` of 0, else None), then the ``extra``
    fields, as a struct tagged like ``event``: a map, or a positional array."""
    defaults = {"token_ids": msgspec.field(default_factory=list), "block_size": 0}
    fields: list[Any] = []
    for f in msgspec.structs.fields(event)[:num_fields]:
        if f.name == "block_hashes":
            fields.append((f.name, f.type))
        else:
            fields.append((f.name, f.type, defaults.get(f.name)))
    fields += extra
    name = ("_Array" if array_like else "_Map") + event.__name__
    return msgspec.defstruct(
        name, fields, tag=event.__name__, array_like=array_like, gc=False, module=__name__
    )


def _lenient_batch(name: str, stored: Any, removed: Any, cleared: Any) -> Any:
    return msgspec.defstruct(
        name,
        [("ts", float), ("events", list[stored | removed | cleared]), ("rank", int | None, None)],
        array_like=True,
        gc=False,
        module=__name__,
    )


# SGLang's BlockStored is a map with a cache_salt: kept (see _salted)
_MapStored = _lenient(BlockStored, array_like=False, extra=(("cache_salt", str | None, None),))
_MapRemoved = _lenient(BlockRemoved, array_like=False)
_MapCleared = _lenient(AllBlocksCleared, array_like=False)
_MapBatch = _lenient_batch("_MapBatch", _MapStored, _MapRemoved, _MapCleared)
_ArrayStored = _lenient(BlockStored, array_like=True, num_fields=11)  # to the sliding window
_ArrayRemoved = _lenient(BlockRemoved, array_like=True, num_fields=3)  # to group_idx
_ArrayCleared = _lenient(AllBlocksCleared, array_like=True)
_ArrayBatch = _lenient_batch("_ArrayBatch", _ArrayStored, _ArrayRemoved, _ArrayCleared)

_MapEvent = _MapStored | _MapRemoved | _MapCleared
_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared
_ARRAY_FIELDS = {
    "BlockStored": len(_ArrayStored.__struct_fields__),
    "BlockRemoved": len(_ArrayRemoved.__struct_fields__),
    "AllBlocksCleared": 0,
}


def _salted(e: Any) -> list[tuple[Any, ...] | None] | None:
    """SGLang's ``cache_salt`` as block 0's extra key, where vLLM publishes a salt, so a
    consumer keyed by content (a radix index) tells salted chains apart; a chain after
    a parent inherits the parent's namespace."""
    if e.cache_salt and e.parent_block_hash is None and e.block_hashes:
        return [(e.cache_salt,)] + [None] * (len(e.block_hashes) - 1)
    return None


def _sglang_stored(e: Any) -> BlockStored:
    # SGLang's own field order; its cache_salt as block 0's extra key.
    extra_keys = _salted(e)
    return BlockStored(
        e.block_hashes,
        e.parent_block_hash,
        e.token_ids,
        e.block_size,
        e.lora_id,
        e.medium,
        e.lora_name,
        extra_keys=extra_keys,
        session_id=e.session_id,
    )


def to_vllm_event(e: object) -> KVEvent:
    """One decoded event of any known layout (vLLM, older vLLM, SGLang) as a vLLM struct.

    Fields the layout lacks read as ``None``; SGLang's ``cache_salt`` becomes block 0's
    extra key of a chain from the root.
    """
    if isinstance(e, SGLangBlockStored):
        return _sglang_stored(e)
    # A lenient shape's fields, and SGLang's BlockRemoved's, are a prefix of vLLM's.
    if isinstance(e, _MapStored):
        stored = BlockStored(*astuple(e)[:-1])  # all but cache_salt
        if stored.extra_keys is None:
            stored.extra_keys = _salted(e)
        return stored
    if isinstance(e, _ArrayStored):
        return BlockStored(*astuple(e))
    if isinstance(e, (_MapRemoved, _ArrayRemoved, SGLangBlockRemoved)):
        return BlockRemoved(*astuple(e))
    return AllBlocksCleared()


def from_sglang(batch: SGLangEventBatch) -> KVEventBatch:
    """An SGLang batch as vLLM structs (``attn_dp_rank`` -> ``data_parallel_rank``).

    ``cache_salt`` becomes block 0's extra key of a chain from the root (SGLang's
    hashes are already namespaced by it; a content-keyed consumer needs it).
    """
    events = [to_vllm_event(e) for e in batch.events]
    return KVEventBatch(ts=batch.ts, events=events, data_parallel_rank=batch.attn_dp_rank)


def _strict(decoder: msgspec.msgpack.Decoder[T], payload: bytes, what: str) -> T:
    """``decoder.decode(payload)``; a payload it refuses raises ``EventDecodeError(what)``."""
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise EventDecodeError(f"{what}: {e}") from None
    except RecursionError:
        # msgspec bounds nesting by the interpreter's recursion limit, and says so this way
        raise EventDecodeError(f"{what}: nested deeper than msgspec decodes") from None


def _short_repr() -> reprlib.Repr:
    r = reprlib.Repr()  # keyword arguments only from Python 3.12
    r.maxlevel, r.maxlist, r.maxdict, r.maxstring, r.maxother = 3, 6, 6, 40, 40
    return r


_SHOW = _short_repr()


def _show(value: object) -> str:
    """A short repr of a peer's value for a message: bounded in depth and length, so a
    hostile payload can neither recurse nor bloat it."""
    return _SHOW.repr(value)


def _checked(batch: KVEventBatch) -> KVEventBatch:
    """``batch`` if its ``ts`` is a finite number and its rank a non-negative int or None.
    O(1)."""
    ts, rank = batch.ts, batch.data_parallel_rank
    if type(ts) not in (float, int) or not math.isfinite(ts):
        raise EventDecodeError(f"a batch's ts must be a finite number, got {_show(ts)}")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise EventDecodeError(
            f"data-parallel rank must be a non-negative int or nil, got {_show(rank)}"
        )
    return batch


class EventDecoder:
    """Decodes KV-event payloads of any known layout into vLLM 0.33 structs.

    Keep one per subscriber: it holds msgspec's compiled decoders and counts the
    unknown events it skipped. Every payload it cannot read, whatever its bytes, raises
    :class:`EventDecodeError` (see the module docstring for the bounds).

    Args:
        max_payload_bytes: larger payloads are refused before they are read.

    Attributes:
        num_skipped_events: events of unknown types dropped so far.

    Raises:
        PrefixKVError: ``max_payload_bytes`` is not a positive int.
    """

    __slots__ = (
        "_array",
        "_generic",
        "_map",
        "_sglang",
        "_vllm",
        "max_payload_bytes",
        "num_skipped_events",
    )

    def __init__(self, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
        if type(max_payload_bytes) is not int or max_payload_bytes < 1:
            raise PrefixKVError(
                f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}"
            )
        self.max_payload_bytes = max_payload_bytes
        self._vllm = msgspec.msgpack.Decoder(KVEventBatch)
        self._map = msgspec.msgpack.Decoder(_MapBatch)
        self._array = msgspec.msgpack.Decoder(_ArrayBatch)
        self._sglang = msgspec.msgpack.Decoder(SGLangEventBatch)
        self._generic = msgspec.msgpack.Decoder()
        self.num_skipped_events = 0

    def decode(self, payload: bytes) -> KVEventBatch:
        """Decode one batch payload (vLLM 0.33, older vLLM or SGLang 0.5.23).

        Raises:
            EventDecodeError: the payload is not a batch in any known layout, or is
                beyond the decoder's bounds.

        Complexity: one typed msgspec pass for vLLM 0.33 and for every-event-known
        payloads of the other layouts; a generic pass plus one conversion per event
        otherwise.
        """
        self._check_size(payload)
        try:
            return _checked(self._vllm.decode(payload))
        except (msgspec.DecodeError, RecursionError):
            pass
        for decoder in (self._map, self._array):
            try:
                lenient = decoder.decode(payload)
            except (msgspec.DecodeError, RecursionError):
                continue
            events = [to_vllm_event(e) for e in lenient.events]
            batch = KVEventBatch(ts=lenient.ts, events=events, data_parallel_rank=lenient.rank)
            return _checked(batch)
        return _checked(self._decode_generic(payload))

    def decode_vllm(self, payload: bytes) -> KVEventBatch:
        """Decode a vLLM 0.33 batch strictly, into vLLM's own structs.

        Raises:
            EventDecodeError: the payload is not a vLLM 0.33 batch.
        """
        self._check_size(payload)
        return _checked(_strict(self._vllm, payload, "not a vLLM 0.33 KV-event batch"))

    def decode_sglang(self, payload: bytes) -> SGLangEventBatch:
        """Decode an SGLang 0.5.23 batch strictly, into SGLang's structs (re-encodes exactly).

        Raises:
            EventDecodeError: the payload is not an SGLang 0.5.23 batch.
        """
        self._check_size(payload)
        batch = _strict(self._sglang, payload, "not an SGLang 0.5.23 KV-event batch")
        _checked(KVEventBatch(batch.ts, [], batch.attn_dp_rank))
        return batch

    def _check_size(self, payload: object) -> None:
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise EventDecodeError(
                f"a KV-event payload must be bytes, got {type(payload).__name__}"
            )
        if len(payload) > self.max_payload_bytes:
            raise EventDecodeError(
                f"KV-event payload of {len(payload)} bytes is over the decoder's "
                f"max_payload_bytes={self.max_payload_bytes}"
            )

    def _decode_generic(self, payload: bytes) -> KVEventBatch:
        raw = _strict(self._generic, payload, "KV-event payload is not msgpack")
        ok = (
            isinstance(raw, list)
            and 2 <= len(raw) <= 3
            and type(raw[0]) in (int, float)
            and isinstance(raw[1], list)
        )
        if not ok:
            raise EventDecodeError(f"not a KV-event batch [ts, events, rank]: {_show(raw)}")
        events = []
        for item in raw[1]:
            event = self._convert(item)
            if event is None:
                self.num_skipped_events += 1
            else:
                events.append(event)
        rank = raw[2] if len(raw) == 3 else None
        return KVEventBatch(ts=float(raw[0]), events=events, data_parallel_rank=rank)

    @staticmethod
    def _convert(item: object) -> KVEvent | None:
        """One generic event; ``None`` for an unknown type (a string no layout knows)."""
        try:
            if isinstance(item, dict):
                tag = item.get("type")
                if type(tag) is not str:
                    raise EventDecodeError(f"a KV event's type must be a string, got {_show(tag)}")
                if tag not in _ARRAY_FIELDS:
                    return None
                return to_vllm_event(msgspec.convert(item, _MapEvent))
            if isinstance(item, list) and item:
                if type(item[0]) is not str:
                    raise EventDecodeError(
                        f"a KV event's tag must be a string, got {_show(item[0])}"
                    )
                known = _ARRAY_FIELDS.get(item[0])
                if known is None:
                    return None
                # fields a newer layout appended are dropped
                return to_vllm_event(msgspec.convert(item[: known + 1], _ArrayEvent))
        except msgspec.ValidationError as e:
            raise EventDecodeError(f"malformed KV event {_show(item)}: {e}") from None
        raise EventDecodeError(f"a KV event must be a tagged map or array, got {_show(item)}")
