"""A cluster run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixkv.adapters.lab.sim.config import DEFAULT_BLOCK_SIZE, SimSettings
from prefixkv.adapters.lab.sim.load import Slo
from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.indexes.validation import MAX_BLOCK_SIZE, MAX_BLOCKS

from .errors import ClusterSettingsError

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
        tick = self.closed_loop_tick_s
        if isinstance(tick, bool) or not isinstance(tick, (int, float)) or not 0 < tick < 1e9:
            raise ClusterSettingsError(f"closed_loop_tick_s must be a number > 0, got {tick!r:.60}")
        for name, top in (
            ("num_replicas", MAX_REPLICAS),
            ("block_size", MAX_BLOCK_SIZE),
            ("buffer_steps", MAX_BUFFER_STEPS),
            ("capacity_tokens", 0),  # checked once the block size is
        ):
            value, top = getattr(self, name), top or MAX_BLOCKS * self.block_size
            if type(value) is not int or not 1 <= value <= top:
                raise ClusterSettingsError(
                    f"{name} must be an int in [1, {top:,}], got {value!r:.60}"
                )
        for name in ("hash_seed", "seed"):
            if type(value := getattr(self, name)) is not int:
                raise ClusterSettingsError(f"{name} must be an int, got {value!r:.60}")
        ttl = self.reservation_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 1e9:
            raise ClusterSettingsError(
                f"reservation_ttl must be seconds in (0, 1e9], got {ttl!r:.60}"
            )
        if not isinstance(self.backend, str) or not self.backend:
            raise ClusterSettingsError(f"backend must be an index name, got {self.backend!r:.60}")
        for name, cls, what in (
            ("sim", SimSettings, "a SimSettings"),
            ("slo", Slo, "an Slo"),
            ("profile", CostProfile, "a CostProfile"),
        ):
            value = getattr(self, name)
            if not isinstance(value, cls) and (value is not None or name == "sim"):
                raise ClusterSettingsError(f"{name} must be {what}, got {value!r:.60}")
        for name in ("check", "keep_tokens"):
            if type(value := getattr(self, name)) is not bool:
                raise ClusterSettingsError(f"{name} must be a bool, got {value!r:.60}")
