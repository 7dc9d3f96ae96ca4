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

from typing import Any

import msgspec

from prefixkv.indexes.errors import PrefixKVError

from .sglang_wire import SGLangBlockRemoved, SGLangBlockStored, SGLangEventBatch
from .wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEventBatch

__all__ = [
    "EventDecodeError",
    "EventDecoder",
    "encode",
    "encode_json",
    "from_sglang",
    "to_vllm_event",
]

Hash = bytes | int
KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class EventDecodeError(PrefixKVError):
    """A payload is not a KV-event batch in any known layout."""


def encode(batch: EventBatch | SGLangEventBatch) -> bytes:
    """The msgpack payload of a batch, as the engine's ``ZmqEventPublisher`` sends it."""
    return msgspec.msgpack.encode(batch)


def encode_json(batch: EventBatch | SGLangEventBatch) -> bytes:
    """The batch through msgspec's JSON encoder: one line of a KV-event file."""
    return msgspec.json.encode(batch)


# Lenient shapes: everything after block_hashes may be missing (older vLLM, SGLang).


class _MapStored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class _MapRemoved(msgspec.Struct, tag="BlockRemoved", gc=False):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class _MapCleared(msgspec.Struct, tag="AllBlocksCleared", gc=False):
    pass


class _MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_MapStored | _MapRemoved | _MapCleared]
    rank: int | None = None


# Older vLLM declared the events array_like: positional fields, tag first.


class _ArrayStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    block_hashes: list[Hash]
    parent_block_hash: Hash | None = None
    token_ids: list[int] = msgspec.field(default_factory=list)
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _ArrayRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


class _ArrayCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    pass


class _ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayStored | _ArrayRemoved | _ArrayCleared]
    rank: int | None = None


_MapEvent = _MapStored | _MapRemoved | _MapCleared
_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared
_ARRAY_FIELDS = {
    "BlockStored": len(_ArrayStored.__struct_fields__),
    "BlockRemoved": len(_ArrayRemoved.__struct_fields__),
    "AllBlocksCleared": 0,
}


def _stored(e: Any) -> BlockStored:
    # Any of the lenient or SGLang BlockStored shapes; absent fields read as None.
    return BlockStored(
        block_hashes=e.block_hashes,
        parent_block_hash=e.parent_block_hash,
        token_ids=e.token_ids,
        block_size=e.block_size,
        lora_id=e.lora_id,
        medium=e.medium,
        lora_name=e.lora_name,
        extra_keys=getattr(e, "extra_keys", None),
        group_idx=getattr(e, "group_idx", None),
        kv_cache_spec_kind=getattr(e, "kv_cache_spec_kind", None),
        kv_cache_spec_sliding_window=getattr(e, "kv_cache_spec_sliding_window", None),
        locality=getattr(e, "locality", None),
        ownership=getattr(e, "ownership", None),
        session_id=getattr(e, "session_id", None),
        lookahead_token_ids=getattr(e, "lookahead_token_ids", None),
    )


def _removed(e: Any) -> BlockRemoved:
    return BlockRemoved(
        block_hashes=e.block_hashes,
        medium=e.medium,
        group_idx=getattr(e, "group_idx", None),
        locality=getattr(e, "locality", None),
        ownership=getattr(e, "ownership", None),
    )


def to_vllm_event(e: object) -> KVEvent:
    """One decoded event of any known layout (vLLM, older vLLM, SGLang) as a vLLM struct.

    Fields the layout lacks read as ``None``; SGLang's ``cache_salt`` is dropped.
    """
    if isinstance(e, (_MapStored, _ArrayStored, SGLangBlockStored)):
        return _stored(e)
    if isinstance(e, (_MapRemoved, _ArrayRemoved, SGLangBlockRemoved)):
        return _removed(e)
    return AllBlocksCleared()


def from_sglang(batch: SGLangEventBatch) -> KVEventBatch:
    """An SGLang batch as vLLM structs (``attn_dp_rank`` -> ``data_parallel_rank``).

    ``cache_salt`` is dropped: SGLang's hashes are already namespaced by it.
    """
    events = [to_vllm_event(e) for e in batch.events]
    return KVEventBatch(ts=batch.ts, events=events, data_parallel_rank=batch.attn_dp_rank)


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
        try:
            return self._vllm.decode(payload)
        except msgspec.DecodeError as e:
            raise EventDecodeError(f"not a vLLM 0.33 KV-event batch: {e}") from None

    def decode_sglang(self, payload: bytes) -> SGLangEventBatch:
        """Decode an SGLang 0.5.23 batch strictly, into SGLang's structs (re-encodes exactly).

        Raises:
            EventDecodeError: the payload is not an SGLang 0.5.23 batch.
        """
        try:
            return self._sglang.decode(payload)
        except msgspec.DecodeError as e:
            raise EventDecodeError(f"not an SGLang 0.5.23 KV-event batch: {e}") from None

    def _decode_generic(self, payload: bytes) -> KVEventBatch:
        try:
            raw = self._generic.decode(payload)
        except msgspec.DecodeError as e:
            raise EventDecodeError(f"KV-event payload is not msgpack: {e}") from None
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
