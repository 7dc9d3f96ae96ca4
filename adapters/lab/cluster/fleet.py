"""Fleets: the replicas a cluster run drives, in-process or pooled (Ray: :mod:`.ray_fleet`).

The driver talks to every fleet through one interface, so the in-process fleet (the
deterministic mode) and the Ray fleet run the same decisions on the same reports. A
replica is built from a :class:`ReplicaSpec` (picklable, so a Ray actor can build it).
:class:`PooledFleet` is the pooled bound: N schedulers over one cache of N x capacity,
stepped in global time order because they share it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Protocol

from prefixkv.adapters.lab.sim.errors import SimError
from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.keys import HashScheme
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch
from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.registry import make_index, pool_owned_options

from .config import ClusterSettings
from .errors import ReplicaDeadError
from .sim_replica import ReplicaReport, SharedPool, SimReplica

__all__ = ["Fleet", "LocalFleet", "PooledFleet", "ReplicaSpec"]


@dataclass(frozen=True)
class ReplicaSpec:
    """How to build one replica.

    Attributes:
        settings: the fleet's settings: the replica's index (``backend``), block size,
            hash seed, KV pool, scheduler settings, buffered event batches, whether it
            keeps block tokens for dumps and checks admissions against the blocks it
            announced (``check``, tests), and the seed of its event loss.
        profile: step costs.
        drop_removals: probability a ``BlockRemoved`` is never published.
        start_time: the replica's clock when it starts.
    """

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

    def replace(self, **settings: Any) -> ReplicaSpec:
        """This spec with some of its fleet settings changed (a mismatched replica)."""
        return dataclasses.replace(self, settings=dataclasses.replace(self.settings, **settings))


class Fleet(Protocol):
    """The replicas of a run, as the driver drives them."""

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        """Start (or restart, empty) ``replica`` from ``spec``."""
        ...

    def add(self, replica: int, request: SimRequest) -> None:
        """Send a request. Raises :class:`ReplicaDeadError` if the replica is gone."""
        ...

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        """Advance replicas to ``until``: their reports, and those found dead."""
        ...

    def replay(self, replica: int, start: int, until: float) -> list[SeqBatch] | None:
        """A replica's buffered batches (None: unreachable)."""
        ...

    def dump(self, replica: int) -> Dump | None:
        """A replica's cache as a dump (None: unreachable)."""
        ...

    def kill(self, replica: int) -> None:
        """Kill a replica (its state is lost)."""
        ...

    def reset_prefix_cache(self, replica: int) -> None:
        """Reset a replica's prefix cache (it publishes ``AllBlocksCleared``)."""
        ...

    def held(self, replica: int) -> dict[int, int]:
        """Hash -> copies a live replica holds ({} for a dead one)."""
        ...

    def close(self) -> None:
        """Release the fleet."""
        ...


class LocalFleet:
    """Every replica a :class:`SimReplica` in this process: the deterministic mode."""

    def __init__(self) -> None:
        self.replicas: dict[int, SimReplica] = {}

    def _get(self, replica: int) -> SimReplica:
        rep = self.replicas.get(replica)
        if rep is None:
            raise ReplicaDeadError(f"replica {replica} is not running")
        return rep

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        """Build (or rebuild, empty) the replica."""
        self.replicas[replica] = SimReplica(spec, replica)

    def add(self, replica: int, request: SimRequest) -> None:
        """Queue the request on the replica."""
        self._get(replica).add(request)

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        """Advance each live one in turn (they share nothing)."""
        reports, dead = [], []
        for r in replicas:
            rep = self.replicas.get(r)
            if rep is None:
                dead.append(r)
            else:
                reports.append(rep.advance(until))
        return reports, dead

    def replay(self, replica: int, start: int, until: float) -> list[SeqBatch] | None:
        """From the replica's buffer."""
        rep = self.replicas.get(replica)
        return None if rep is None else rep.replay(start, until)

    def dump(self, replica: int) -> Dump | None:
        """From the replica's local indexer."""
        rep = self.replicas.get(replica)
        return None if rep is None else rep.dump()

    def kill(self, replica: int) -> None:
        """Drop the replica."""
        self.replicas.pop(replica, None)

    def reset_prefix_cache(self, replica: int) -> None:
        """Reset its cache."""
        self._get(replica).reset_prefix_cache()

    def held(self, replica: int) -> dict[int, int]:
        """What its events say it holds."""
        rep = self.replicas.get(replica)
        return {} if rep is None else rep.held()

    def close(self) -> None:
        """Nothing to release."""
        self.replicas.clear()


class PooledFleet(LocalFleet):
    """N schedulers sharing one cache of N x capacity (or an unbounded one): the bounds.

    Args:
        spec: the per-replica spec (its capacity is multiplied by ``num_replicas``).
        num_replicas: how many schedulers.
        infinite: give the shared cache 2**24 blocks (nothing is evicted).
    """

    def __init__(self, spec: ReplicaSpec, num_replicas: int, *, infinite: bool = False) -> None:
        super().__init__()
        cfg = spec.settings
        capacity = (1 << 24) * cfg.block_size if infinite else cfg.capacity_tokens * num_replicas
        self.pool = SharedPool(
            spec.index_factory(), capacity, cfg.sim.batching, events=False, shared=True
        )
        self.spec = spec

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        """A scheduler over the shared cache."""
        self.replicas[replica] = SimReplica(spec, replica, pool=self.pool)

    def advance(self, replicas: list[int], until: float) -> tuple[list[ReplicaReport], list[int]]:
        """Step the schedulers in global time order (they share the cache)."""
        live = [self.replicas[r] for r in replicas if r in self.replicas]
        blocked: set[int] = set()
        while True:
            ready = [
                rep
                for rep in live
                if rep.has_unfinished() and rep.now < until and rep.replica_id not in blocked
            ]
            if not ready:
                break
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
        return [rep.advance(-math.inf) for rep in live], [
            r for r in replicas if r not in self.replicas
        ]
