"""Fleets: the replicas a cluster run drives, in-process, pooled (the bounds) or on Ray."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, cast

from prefixkv.adapters.lab.sim.errors import SimError
from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.errors import ClusterError
from prefixkv.adapters.router.keys import HashScheme
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch
from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.registry import make_index, pool_owned_options

from .config import ClusterSettings
from .sim_replica import ReplicaReport, SimReplica, replica_seat

__all__ = ["Fleet", "LocalFleet", "PooledFleet", "ReplicaDeadError", "ReplicaSpec"]


class ReplicaDeadError(ClusterError):
    """A call reached a replica that was killed (or whose actor died)."""


@dataclass(frozen=True)
class ReplicaSpec:
    """How to build one replica (picklable, so a Ray actor can build it)."""

    settings: ClusterSettings
    profile: CostProfile
    drop_removals: float = 0.0
    start_time: float = 0.0

    def index_factory(self) -> functools.partial[PrefixIndex]:
        """A picklable factory of the replica's empty index."""
        cfg = self.settings
        options: dict[str, object] = dict(pool_owned_options(cfg.backend))
        if cfg.backend == "hash_chain":
            options.setdefault("seed", cfg.hash_seed)
        return functools.partial(make_index, cfg.backend, cfg.block_size, **options)

    def scheme(self) -> HashScheme:
        """The hash scheme the replica's index publishes events with."""
        return HashScheme.for_index(self.index_factory()())


class Fleet:
    """The replicas of a run as the driver calls them, each a :class:`SimReplica` in this
    process (deterministic); :class:`~.ray_fleet.RayFleet` answers the same calls from Ray
    actors. A call to a replica that is gone raises :class:`ReplicaDeadError`; a read
    answers ``None`` (``{}`` for ``held``)."""

    def __init__(self) -> None:
        self.replicas: dict[int, Any] = {}

    def _call(self, replica: int, method: str, *args: Any) -> Any:
        rep = self.replicas.get(replica)
        if rep is None:
            raise ReplicaDeadError(f"replica {replica} is not running")
        return getattr(rep, method)(*args)

    def _read(self, replica: int, dead: Any, method: str, *args: Any) -> Any:
        try:
            return self._call(replica, method, *args)
        except ReplicaDeadError:
            return dead

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        """Start (or restart, empty) ``replica`` from ``spec``."""
        self.replicas[replica] = SimReplica(spec, replica)

    def add(self, replica: int, request: SimRequest) -> None:
        """Queue the request on the replica."""
        self._call(replica, "add", request)

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        """Advance the replicas to ``until``: their reports, and those found dead."""
        live = [self.replicas[r] for r in replicas if r in self.replicas]
        return [rep.advance(until) for rep in live], [r for r in replicas if r not in self.replicas]

    def replay(self, replica: int, start: int, until: float) -> list[SeqBatch] | None:
        """A replica's buffered batches from ``start`` published by ``until``."""
        return cast("list[SeqBatch] | None", self._read(replica, None, "replay", start, until))

    def dump(self, replica: int) -> Dump | None:
        """A replica's cache as a dump."""
        return cast("Dump | None", self._read(replica, None, "dump"))

    def kill(self, replica: int) -> None:
        """Kill a replica (its state is lost)."""
        self.replicas.pop(replica, None)

    def reset_prefix_cache(self, replica: int) -> None:
        """Reset a replica's prefix cache (it publishes ``AllBlocksCleared``)."""
        self._call(replica, "reset_prefix_cache")

    def held(self, replica: int) -> dict[int, int]:
        """Hash -> copies a replica's events say it holds."""
        return cast("dict[int, int]", self._read(replica, {}, "held"))

    def close(self) -> None:
        """Release the fleet."""
        self.replicas.clear()


LocalFleet = Fleet
"""The in-process fleet, the default."""


class PooledFleet(Fleet):
    """The bounds: N schedulers sharing one cache of N x capacity (``infinite``: 2**24
    blocks, nothing evicted), stepped in global time order."""

    def __init__(self, spec: ReplicaSpec, num_replicas: int, *, infinite: bool = False) -> None:
        super().__init__()
        cfg = spec.settings
        capacity = (1 << 24) * cfg.block_size if infinite else cfg.capacity_tokens * num_replicas
        self.seat = replica_seat(spec.index_factory(), capacity, cfg.sim.batching, events=False)

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        self.replicas[replica] = SimReplica(spec, replica, seat=self.seat)

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        live: list[SimReplica] = [self.replicas[r] for r in replicas if r in self.replicas]
        blocked: set[int] = set()
        while ready := [
            rep
            for rep in live
            if rep.has_unfinished() and rep.now < until and rep.replica_id not in blocked
        ]:
            rep = min(ready, key=lambda rep: (rep.now, rep.replica_id))
            if rep.step():
                blocked.clear()
                continue
            # Its requests wait for blocks the others hold: until the next of them steps.
            others = [o.now for o in live if o is not rep and o.schedule.running]
            if not others:
                raise SimError(
                    f"pooled replica {rep.replica_id} cannot schedule at t={rep.now:.6f} "
                    "and no other replica will free blocks"
                )
            if min(others) > rep.now:
                rep.now = min(others)
            else:
                blocked.add(rep.replica_id)
        return super().advance(replicas, -math.inf)  # the reports, stepping none
