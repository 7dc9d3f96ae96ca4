"""A cluster run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixkv.adapters.lab.sim.config import SimConfig
from prefixkv.adapters.lab.sim.profile import CostProfile

from .errors import ClusterConfigError

__all__ = ["ClusterConfig"]


@dataclass(frozen=True)
class ClusterConfig:
    """The fleet and the router's settings.

    Attributes:
        num_replicas: replicas at the start.
        capacity_tokens: each replica's KV pool in tokens.
        backend: each replica's index (``make_index`` name).
        block_size: its block size (and the router's).
        hash_seed: the fleet's hash seed.
        sim: each replica's scheduler settings.
        profile: step costs (default: the shipped default profile).
        buffer_steps: event batches each replica keeps for replay.
        seed: seeds the router and the faults.
        reservation_ttl: seconds before an open reservation is swept.
        check: check every admission against announced blocks (tests; slower).
        keep_tokens: replicas keep block tokens for dumps (off: hash-only dumps).
        closed_loop_tick_s: while a session's turn waits for its predecessor, the
            fleet advances in steps of at most this: a turn is routed at most this
            late (never early).

    Raises:
        ClusterConfigError: a size out of range.
    """

    num_replicas: int = 8
    capacity_tokens: int = 1 << 20
    backend: str = "hash_chain"
    block_size: int = 16
    hash_seed: int = 0
    sim: SimConfig = field(default_factory=SimConfig)
    profile: CostProfile | None = None
    buffer_steps: int = 10_000
    seed: int = 0
    reservation_ttl: float = 3600.0
    check: bool = False
    keep_tokens: bool = True
    closed_loop_tick_s: float = 0.05

    def __post_init__(self) -> None:
        tick = self.closed_loop_tick_s
        if isinstance(tick, bool) or not isinstance(tick, (int, float)) or not 0 < tick < 1e9:
            raise ClusterConfigError(f"closed_loop_tick_s must be a number > 0, got {tick!r}")
        for name in ("num_replicas", "capacity_tokens", "block_size", "buffer_steps"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ClusterConfigError(f"{name} must be a positive int, got {value!r}")
