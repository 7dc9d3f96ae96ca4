"""The fleet on Ray: one actor per replica, called as the in-process fleet calls its
replicas. Ray is imported only here. Ray waits forever for CPUs it cannot place and for a
head node that is not there: :func:`actor_cpus` and :func:`check_ray_address` say so first.
"""

from __future__ import annotations

import math
import socket
import time
from typing import Any

from prefixkv.adapters.router.errors import ClusterSettingsError

from ..extras import require_extra
from .fleet import Fleet, ReplicaDeadError, ReplicaSpec
from .sim_replica import ReplicaReport, SimReplica

__all__ = ["RayFleet", "actor_cpus", "check_ray_address"]

_CPU_STEP = 1e-4  # the finest fractional CPU share Ray accepts


def actor_cpus(actors: int, free_cpus: float, requested: float | None) -> tuple[float, str]:
    """The CPUs each of ``actors`` replica actors may ask for so that all fit at once, and
    a note when the default (1 CPU) was lowered to fit.

    Raises:
        ClusterSettingsError: the ``requested`` share does not fit, or no CPU is free.
    """
    if actors < 1:
        return requested or 1.0, ""
    fit = round(math.floor(free_cpus / actors / _CPU_STEP) * _CPU_STEP, 4)
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
    """Refuse a Ray address (``HOST:PORT``, ``ray://HOST:PORT``; ``auto`` and ``local`` are
    Ray's) where no Ray answers within ``timeout_s``. Ray's head speaks gRPC: the probe
    sends HTTP/2's preface and expects a SETTINGS frame back.

    Raises:
        ClusterSettingsError: a malformed address, no answer, or not a gRPC server's.
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


class RayFleet(Fleet):
    """Replicas as Ray actors (``num_cpus`` each), advanced in parallel; ``init`` starts a
    local Ray unless one is up (and shuts it down on ``close``).

    Raises:
        ExtraNotInstalledError: Ray is not installed.
    """

    def __init__(self, *, num_cpus: float = 1, init: bool = True) -> None:
        require_extra("cluster", "RayFleet", ("ray",))
        import ray

        super().__init__()
        self._ray = ray
        self._started_ray = False
        if init and not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
            self._started_ray = True
        self._cls = ray.remote(num_cpus=num_cpus)(SimReplica)

    def _call(self, replica: int, method: str, *args: Any) -> Any:
        actor = self.replicas.get(replica)
        if actor is None:
            raise ReplicaDeadError(f"replica {replica} is not running")
        try:
            return self._ray.get(getattr(actor, method).remote(*args))
        except self._ray.exceptions.RayActorError as e:
            self.replicas.pop(replica, None)
            raise ReplicaDeadError(f"replica {replica} died: {e}") from None

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        old = self.replicas.pop(replica, None)
        if old is not None:
            self._ray.kill(old)
        self.replicas[replica] = self._cls.remote(spec, replica)

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        ray = self._ray
        dead = [r for r in replicas if r not in self.replicas]
        refs = {r: self.replicas[r].advance.remote(until) for r in replicas if r in self.replicas}
        reports = []
        for r, ref in refs.items():
            try:
                reports.append(ray.get(ref))
            except ray.exceptions.RayActorError:
                self.replicas.pop(r, None)
                dead.append(r)
        return reports, dead

    def kill(self, replica: int) -> None:
        actor = self.replicas.pop(replica, None)
        if actor is not None:
            self._ray.kill(actor, no_restart=True)

    def close(self) -> None:
        for actor in self.replicas.values():
            self._ray.kill(actor)
        self.replicas.clear()
        if self._started_ray:
            self._ray.shutdown()
