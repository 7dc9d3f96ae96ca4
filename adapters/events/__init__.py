"""KV-cache events in vLLM 0.33's wire format: codec, transport, recorder and a consumer index.

``wire`` (vLLM's structs) and ``sglang_wire`` (SGLang 0.5.23's) encode byte for byte
what the engines publish; ``codec`` decodes either, and older vLLM, into vLLM structs;
``transport`` is a ZeroMQ publisher/subscriber pair like vLLM's ``ZmqEventPublisher``;
``files`` writes and reads one JSON line per batch; ``recorder`` and ``sglang_recorder``
turn an index's sink calls into vLLM's or SGLang's events, and ``dialects`` picks the
one an index speaks; ``index`` rebuilds, from events alone, which blocks each replica
holds.

Every name below loads its module on first use (``_HOMES`` says which), so that the
request lifecycle, which imports ``dialects`` and ``wire`` directly, loads no event-file
writer, no ``EventIndex`` and no ZeroMQ; ``from prefixkv.adapters.events import X``
works for every name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixkv.indexes.lazy import lazy_names

if TYPE_CHECKING:
    from .codec import EventDecodeError, EventDecoder, encode, encode_json, from_sglang
    from .dialects import (
        EventRecorder,
        EventsUnsupportedError,
        attach_event_recorder,
        make_event_recorder,
    )
    from .files import EventFileWriter, read_event_file
    from .index import EventIndex, Source
    from .recorder import VllmEventRecorder
    from .sglang_recorder import SGLangEventRecorder
    from .transport import END_SEQ, TransportError, ZmqEventPublisher, ZmqEventSubscriber
    from .wire import (
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        EventBatch,
        KVCacheEvent,
        KVEventBatch,
    )

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventDecodeError",
    "EventDecoder",
    "EventFileWriter",
    "EventIndex",
    "EventRecorder",
    "EventsUnsupportedError",
    "KVCacheEvent",
    "KVEventBatch",
    "SGLangEventRecorder",
    "Source",
    "TransportError",
    "VllmEventRecorder",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
    "attach_event_recorder",
    "encode",
    "encode_json",
    "from_sglang",
    "make_event_recorder",
    "read_event_file",
]

_HOMES: dict[str, str] = {
    "END_SEQ": "transport",
    "AllBlocksCleared": "wire",
    "BlockRemoved": "wire",
    "BlockStored": "wire",
    "EventBatch": "wire",
    "EventDecodeError": "codec",
    "EventDecoder": "codec",
    "EventFileWriter": "files",
    "EventIndex": "index",
    "EventRecorder": "dialects",
    "EventsUnsupportedError": "dialects",
    "KVCacheEvent": "wire",
    "KVEventBatch": "wire",
    "SGLangEventRecorder": "sglang_recorder",
    "Source": "index",
    "TransportError": "transport",
    "VllmEventRecorder": "recorder",
    "ZmqEventPublisher": "transport",
    "ZmqEventSubscriber": "transport",
    "attach_event_recorder": "dialects",
    "encode": "codec",
    "encode_json": "codec",
    "from_sglang": "codec",
    "make_event_recorder": "dialects",
    "read_event_file": "files",
}
"""Each name of the face and the module that defines it, loaded on first use."""


_lookup = lazy_names(__name__, _HOMES)


def __getattr__(name: str) -> object:
    return _lookup(name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
