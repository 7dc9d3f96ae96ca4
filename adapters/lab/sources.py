"""Where a comparison's requests come from: built-in workloads, the seed example, traces.

The seed example is the seed document's three requests (SPEC BB-2, BB-3); the other
names are the generators of :mod:`prefixkv.adapters.lab.workloads` at their default sizes.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

from .traces import TraceOptionError, TraceRequest, load_any
from .workloads import WORKLOADS, UnknownWorkloadError, WorkloadError, make_workload

__all__ = [
    "DEFAULT_WORKLOADS",
    "SEED_WORKLOAD",
    "Workload",
    "load_workloads",
    "seed_example",
    "workload_names",
]

SEED_WORKLOAD = "seed"
"""The seed document's example: A (80 tokens), B = A[:30] + 50 new, A again."""

DEFAULT_WORKLOADS: tuple[str, ...] = (
    SEED_WORKLOAD,
    "shared_system_prompt",
    "multi_turn",
    "tree_of_thought",
    "few_shot",
)
"""What ``prefixkv compare`` runs when neither a workload nor a trace is named."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests to compare on, and where they came from.

    Attributes:
        name: workload name or trace file name.
        source: how it was made (generator call or path).
        requests: the requests, in arrival order.
    """

    name: str
    source: str
    requests: list[TraceRequest]


def seed_example(seed: int = 0, *, vocab_size: int = 32000) -> list[TraceRequest]:
    """The seed document's example (SPEC BB-2, BB-3) as three requests.

    ``A`` is 80 random tokens, ``B`` is ``A[:30]`` followed by 50 new tokens (the
    first of them differs from ``A[30]``), then ``A`` again. At block size 16 the
    hash chain hits 16 of B (tokens 16..29 are recomputed) and 64 of A again; the
    radix tree at page size 1 hits 30 and 79. Each request decodes 4 tokens.
    """
    rng = random.Random(seed)

    def draw(n: int) -> list[int]:
        return [rng.randrange(1, vocab_size) for _ in range(n)]

    a = draw(80)
    fresh = draw(50)
    while fresh[0] == a[30]:
        fresh[0] = rng.randrange(1, vocab_size)
    return [
        TraceRequest("A", a, draw(4)),
        TraceRequest("B", a[:30] + fresh, draw(4)),
        TraceRequest("A-again", list(a), draw(4)),
    ]


def workload_names() -> list[str]:
    """Every name ``--workload`` accepts."""
    return sorted([*WORKLOADS, SEED_WORKLOAD])


def load_workloads(
    names: Sequence[str] | None,
    trace: str | None,
    *,
    max_requests: int | None = None,
    scale_block: int | None = None,
    seed: int = 0,
) -> list[Workload]:
    """Build the workloads of a comparison: named generators, or one trace file.

    Args:
        names: generator names (``None`` and no trace: :data:`DEFAULT_WORKLOADS`).
        trace: a prefixkv or Mooncake JSONL file instead.
        max_requests: keep the first this many requests of each.
        scale_block: Mooncake tokens per hash id (traces only).
        seed: generator seed, and the Mooncake token seed.

    Raises:
        WorkloadError: both a trace and names, an empty trace, a bad ``max_requests``.
        UnknownWorkloadError: a name that is neither a generator nor ``seed``.
        TraceOptionError: ``scale_block`` without a trace, or for a prefixkv trace.
        TraceFormatError: a malformed trace line (the message names the line).
        OSError: the trace cannot be read.
    """
    if max_requests is not None and (type(max_requests) is not int or max_requests < 1):
        raise WorkloadError(f"max_requests must be a positive int, got {max_requests!r}")
    if trace is not None:
        if names:
            raise WorkloadError(f"give workloads or a trace, not both: {list(names)} and {trace}")
        requests = load_any(trace, max_requests=max_requests, scale_block=scale_block, seed=seed)
        if not requests:
            raise WorkloadError(f"trace {trace} holds no request")
        return [Workload(os.path.basename(trace), trace, requests)]
    if scale_block is not None:
        raise TraceOptionError(
            f"scale_block={scale_block} applies to Mooncake traces (--trace) only"
        )
    out: list[Workload] = []
    for name in names or DEFAULT_WORKLOADS:
        if any(w.name == name for w in out):
            continue
        if name == SEED_WORKLOAD:
            requests = seed_example(seed)
            source = f"seed document example (seed={seed})"
        else:
            if name not in WORKLOADS:
                raise UnknownWorkloadError(
                    f"unknown workload {name!r}; known: {', '.join(workload_names())}"
                )
            requests = make_workload(name, seed=seed)
            source = f"{name}(seed={seed}), default sizes"
        out.append(Workload(name, source, requests[:max_requests]))
    return out
