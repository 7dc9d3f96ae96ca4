"""A cluster run's settings."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from prefixkv.adapters.lab.sim.config import DEFAULT_BLOCK_SIZE, SimSettings
from prefixkv.adapters.lab.sim.load import Slo
from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.indexes.validation import MAX_BLOCK_SIZE, MAX_BLOCKS

__all__ = ["DEFAULT_BUFFER_STEPS", "MAX_REPLICAS", "ClusterSettings"]

MAX_REPLICAS = 1024
"""The most replicas a simulated fleet starts with."""

MAX_BUFFER_STEPS = 2**24
"""The most event batches a replica keeps for replay."""

DEFAULT_BUFFER_STEPS = 10_000
"""Event batches a replica keeps for replay: vLLM's ``KVEventsConfig.buffer_steps``."""


@dataclass(frozen=True)
class ClusterSettings:
    """The fleet and the router's settings.

    Attributes:
        capacity_tokens: each replica's KV pool.
        backend: each replica's index (``make_index`` name).
        profile: step costs (default: the shipped default profile).
        seed: seeds the router and the faults.
        reservation_ttl: seconds before an open reservation is swept.
        check: check every admission against announced blocks (tests; slower).
        keep_tokens: replicas keep block tokens for dumps (off: hash-only dumps).
        closed_loop_tick_s: while a turn waits for its predecessor, the fleet advances
            by at most this (the turn is routed at most this late).
        slo: count goodput under this objective.

    Raises:
        ClusterSettingsError: a value of the wrong type or out of range.
    """

    num_replicas: int = 8
    capacity_tokens: int = 1 << 20
    backend: str = "hash_chain"
    block_size: int = DEFAULT_BLOCK_SIZE
    hash_seed: int = 0
    sim: SimSettings = field(default_factory=SimSettings)
    profile: CostProfile | None = None
    buffer_steps: int = DEFAULT_BUFFER_STEPS
    seed: int = 0
    reservation_ttl: float = 3600.0
    check: bool = False
    keep_tokens: bool = True
    closed_loop_tick_s: float = 0.05
    slo: Slo | None = None

    def __post_init__(self) -> None:
        for name, ok, want in self._checks():
            if not ok:
                value = getattr(self, name)
                raise ClusterSettingsError(f"{name} must be {want}, got {value!r:.60}")

    def _checks(self) -> Iterator[tuple[str, bool, str]]:
        """``(field, valid, what it must be)`` in order, lazily: the capacity's bound is
        computed only once the block size passed."""
        tick, ttl = self.closed_loop_tick_s, self.reservation_ttl
        yield "closed_loop_tick_s", _is_number(tick) and 0 < tick < 1e9, "a number > 0"
        yield self._int_in("num_replicas", MAX_REPLICAS)
        yield self._int_in("block_size", MAX_BLOCK_SIZE)
        yield self._int_in("buffer_steps", MAX_BUFFER_STEPS)
        yield self._int_in("capacity_tokens", MAX_BLOCKS * self.block_size)
        for name in ("hash_seed", "seed"):
            yield name, type(getattr(self, name)) is int, "an int"
        yield "reservation_ttl", _is_number(ttl) and 0 < ttl <= 1e9, "seconds in (0, 1e9]"
        yield "backend", isinstance(self.backend, str) and bool(self.backend), "an index name"
        yield "sim", isinstance(self.sim, SimSettings), "a SimSettings"
        for name, cls, what in (("slo", Slo, "an Slo"), ("profile", CostProfile, "a CostProfile")):
            yield name, isinstance(getattr(self, name), (cls, type(None))), what
        for name in ("check", "keep_tokens"):
            yield name, type(getattr(self, name)) is bool, "a bool"

    def _int_in(self, name: str, top: int) -> tuple[str, bool, str]:
        value = getattr(self, name)
        return name, type(value) is int and 1 <= value <= top, f"an int in [1, {top:,}]"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
