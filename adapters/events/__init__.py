"""KV-cache events in vLLM 0.33's wire format: codec, transport, recorder and a consumer index.

``wire`` (vLLM's structs) and ``sglang_wire`` (SGLang 0.5.23's) encode byte for byte
what the engines publish; ``codec`` decodes either, and older vLLM, into vLLM structs;
``transport`` is a ZeroMQ publisher/subscriber pair like vLLM's ``ZmqEventPublisher``;
``files`` writes and reads one JSON line per batch; ``recorder`` turns an index's sink
calls into vLLM events; ``index`` rebuilds, from events alone, which blocks each
replica holds.
"""

from .codec import EventDecodeError, EventDecoder, encode, encode_json, from_sglang
from .files import EventFileWriter, read_event_file
from .index import EventIndex, Source
from .recorder import VllmEventRecorder
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
    "KVCacheEvent",
    "KVEventBatch",
    "Source",
    "TransportError",
    "VllmEventRecorder",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
    "encode",
    "encode_json",
    "from_sglang",
    "read_event_file",
]
