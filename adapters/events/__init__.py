"""KV-cache events in vLLM 0.33's wire format: codec, transport, recorder and a consumer index.

``wire`` (vLLM's structs) and ``sglang_wire`` (SGLang 0.5.23's) encode byte for byte
what the engines publish; ``codec`` decodes either, and older vLLM, into vLLM structs;
``transport`` is a ZeroMQ publisher/subscriber pair like vLLM's ``ZmqEventPublisher``
(loaded on first use of one of its names, so importing the package loads no ZeroMQ);
``files`` writes and reads one JSON line per batch; ``recorder`` and ``sglang_recorder``
turn an index's sink calls into vLLM's or SGLang's events, and ``dialects`` picks the
one an index speaks; ``index`` rebuilds, from events alone, which blocks each replica
holds.
"""

from typing import TYPE_CHECKING

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
from .wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVCacheEvent,
    KVEventBatch,
)

if TYPE_CHECKING:
    from .transport import END_SEQ, TransportError, ZmqEventPublisher, ZmqEventSubscriber

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

_TRANSPORT = frozenset({"END_SEQ", "TransportError", "ZmqEventPublisher", "ZmqEventSubscriber"})


def __getattr__(name: str) -> object:
    # The transport imports ZeroMQ: only a process that publishes or subscribes pays it.
    if name in _TRANSPORT:
        from . import transport

        return getattr(transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
