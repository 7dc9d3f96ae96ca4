"""The router in front of real engines: their ZeroMQ KV-event streams feed its index.

A vLLM 0.33 engine started with ``--kv-events-config '{"enable_kv_cache_events": true,
"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'``
publishes what :class:`~prefixkv.adapters.events.ZmqEventSubscriber` reads (gaps
replayed, restarts detected). :func:`subscribe` connects one such stream to a
:class:`~.router.Router`: batches go to its cluster index, a restart or an
unbridgeable gap makes the index forget the replica (a real engine offers no dump:
what it still holds is learned again as it publishes). The caller polls the
subscriber and calls :meth:`Router.route` with the requests' token ids.
ZeroMQ is imported when :func:`subscribe` is first called.

vLLM binds its PUB socket only for a wildcard address (``tcp://*:5557``); given
``tcp://127.0.0.1:5557`` it connects, and the router binds that address
(``bind=True``). Its replay socket always binds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixkv.adapters.events.wire import KVEventBatch

from .router import Router

if TYPE_CHECKING:
    from prefixkv.adapters.events.transport import ZmqEventSubscriber

__all__ = ["subscribe"]


def subscribe(
    router: Router,
    replica: int,
    endpoint: str,
    *,
    replay_endpoint: str | None = None,
    bind: bool = False,
    probe_interval: float | None = 1.0,
    replay_timeout: float = 1.0,
    context: Any = None,
) -> ZmqEventSubscriber:
    """Route to ``replica`` and feed its ZeroMQ event stream into ``router``'s index.

    Args:
        router: the router (its index must be event-fed to learn anything).
        replica: the id the router knows the engine by.
        endpoint: the engine's PUB address (``tcp://host:5557``).
        replay_endpoint: its ROUTER replay address, if it has one.
        bind: bind ``endpoint`` (the engine's PUB connects to the router: vLLM given
            a non-wildcard address) instead of connecting to it.
        probe_interval: seconds of quiet after which the replay socket is asked
            whether the engine moved on or restarted (``None``: never).
        replay_timeout: seconds to wait for a replay answer (without one, the
            replica is forgotten rather than trusted).
        context: a ZeroMQ context (default: the process-wide one).

    Returns:
        The subscriber: call ``poll()`` (and ``sync()`` after connecting) to apply
        what arrived; ``close()`` when done.
    """
    # ZeroMQ loads here, not with the router: only a router that subscribes needs it.
    from prefixkv.adapters.events.transport import ZmqEventSubscriber

    router.add_replica(replica)
    index = router.cluster_index

    def on_batch(seq: int, batch: KVEventBatch) -> None:
        if index is not None:
            index.apply(replica, batch, router.now)

    def forget(*_: object) -> None:
        if index is not None:
            index.forget(replica)

    return ZmqEventSubscriber(
        endpoint,
        on_batch,
        replay_endpoint=replay_endpoint,
        on_restart=forget,
        on_resync=forget,
        bind=bind,
        probe_interval=probe_interval,
        replay_timeout=replay_timeout,
        context=context,
    )
