"""Fleets: the replicas a cluster run drives, in-process or pooled (Ray: :mod:`.ray_fleet`).

The driver talks to every fleet through one interface, so the in-process fleet (the
deterministic mode) and the Ray fleet run the same decisions on the same reports. A
replica is built from a :class:`ReplicaSpec` (picklable, so a Ray actor can build it).
:class:`PooledFleet` is the pooled bound: N schedulers over one cache of N x capacity,
stepped in global time order because they share it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Protocol

from prefixkv.adapters.lab.sim.config import SimSettings
from prefixkv.adapters.lab.sim.errors import SimError
from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.keys import HashScheme
from prefixkv.adapters.router.stream_tracker import Dump, SeqBatch
from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.registry import make_index, pool_owned_options

from .errors import ReplicaDeadError
from .sim_replica import ReplicaReport, SharedPool, SimReplica

__all__ = ["Fleet", "LocalFleet", "PooledFleet", "ReplicaSpec"]


@dataclass(frozen=True)
class ReplicaSpec:
    """How to build one replica.

    Attributes:
        backend: the index (``make_index`` name).
        block_size: its block (page) size.
        hash_seed: the hash chain's root seed (shared by the fleet).
        capacity_tokens: its KV pool.
        config: scheduler settings.
        profile: step costs.
        buffer_steps: event batches kept for replay.
        keep_tokens: keep block tokens for dumps.
        check_hits: check admissions against announced blocks (tests).
        drop_removals: probability a ``BlockRemoved`` is never published.
        seed: seeds that loss.
        start_time: the replica's clock when it starts.
        index_options: more ``make_index`` options.
    """

    backend: str
    block_size: int
    hash_seed: int
    capacity_tokens: int
    config: SimSettings
    profile: CostProfile
    buffer_steps: int = 10_000
    keep_tokens: bool = True
    check_hits: bool = False
    drop_removals: float = 0.0
    seed: int = 0
    start_time: float = 0.0
    index_options: dict[str, object] = field(default_factory=dict)

    def index_factory(self) -> functools.partial[PrefixIndex]:
        """A picklable factory of the replica's empty index."""
        options: dict[str, object] = {**pool_owned_options(self.backend), **self.index_options}
        if self.backend == "hash_chain":
            options.setdefault("seed", self.hash_seed)
        return functools.partial(make_index, self.backend, self.block_size, **options)

    def scheme(self) -> HashScheme:
        """The hash scheme the replica's index publishes events with."""
        return HashScheme.for_index(self.index_factory()())

    def build(self, replica_id: int) -> SimReplica:
        """The replica."""
        scheme = self.scheme() if self.check_hits else None
        return SimReplica(
            replica_id,
            self.index_factory(),
            self.capacity_tokens,
            self.config,
            self.profile,
            buffer_steps=self.buffer_steps,
            keep_tokens=self.keep_tokens,
            check_scheme=scheme,
            drop_removals=self.drop_removals,
            seed=self.seed * 1_000_003 + replica_id,
            start_time=self.start_time,
        )


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
        self.replicas[replica] = spec.build(replica)

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
        capacity = (1 << 24) * spec.block_size if infinite else spec.capacity_tokens * num_replicas
        self.pool = SharedPool(
            spec.index_factory(), capacity, spec.config.batching, events=False, shared=True
        )
        self.spec = spec

    def start(self, replica: int, spec: ReplicaSpec) -> None:
        """A scheduler over the shared cache."""
        self.replicas[replica] = SimReplica(
            replica,
            spec.index_factory(),
            spec.capacity_tokens,
            spec.config,
            spec.profile,
            pool=self.pool,
            start_time=spec.start_time,
        )

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
