"""A cluster run's settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixkv.adapters.lab.sim.config import DEFAULT_BLOCK_SIZE, SimSettings
from prefixkv.adapters.lab.sim.load import Slo
from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.indexes.validation import MAX_BLOCK_SIZE, MAX_BLOCKS

from .errors import ClusterSettingsError

__all__ = ["DEFAULT_BUFFER_STEPS", "MAX_BUFFER_STEPS", "MAX_REPLICAS", "ClusterSettings"]

MAX_REPLICAS = 1024
"""The most replicas a simulated fleet starts with. Routers in production front tens to
hundreds of engines; each simulated replica holds a KV pool, an index and a scheduler,
so a fleet of a million would run out of memory (or time) before its first request."""

MAX_BUFFER_STEPS = 2**24
"""The most event batches a replica keeps for replay."""

DEFAULT_BUFFER_STEPS = 10_000
"""Event batches a replica keeps for replay by default: vLLM's ``KVEventsConfig.buffer_steps``
(its ``ZmqEventPublisher``'s replay buffer)."""


@dataclass(frozen=True)
class ClusterSettings:
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
        slo: count goodput under this objective (``None``: no goodput).

    Raises:
        ClusterSettingsError: a value of the wrong type or out of range: at most
            :data:`MAX_REPLICAS` replicas and :data:`MAX_BUFFER_STEPS` buffered
            batches, a pool of at most ``MAX_BLOCKS`` blocks of at most
            ``MAX_BLOCK_SIZE`` tokens, a ``reservation_ttl`` in (0, 1e9] seconds, a
            ``closed_loop_tick_s`` in (0, 1e9).
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
        ):
            _check_int(name, getattr(self, name), top)
        _check_int("capacity_tokens", self.capacity_tokens, MAX_BLOCKS * self.block_size)
        for name in ("hash_seed", "seed"):
            if type(getattr(self, name)) is not int:
                raise ClusterSettingsError(
                    f"{name} must be an int, got {getattr(self, name)!r:.60}"
                )
        ttl = self.reservation_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= 1e9:
            raise ClusterSettingsError(
                f"reservation_ttl must be seconds in (0, 1e9], got {ttl!r:.60}"
            )
        if not isinstance(self.backend, str) or not self.backend:
            raise ClusterSettingsError(f"backend must be an index name, got {self.backend!r:.60}")
        if not isinstance(self.sim, SimSettings):
            raise ClusterSettingsError(f"sim must be a SimSettings, got {self.sim!r:.60}")
        if self.slo is not None and not isinstance(self.slo, Slo):
            raise ClusterSettingsError(f"slo must be an Slo, got {self.slo!r:.60}")
        if self.profile is not None and not isinstance(self.profile, CostProfile):
            raise ClusterSettingsError(f"profile must be a CostProfile, got {self.profile!r:.60}")
        for name in ("check", "keep_tokens"):
            if type(getattr(self, name)) is not bool:
                raise ClusterSettingsError(
                    f"{name} must be a bool, got {getattr(self, name)!r:.60}"
                )


def _check_int(name: str, value: object, top: int) -> None:
    if type(value) is not int or not 1 <= value <= top:
        raise ClusterSettingsError(f"{name} must be an int in [1, {top:,}], got {value!r:.60}")
