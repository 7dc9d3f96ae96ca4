"""The fleet on Ray: one actor per replica, advanced in parallel.

Each replica is a :class:`SimReplica` (built from its spec) as a Ray actor (``num_cpus``
each, default 1); the driver (the router's process) calls the actors exactly as the in-process fleet
calls its objects, so a fault-free run gives the same decisions and hit ratios.
Advancing fans out to every busy replica at once and gathers the reports; event
batches cross as vLLM's msgpack bytes with their sequence numbers. A killed actor
(``ray.kill``) raises ``RayActorError`` on its next call: the driver treats the
replica as dead and routes its requests elsewhere. Ray is imported only here, and
only when a Ray run is asked for (``pip install 'prefixkv[cluster]'``).

On a multi-node cluster, call ``ray.init(address="auto")`` (or set ``RAY_ADDRESS``)
before the run; the actors are scheduled across the nodes unchanged.

Ray waits forever for resources it cannot place and for a head node that is not
there; :func:`actor_cpus` and :func:`check_ray_address` turn both into an error (or a
smaller CPU share) before anything starts.
"""

from __future__ import annotations

import math
import socket
import time
from typing import Any

from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch

from ..extras import require_extra
from .errors import ClusterSettingsError, ReplicaDeadError
from .fleet import ReplicaSpec
from .sim_replica import ReplicaReport, SimReplica

__all__ = ["RAY_CPU_STEP", "RayFleet", "actor_cpus", "check_ray_address"]

RAY_CPU_STEP = 1e-4
"""The finest fractional CPU share Ray accepts."""


def actor_cpus(actors: int, free_cpus: float, requested: float | None) -> tuple[float, str]:
    """The CPUs each of ``actors`` replica actors may ask for so that all fit at once.

    Ray places an actor only when its CPUs are free and otherwise waits, silently and
    forever: 4 actors of 1 CPU on 2 cores never all start. A share the caller chose
    (``requested``) is kept or refused; the default (1 CPU) is lowered to fit.

    Args:
        actors: the most replica actors alive at once.
        free_cpus: the Ray cluster's free CPUs (``ray.available_resources()``).
        requested: ``--ray-cpus``, or ``None`` for the default.

    Returns:
        The share, and a one-line note when the default was lowered (else ``""``).

    Raises:
        ClusterSettingsError: the requested share does not fit, or no CPU is free.
    """
    if actors < 1:
        return requested or 1.0, ""
    fit = round(math.floor(free_cpus / actors / RAY_CPU_STEP) * RAY_CPU_STEP, 4)
    if requested is not None:
        if requested * actors > free_cpus + 1e-9:
            hint = f"--ray-cpus {fit:.4g} or fewer replicas" if fit > 0 else "fewer replicas"
            raise ClusterSettingsError(
                f"--ray: {actors} replica actors x --ray-cpus {requested:g} = "
                f"{requested * actors:g} CPUs, but the Ray cluster has {free_cpus:g} free "
                f"(Ray would wait forever to place them); give {hint}"
            )
        return requested, ""
    if fit <= 0:
        raise ClusterSettingsError(
            f"--ray: the Ray cluster has {free_cpus:g} free CPUs, too few for {actors} "
            "replica actors"
        )
    if fit >= 1:
        return 1.0, ""
    return fit, (
        f"{actors} replica actors x 1 CPU exceed the Ray cluster's {free_cpus:g} free CPUs; "
        f"each asks for {fit:.4g} CPU instead (--ray-cpus to choose)"
    )


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HTTP2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
_SETTINGS_TYPE = 4


def check_ray_address(address: str, timeout_s: float = 10.0) -> None:
    """Refuse a Ray address where no Ray answers, within ``timeout_s``.

    ``ray.init`` retries an unreachable head node for minutes without a word, and waits
    as long at a port that accepts connections but is not Ray. Ray's head (the GCS, or
    the Ray client server behind ``ray://``) speaks gRPC, so the probe opens a TCP
    connection, sends HTTP/2's client preface and expects the server's SETTINGS frame
    back: milliseconds from a Ray head, and a named error from anything else. ``auto``
    and ``local`` are Ray's to resolve (they fail fast by themselves).

    Args:
        address: ``HOST:PORT``, ``ray://HOST:PORT``, ``auto`` or ``local``.
        timeout_s: the longest the probe waits (connecting, then the answer).

    Raises:
        ClusterSettingsError: a malformed address, no answer in time, or an answer that
            is not a gRPC server's.
    """
    if address in ("auto", "local"):
        return
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    host = host.strip("[]")
    if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterSettingsError(
            f"--ray-address {address!r}: want HOST:PORT, ray://HOST:PORT or auto"
        )
    hint = (
        "start Ray there (ray start --head) or leave out --ray-address (and RAY_ADDRESS) "
        "for a local Ray"
    )
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as exc:
        raise ClusterSettingsError(
            f"--ray-address {address}: nothing answers there within {timeout_s:g} s "
            f"({exc.strerror or exc}); {hint}"
        ) from None
    with sock:
        try:
            answer = _grpc_answer(sock, time.monotonic() + timeout_s)
        except TimeoutError:
            raise ClusterSettingsError(
                f"--ray-address {address}: no Ray answered within {timeout_s:g} s (the port "
                f"accepts connections but is silent, so it is not a Ray head); {hint}"
            ) from None
        except OSError:  # reset: whatever it is, it closed on a gRPC preface
            answer = b""
    if len(answer) < 9 or answer[3] != _SETTINGS_TYPE:
        raise ClusterSettingsError(
            f"--ray-address {address}: what answers there is not Ray (not a gRPC server: "
            f"{answer[:40]!r}); {hint}"
        )


