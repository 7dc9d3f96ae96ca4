"""``cluster --ray-address``: an address where no Ray head answers is refused by name, fast.

``ray.init`` waits for minutes at a port that accepts connections but is not Ray. The
probe (:func:`check_ray_address`) speaks HTTP/2's preface, as a gRPC client does, and
wants a SETTINGS frame back. Each peer here is a loopback server on its own thread,
always stopped; no Ray is needed.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from prefixkv.adapters.lab.cluster.ray_fleet import check_ray_address
from prefixkv.adapters.router.errors import ClusterSettingsError

SETTINGS_FRAME = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@contextlib.contextmanager
def peer(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A loopback server that runs ``answer`` on each connection; yields its port."""
    stop = threading.Event()
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.05)

    def serve() -> None:
        conns = []
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conns.append(conn)
            answer(conn, stop)
        for conn in conns:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)
        server.close()


def silent(conn: socket.socket, stop: threading.Event) -> None:
    pass  # accepts, says nothing


def http1(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def closes(conn: socket.socket, stop: threading.Event) -> None:
    conn.close()


def drips(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"\x00")  # one byte of a frame header, then nothing


def grpc(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(SETTINGS_FRAME)  # what a gRPC server (Ray's GCS) sends first


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (silent, "no Ray answered within 0.5 s"),
        (drips, "no Ray answered within 0.5 s"),
        (http1, "is not Ray"),
        (closes, "is not Ray"),
    ],
    ids=["silent", "drips", "http1", "closes"],
)
@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_a_port_that_is_not_ray_is_refused_by_name(
    answer: Callable[[socket.socket, threading.Event], None], message: str, scheme: str
) -> None:
    with peer(answer) as port, pytest.raises(ClusterSettingsError, match=message) as info:
        check_ray_address(f"{scheme}127.0.0.1:{port}", timeout_s=0.5)
    assert "\n" not in str(info.value) and "ray start --head" in str(info.value)


def test_a_grpc_server_passes() -> None:
    with peer(grpc) as port:
        check_ray_address(f"127.0.0.1:{port}", timeout_s=30)
        check_ray_address(f"ray://127.0.0.1:{port}", timeout_s=30)


def test_nothing_listening_is_refused_by_name() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClusterSettingsError, match="nothing answers there"):
        check_ray_address(f"127.0.0.1:{port}", timeout_s=5)


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", ":6379", "h:x", "h:\u0665"]
)
def test_a_malformed_address_is_refused_by_name(address: str) -> None:
    with pytest.raises(ClusterSettingsError, match="want HOST:PORT"):
        check_ray_address(address, timeout_s=0.5)
