"""What the ZeroMQ publisher and subscriber of KV events share: vLLM's endpoint rules,
the replay answer's end marker, option checks, and the socket settings that put a
time limit on every connection and a size limit on every frame.
"""

from __future__ import annotations

import math
from typing import Any

import zmq

from prefixkv.indexes.errors import PrefixKVError

__all__ = [
    "END_SEQ",
    "MAX_SEQ",
    "MAX_TCP_PORT",
    "TransportError",
    "bind",
    "bound_connection",
    "check_addresses",
    "check_count",
    "check_endpoint",
    "check_seconds",
    "is_bind_endpoint",
    "is_tcp_port",
    "offset_endpoint_port",
    "read_seq",
]

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay answer's end marker (vLLM's ``ZmqEventPublisher.END_SEQ``)."""

MAX_SEQ = 2**63 - 1
"""The largest sequence number: vLLM's are 8-byte big-endian counts from 0, and the
end marker is -1 as a signed 8-byte int, so a frame at or above 2**63 is no batch's."""

MAX_TCP_PORT = 65535
"""The largest tcp port (libzmq takes ``:99999`` without a word and uses its low 16 bits)."""


class TransportError(PrefixKVError):
    """A bad endpoint or option, a closed publisher, or a publisher whose sending
    thread failed (the failure is the cause)."""


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """vLLM's per-rank endpoint: tcp port + rank, ``inproc`` name + ``_dp<rank>``.

    Raises:
        TransportError: an endpoint that is neither tcp nor inproc (with a rank > 0).
    """
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        base, _, port = endpoint.rpartition(":")
        if not port.isdigit() or int(port) == 0:
            return endpoint
        return f"{base}:{int(port) + data_parallel_rank}"
    raise TransportError(f"endpoint {endpoint!r} must be tcp:// or inproc:// to offset by rank")


def is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind wildcard hosts and ipc/inproc addresses, connect to the rest."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def bind(sock: zmq.Socket[Any], endpoint: str) -> str:
    """Bind ``sock``; returns the address bound (a wildcard port resolved)."""
    sock.bind(endpoint)
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def is_tcp_port(port: str, lowest: int = 0) -> bool:
    """Whether ``port``, the text after a tcp address's last colon, is ``*`` (a free port,
    bound) or a number in ``[lowest, MAX_TCP_PORT]`` written in ASCII digits."""
    return port == "*" or (
        port.isascii() and port.isdigit() and lowest <= int(port) <= MAX_TCP_PORT
    )


def check_endpoint(name: str, value: object) -> str:
    """``value`` if it is a non-empty str whose tcp port, when it has one, is ``*`` or
    a number ZeroMQ can use (:func:`is_tcp_port`: 0-65535; vLLM takes ``tcp://*:0``,
    a free port bound on the node's address). The rest of the address ZeroMQ checks itself,
    where the socket is opened.

    Raises:
        TransportError: otherwise.
    """
    if not isinstance(value, str) or not value:
        raise TransportError(f"{name} must be a non-empty str, got {value!r:.80}")
    transport, sep, address = value.partition("://")
    if not sep:
        raise TransportError(f"{name} {value!r:.80} is no ZeroMQ address (transport://address)")
    if transport == "tcp" and not is_tcp_port(address.rpartition(":")[2]):
        raise TransportError(f"{name} {value!r:.80} needs a tcp port in 0-{MAX_TCP_PORT} or *")
    return value


def check_addresses(endpoint: object, replay_endpoint: object, topic: object) -> bytes:
    """Check a publisher's or subscriber's addresses (``check_endpoint``; the replay
    address may be ``None``) and topic; returns the topic frame (the str, encoded).

    Raises:
        TransportError: a bad address, or a topic that is not a str.
    """
    check_endpoint("endpoint", endpoint)
    if replay_endpoint is not None:
        check_endpoint("replay_endpoint", replay_endpoint)
    if not isinstance(topic, str):
        raise TransportError(f"topic must be a str, got {topic!r}")
    return topic.encode()


def check_count(name: str, value: object, minimum: int = 0, maximum: int = 2**31 - 1) -> int:
    """``value`` if it is an int (not a bool) in ``[minimum, maximum]`` (ZeroMQ's socket
    options and Python's buffers take at most a C int or ssize_t).

    Raises:
        TransportError: otherwise.
    """
    if type(value) is not int or not minimum <= value <= maximum:
        raise TransportError(f"{name} must be an int in [{minimum}, {maximum}], got {value!r:.60}")
    return value


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as seconds if it is a finite number, >= 0 (> 0 when ``positive``), and
    at most a day (a longer wait is a mistake, and ZeroMQ takes int milliseconds).

    Raises:
        TransportError: otherwise.
    """
    ok = type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]
    seconds = float(value) if ok else math.nan  # type: ignore[arg-type]
    if not ok or seconds < 0 or (positive and seconds == 0) or seconds > 86_400:
        kind = "> 0" if positive else ">= 0"
        raise TransportError(
            f"{name} must be a number of seconds {kind}, at most a day, got {value!r}"
        )
    return seconds


def bound_connection(sock: zmq.Socket[Any], heartbeat: float, max_bytes: int | None = None) -> None:
    """Limit ``sock``'s connections in time, and its inbound messages in size when given.

    ZMTP heartbeats every ``heartbeat`` s close a connection whose peer stops answering
    for three of them (a dead host or a half-open TCP link), so it is re-established
    or its queue freed instead of waiting forever; TCP connects give up after the same
    three beats. ``max_bytes`` makes ZeroMQ disconnect a peer sending a larger frame
    before reading it: only for sockets that receive single-part messages (a
    publisher's subscriptions), since libzmq 4.3 aborts the process when it cuts a
    multipart message its reader has begun.
    """
    ms = max(1, int(heartbeat * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ms)
    sock.setsockopt(zmq.HEARTBEAT_TTL, min(3 * ms, 6_553_500))  # ZMTP caps it at 6553.5 s
    sock.setsockopt(zmq.CONNECT_TIMEOUT, 3 * ms)
    if max_bytes is not None:
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)


def read_seq(frame: bytes) -> int | None:
    """A batch's sequence number from its 8-byte big-endian frame; None when the frame
    is not one (another length, the end marker, or at or above 2**63)."""
    if len(frame) != 8:
        return None
    seq = int.from_bytes(frame, "big")
    return seq if seq <= MAX_SEQ else None
