"""KV-event batches over ZeroMQ, frame for frame like vLLM 0.33's ``ZmqEventPublisher``.

Publisher (:mod:`.publisher`): sends ``[topic, seq, payload]`` (``seq`` 8-byte
big-endian, from 0 per publisher process, so a restarted engine starts again at 0);
an optional ROUTER socket answers a replay request (the 8-byte start ``seq``) with
every buffered batch from there, ``[topic, seq, payload]`` each, then the end marker
``[b"", END_SEQ, b""]``. The last ``buffer_steps`` batches are kept for replay. It
can wait for its subscribers before the first batch and keep answering replays for
a grace period after the last.

Subscriber (:mod:`.subscriber`): delivers batches in sequence order, exactly once,
and says when it cannot: gaps are replayed, restarts detected (also when the stream
has gone quiet), and anything a peer sends that is not a batch is counted and
resynced, never raised.

Both bound every connection in time (ZMTP heartbeats, replay timeouts) and every
inbound frame in size (:mod:`.sockets`).
"""

from __future__ import annotations

from .publisher import ZmqEventPublisher
from .sockets import END_SEQ, MAX_SEQ, TransportError, is_bind_endpoint, offset_endpoint_port
from .subscriber import BatchCallback, ZmqEventSubscriber

__all__ = [
    "END_SEQ",
    "MAX_SEQ",
    "BatchCallback",
    "TransportError",
    "ZmqEventPublisher",
    "ZmqEventSubscriber",
    "is_bind_endpoint",
    "offset_endpoint_port",
]