def _grpc_answer(sock: socket.socket, deadline: float) -> bytes:
    """The first 9 bytes (one frame header) a server sends after HTTP/2's preface;
    fewer when it closes first.

    Raises:
        TimeoutError: not all of them by ``deadline`` (``time.monotonic()``).
    """
    sock.sendall(_HTTP2_PREFACE + _HTTP2_SETTINGS)
    answer = b""
    while len(answer) < 9:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(9 - len(answer))
        if not chunk:
            break
        answer += chunk
    return answer


class RayFleet:
    """Replicas as Ray actors.

    Args:
        num_cpus: CPUs each actor asks for.
        init: call ``ray.init`` (local, ``ray_init`` options) unless Ray is already up.
        ray_init: options for ``ray.init`` (e.g. ``num_cpus``, ``address``).

    Raises:
        ExtraNotInstalledError: Ray is not installed.
    """

    def __init__(
        self, *, num_cpus: float = 1, init: bool = True, ray_init: dict[str, Any] | None = None
    ) -> None:
        require_extra("cluster", "RayFleet", ("ray",))
        import ray

        self._ray = ray
        self._started_ray = False
        if init and not ray.is_initialized():
            options = {"include_dashboard": False, "log_to_driver": False, **(ray_init or {})}
            ray.init(**options)
            self._started_ray = True
        self._cls = ray.remote(num_cpus=num_cpus)(SimReplica)
        self.actors: dict[int, Any] = {}

    def _call(self, replica: int, method: str, *args: Any) -> Any:
        actor = self.actors.get(replica)
        if actor is None:
            raise ReplicaDeadError(f"replica {replica} is not running")
        try:
            return self._ray.get(getattr(actor, method).remote(*args))
        except self._ray.exceptions.RayActorError as e:
            self.actors.pop(replica, None)
            raise ReplicaDeadError(f"replica {replica} died: {e}") from None

    def _call_live(self, replica: int, dead: Any, method: str, *args: Any) -> Any:
        # A read of a replica that may be gone: ``dead`` when it is.
        try:
            return self._call(replica, method, *args)
        except ReplicaDeadError:
            return dead

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        """Start (or replace with an empty one) the replica's actor."""
        old = self.actors.pop(replica, None)
        if old is not None:
            self._ray.kill(old)
        self.actors[replica] = self._cls.remote(spec, replica)

    def add(self, replica: int, request: SimRequest) -> None:
        """Send the request (waits for the actor to take it, so a dead one is known)."""
        self._call(replica, "add", request)

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        """Advance every listed replica in parallel."""
        ray = self._ray
        dead = [r for r in replicas if r not in self.actors]
        refs = {r: self.actors[r].advance.remote(until) for r in replicas if r in self.actors}
        reports = []
        for r, ref in refs.items():
            try:
                reports.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                self.actors.pop(r, None)
                dead.append(r)
        return reports, dead

    def replay(self, replica: int, start: int, until: float) -> list[SeqBatch] | None:
        """The actor's buffered batches."""
        out: list[SeqBatch] | None = self._call_live(replica, None, "replay", start, until)
        return out

    def dump(self, replica: int) -> Dump | None:
        """The actor's dump."""
        out: Dump | None = self._call_live(replica, None, "dump")
        return out

    def kill(self, replica: int) -> None:
        """``ray.kill`` the actor."""
        actor = self.actors.pop(replica, None)
        if actor is not None:
            self._ray.kill(actor, no_restart=True)

    def reset_prefix_cache(self, replica: int) -> None:
        """Reset the actor's cache."""
        self._call(replica, "reset_prefix_cache")

    def held(self, replica: int) -> dict[int, int]:
        """What the actor's events say it holds."""
        out: dict[int, int] = self._call_live(replica, {}, "held")
        return out

    def close(self) -> None:
        """Kill the actors; shut Ray down if this fleet started it."""
        for actor in self.actors.values():
            self._ray.kill(actor)
        self.actors.clear()
        if self._started_ray:
            self._ray.shutdown()
