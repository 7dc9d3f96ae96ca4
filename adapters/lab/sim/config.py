"""Scheduler settings of the simulated replica, validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from .errors import SimSettingsError

__all__ = [
    "BATCHING_MODES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_MAX_NUM_SEQS",
    "QUEUE_ORDERS",
    "Batching",
    "QueueOrder",
    "SimSettings",
]

DEFAULT_BLOCK_SIZE = 16
"""The lab's default tokens per block (vLLM's ``--block-size`` on GPUs)."""

DEFAULT_MAX_NUM_SEQS = 256
"""The lab's default for most running requests (``vllm serve``'s ``max_num_seqs``)."""

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
"""The lab's default step token budget (vLLM's ``max_num_batched_tokens`` on an H100)."""

QueueOrder = Literal["fcfs", "lpm"]
"""A waiting-queue order: first come first served, or SGLang's longest prefix match."""
QUEUE_ORDERS: tuple[QueueOrder, ...] = ("fcfs", "lpm")
"""The known waiting-queue orders (``SimSettings.queue_order``)."""

Batching = Literal["mixed", "prefill_first"]
BATCHING_MODES: tuple[Batching, ...] = ("mixed", "prefill_first")
"""vLLM v1 mixes prefill chunks and decode rows in a step; SGLang prefills first."""


@dataclass(frozen=True, slots=True)
class SimSettings:
    """How the replica schedules: vLLM's knobs, the waiting queue's order and whether a
    step mixes prefill chunks with decode rows; ``check_invariants`` after every step.

    Raises:
        SimSettingsError: a size out of range, an unknown queue order or batching.
    """

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    queue_order: QueueOrder = "fcfs"
    batching: Batching = "mixed"
    check_invariants: bool = False

    def __post_init__(self) -> None:
        # At most 2**20 running requests; a step budget is an int32 in the engines.
        for name, top in (("max_num_seqs", 2**20), ("max_num_batched_tokens", 2**31 - 1)):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= top:
                raise SimSettingsError(f"{name} must be an int in [1, {top:,}], got {value!r:.60}")
        for what, value, known in (
            ("queue order", self.queue_order, QUEUE_ORDERS),
            ("batching", self.batching, BATCHING_MODES),
        ):
            if value not in known:
                raise SimSettingsError(f"unknown {what} {value!r}; known: {', '.join(known)}")
        for name in ("enable_chunked_prefill", "check_invariants"):
            if type(getattr(self, name)) is not bool:
                raise SimSettingsError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as a flat dict (for tables); the queue order's column is ``policy``."""
        return {
            "policy" if name == "queue_order" else name: value
            for name, value in asdict(self).items()
            if name != "check_invariants"
        }
