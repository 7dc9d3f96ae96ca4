"""Scheduler settings of the simulated engine replica, validated on construction.

The knobs are vLLM's (``max_num_seqs``, ``max_num_batched_tokens``,
``enable_chunked_prefill``) plus the two that tell vLLM's and SGLang's schedulers
apart: the waiting queue's order (``queue_order``, a :data:`~.queue_order.QueueOrder`)
and whether a step mixes prefill
chunks with decode rows (``batching``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from .errors import SimSettingsError
from .queue_order import QUEUE_ORDERS, QueueOrder

__all__ = [
    "BATCHING_MODES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "DEFAULT_MAX_NUM_SEQS",
    "MAX_NUM_BATCHED_TOKENS",
    "MAX_NUM_SEQS",
    "Batching",
    "SimSettings",
]

DEFAULT_BLOCK_SIZE = 16
"""The lab's default tokens per block: vLLM's ``--block-size`` (``CacheConfig``) on
GPUs, which prefixkv's hash chain also defaults to. Every default the lab states
reads this one."""

DEFAULT_MAX_NUM_SEQS = 256
"""The lab's default for most running requests: ``vllm serve``'s ``max_num_seqs`` on
GPUs under 70 GiB and on an A100 (vLLM's ``EngineArgs.get_batch_defaults``; 1024 on
an H100/H200). SGLang sizes ``max_running_requests`` from its pool instead. Every
default the lab states (settings, flags, their help) reads this one."""

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
"""The lab's default step token budget: ``vllm serve``'s ``max_num_batched_tokens``
on an H100/H200 (``EngineArgs.get_batch_defaults``; 2048 on an A100 or smaller GPU)
and SGLang's ``chunked_prefill_size`` on 80 GB GPUs (``ServerArgs``). Every default
the lab states reads this one."""

MAX_NUM_SEQS = 2**20
"""The most running requests a replica may be given (the default:
:data:`DEFAULT_MAX_NUM_SEQS`)."""

MAX_NUM_BATCHED_TOKENS = 2**31 - 1
"""The largest step token budget (an int32 in the engines; the default:
:data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`)."""

Batching = Literal["mixed", "prefill_first"]
BATCHING_MODES: tuple[Batching, ...] = ("mixed", "prefill_first")
"""vLLM v1 mixes prefill chunks and decode rows in a step; SGLang (without
``--enable-mixed-chunk``) runs a prefill-only step whenever it can admit, else a
decode step."""


@dataclass(frozen=True, slots=True)
class SimSettings:
    """How the replica schedules.

    Attributes:
        max_num_seqs: most requests running at once (vLLM ``max_num_seqs``, SGLang
            ``max_running_requests``); default :data:`DEFAULT_MAX_NUM_SEQS`.
        max_num_batched_tokens: most tokens computed in one step (vLLM
            ``max_num_batched_tokens``; SGLang's ``chunked_prefill_size`` for a
            prefill step); default :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`.
        enable_chunked_prefill: a prefill may take what is left of a step's budget
            and continue next step; without it a prefill runs whole or waits.
        queue_order: the waiting queue's order, ``"fcfs"`` or ``"lpm"`` (SGLang's
            cache-aware order).
        batching: ``"mixed"`` (vLLM v1) or ``"prefill_first"`` (SGLang).
        check_invariants: run the seat's ``check_invariants()`` after every step
            (tests; O(cached blocks) a step).

    Raises:
        SimSettingsError: a size out of range (``max_num_seqs`` up to
            :data:`MAX_NUM_SEQS`, ``max_num_batched_tokens`` up to
            :data:`MAX_NUM_BATCHED_TOKENS`), an unknown queue order or batching mode.
    """

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    enable_chunked_prefill: bool = True
    queue_order: QueueOrder = "fcfs"
    batching: Batching = "mixed"
    check_invariants: bool = False

    def __post_init__(self) -> None:
        for name, top in (
            ("max_num_seqs", MAX_NUM_SEQS),
            ("max_num_batched_tokens", MAX_NUM_BATCHED_TOKENS),
        ):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= top:
                raise SimSettingsError(f"{name} must be an int in [1, {top:,}], got {value!r:.60}")
        if self.queue_order not in QUEUE_ORDERS:
            raise SimSettingsError(
                f"unknown queue order {self.queue_order!r}; known: {', '.join(QUEUE_ORDERS)}"
            )
        if self.batching not in BATCHING_MODES:
            raise SimSettingsError(
                f"unknown batching {self.batching!r}; known: {', '.join(BATCHING_MODES)}"
            )
        for name in ("enable_chunked_prefill", "check_invariants"):
            if type(getattr(self, name)) is not bool:
                raise SimSettingsError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def as_dict(self) -> dict[str, Any]:
        """The settings as a flat dict (for tables). The queue order's column is
        ``policy``, the engines' flag name (vLLM's ``--scheduling-policy``)."""
        return {
            "policy" if name == "queue_order" else name: value
            for name, value in asdict(self).items()
            if name != "check_invariants"
        }
