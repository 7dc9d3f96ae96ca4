"""Encode and decode KV-event batches: vLLM 0.33's wire format, older vLLM, SGLang 0.5.23.

Encoding is msgspec over the structs of :mod:`.wire` (vLLM) or :mod:`.sglang_wire`
(SGLang), which gives each engine's bytes exactly. :class:`EventDecoder` reads
whatever a router may meet and returns vLLM structs:

* vLLM 0.33: events as tagged maps (one typed msgspec pass, the fast path);
* older vLLM: events as tagged arrays ``[tag, field, ...]`` in declaration order
  (``KVCacheEvent(array_like=True)``), down to the first layout without ``medium``;
* SGLang 0.5.23: ``[ts, events, attn_dp_rank]`` (the rank becomes
  ``data_parallel_rank``), signed hashes, ``cache_salt`` dropped (its hashes are
  already namespaced by it), ``medium``/``lora_name`` possibly absent;
* fields nobody declared are ignored and unknown event types skipped (counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec
from msgspec.structs import astuple

from prefixkv.indexes.errors import PrefixKVError

from .sglang_wire import SGLangBlockRemoved, SGLangBlockStored, SGLangEventBatch
from .wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEventBatch

__all__ = [
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


class EventDecodeError(PrefixKVError):
    """A payload is not a KV-event batch in any known layout."""


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


def _lenient(event: type[msgspec.Struct], array_like: bool, num_fields: int | None = None) -> Any:
    """``event``'s first ``num_fields`` fields, every one after ``block_hashes`` optional
    (an empty ``token_ids``, a ``block_size`` of 0, else None), as a struct tagged like
    ``event``: a map, or a positional array."""
    defaults = {"token_ids": msgspec.field(default_factory=list), "block_size": 0}
    fields: list[Any] = []
    for f in msgspec.structs.fields(event)[:num_fields]:
        if f.name == "block_hashes":
            fields.append((f.name, f.type))
        else:
            fields.append((f.name, f.type, defaults.get(f.name)))
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


_MapStored = _lenient(BlockStored, array_like=False)
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


def _sglang_stored(e: Any) -> BlockStored:
    # SGLang's own field order; its cache_salt is dropped.
    return BlockStored(
        e.block_hashes,
        e.parent_block_hash,
        e.token_ids,
        e.block_size,
        e.lora_id,
        e.medium,
        e.lora_name,
        session_id=e.session_id,
    )


def to_vllm_event(e: object) -> KVEvent:
    """One decoded event of any known layout (vLLM, older vLLM, SGLang) as a vLLM struct.

    Fields the layout lacks read as ``None``; SGLang's ``cache_salt`` is dropped.
    """
    if isinstance(e, SGLangBlockStored):
        return _sglang_stored(e)
    # A lenient shape's fields, and SGLang's BlockRemoved's, are a prefix of vLLM's.
    if isinstance(e, (_MapStored, _ArrayStored)):
        return BlockStored(*astuple(e))
    if isinstance(e, (_MapRemoved, _ArrayRemoved, SGLangBlockRemoved)):
        return BlockRemoved(*astuple(e))
    return AllBlocksCleared()


def from_sglang(batch: SGLangEventBatch) -> KVEventBatch:
    """An SGLang batch as vLLM structs (``attn_dp_rank`` -> ``data_parallel_rank``).

    ``cache_salt`` is dropped: SGLang's hashes are already namespaced by it.
    """
    events = [to_vllm_event(e) for e in batch.events]
    return KVEventBatch(ts=batch.ts, events=events, data_parallel_rank=batch.attn_dp_rank)


def _strict(decoder: msgspec.msgpack.Decoder[T], payload: bytes, what: str) -> T:
    """``decoder.decode(payload)``; a payload it refuses raises ``EventDecodeError(what)``."""
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise EventDecodeError(f"{what}: {e}") from None


class EventDecoder:
    """Decodes KV-event payloads of any known layout into vLLM 0.33 structs.

    Keep one per subscriber: it holds msgspec's compiled decoders and counts the
    unknown events it skipped.

    Attributes:
        num_skipped_events: events of unknown types dropped so far.
    """

    __slots__ = ("_array", "_generic", "_map", "_sglang", "_vllm", "num_skipped_events")

    def __init__(self) -> None:
        self._vllm = msgspec.msgpack.Decoder(KVEventBatch)
        self._map = msgspec.msgpack.Decoder(_MapBatch)
        self._array = msgspec.msgpack.Decoder(_ArrayBatch)
        self._sglang = msgspec.msgpack.Decoder(SGLangEventBatch)
        self._generic = msgspec.msgpack.Decoder()
        self.num_skipped_events = 0

    def decode(self, payload: bytes) -> KVEventBatch:
        """Decode one batch payload (vLLM 0.33, older vLLM or SGLang 0.5.23).

        Raises:
            EventDecodeError: the payload is not a batch in any known layout.

        Complexity: one typed msgspec pass for vLLM 0.33 and for every-event-known
        payloads of the other layouts; a generic pass plus one conversion per event
        otherwise.
        """
        try:
            return self._vllm.decode(payload)
        except msgspec.DecodeError:
            pass
        for decoder in (self._map, self._array):
            try:
                lenient = decoder.decode(payload)
            except msgspec.DecodeError:
                continue
            events = [to_vllm_event(e) for e in lenient.events]
            return KVEventBatch(ts=lenient.ts, events=events, data_parallel_rank=lenient.rank)
        return self._decode_generic(payload)

    def decode_vllm(self, payload: bytes) -> KVEventBatch:
        """Decode a vLLM 0.33 batch strictly, into vLLM's own structs.

        Raises:
            EventDecodeError: the payload is not a vLLM 0.33 batch.
        """
        return _strict(self._vllm, payload, "not a vLLM 0.33 KV-event batch")

    def decode_sglang(self, payload: bytes) -> SGLangEventBatch:
        """Decode an SGLang 0.5.23 batch strictly, into SGLang's structs (re-encodes exactly).

        Raises:
            EventDecodeError: the payload is not an SGLang 0.5.23 batch.
        """
        return _strict(self._sglang, payload, "not an SGLang 0.5.23 KV-event batch")

    def _decode_generic(self, payload: bytes) -> KVEventBatch:
        raw = _strict(self._generic, payload, "KV-event payload is not msgpack")
        ok = (
            isinstance(raw, list)
            and 2 <= len(raw) <= 3
            and isinstance(raw[0], (int, float))
            and isinstance(raw[1], list)
        )
        if not ok:
            raise EventDecodeError(f"not a KV-event batch [ts, events, rank]: {raw!r:.200}")
        events = []
        for item in raw[1]:
            event = self._convert(item)
            if event is None:
                self.num_skipped_events += 1
            else:
                events.append(event)
        rank = raw[2] if len(raw) == 3 else None
        if rank is not None and not isinstance(rank, int):
            raise EventDecodeError(f"data-parallel rank must be an int or nil, got {rank!r}")
        return KVEventBatch(ts=float(raw[0]), events=events, data_parallel_rank=rank)

    @staticmethod
    def _convert(item: object) -> KVEvent | None:
        """One generic event; ``None`` for an unknown type."""
        try:
            if isinstance(item, dict):
                if item.get("type") not in _ARRAY_FIELDS:
                    return None
                return to_vllm_event(msgspec.convert(item, _MapEvent))
            if isinstance(item, list) and item:
                known = _ARRAY_FIELDS.get(item[0]) if isinstance(item[0], str) else None
                if known is None:
                    return None
                # fields a newer layout appended are dropped
                return to_vllm_event(msgspec.convert(item[: known + 1], _ArrayEvent))
        except msgspec.ValidationError as e:
            raise EventDecodeError(f"malformed KV event {item!r:.200}: {e}") from None
        raise EventDecodeError(f"a KV event must be a tagged map or array, got {item!r:.200}")
