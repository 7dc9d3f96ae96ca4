"""Endpoints ZeroMQ cannot use are refused by name where a socket is made, leaving
nothing open; a subscriber with a working one never raises from ``poll`` or hangs in
``sync`` when nobody answers (its waits are bounded by ``replay_timeout``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.events.transport import (
    TransportError,
    ZmqEventPublisher,
    ZmqEventSubscriber,
)

BAD_ENDPOINTS = [
    "",
    "not-an-endpoint",
    "tcp://",
    "tcp://127.0.0.1:99999",  # libzmq would take it and use another port
    "tcp://127.0.0.1:-1",
    "tcp://host:port",
    "tcp://127.0.0.1:٣",  # a non-ASCII digit
    "foo://x",
    "udp://127.0.0.1:5",  # a transport SUB/DEALER sockets cannot use
    "inproc://",
    "ipc://" + "x" * 200,  # longer than a socket path may be
]


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.destroy(linger=0)


def _open_sockets(ctx: zmq.Context[Any]) -> list[Any]:
    return [s for s in list(ctx._sockets) if not s.closed]  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", BAD_ENDPOINTS)
def test_a_bad_replay_endpoint_is_refused_at_construction(
    ctx: zmq.Context[Any], tmp_path: Path, bad: str
) -> None:
    with pytest.raises(TransportError, match="replay_endpoint"):
        ZmqEventSubscriber(
            f"ipc://{tmp_path}/pub", lambda s, b: None, replay_endpoint=bad, context=ctx
        )
    assert _open_sockets(ctx) == []


@pytest.mark.parametrize("bad", BAD_ENDPOINTS)
def test_a_bad_live_endpoint_is_refused_at_construction(ctx: zmq.Context[Any], bad: str) -> None:
    with pytest.raises(TransportError, match="endpoint"):
        ZmqEventSubscriber(bad, lambda s, b: None, context=ctx)
    with pytest.raises(TransportError, match="endpoint"):
        ZmqEventPublisher(bad, context=ctx)
    assert _open_sockets(ctx) == []


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=30) | st.text(max_size=10).map(lambda t: "tcp://127.0.0.1:" + t))
def test_any_replay_endpoint_is_refused_by_name_or_works(text: str) -> None:
    context: zmq.Context[Any] = zmq.Context()
    try:
        try:
            sub = ZmqEventSubscriber(
                "inproc://live",
                lambda s, b: None,
                replay_endpoint=text,
                replay_timeout=0.01,
                probe_interval=0.01,
                context=context,
            )
        except TransportError:
            assert _open_sockets(context) == []
            return
        try:  # nobody answers: bounded waits, no raw ZeroMQ error
            assert sub.poll(0.0) == 0
            sub.sync()
            assert sub.poll(0.02) == 0
        finally:
            sub.close()
    finally:
        context.destroy(linger=0)
