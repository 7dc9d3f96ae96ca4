"""Where a comparison's requests come from: built-in workloads, the seed example, traces.

The seed example is the seed document's three requests (SPEC BB-2, BB-3); the other
names are the generators of :mod:`prefixkv.adapters.lab.workloads` at their default sizes.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .progress import progress
from .traces import (
    ReadSettings,
    TraceFormat,
    TraceOptionError,
    TraceRequest,
    TraceSource,
    TraceStats,
    make_request,
    open_trace,
    stats_of,
)
from .workloads import WORKLOADS, UnknownWorkloadError, WorkloadError, make_workload

__all__ = [
    "DEFAULT_WORKLOADS",
    "SEED_WORKLOAD",
    "Workload",
    "load_workloads",
    "seed_example",
    "trace_workload",
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
    """Requests to compare on, where they came from, and their sizes.

    Attributes:
        name: workload name or trace file name.
        source: how it was made (generator call, or the trace and its format).
        requests: the requests in arrival order, re-iterable: a list for built-in
            workloads, a :class:`~prefixkv.adapters.lab.traces.TraceSource` (read
            again on each pass, never held whole) for traces.
        stats: counts and sizes, from a scan (traces) or the list.
        notes: what the report must say about it (a hash-id trace's granularity).
        path: the trace file, ``None`` for built-in workloads.
        tokens_per_id: a hash-id trace's tokens per id (its sharing granularity);
            ``None`` for token traces and built-in workloads.
        rejected_requests: requests left out for their length
            (:func:`~prefixkv.adapters.lab.admission.admit`), as vLLM refuses them.
    """

    name: str
    source: str
    requests: Iterable[TraceRequest]
    stats: TraceStats
    notes: tuple[str, ...] = ()
    path: str | None = None
    tokens_per_id: int | None = None
    rejected_requests: int = 0


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
        make_request("A", a, draw(4)),
        make_request("B", a[:30] + fresh, draw(4)),
        make_request("A-again", a, draw(4)),
    ]


def workload_names() -> list[str]:
    """Every name ``--workload`` accepts."""
    return sorted([*WORKLOADS, SEED_WORKLOAD])


def trace_workload(source: TraceSource, trace: str, *, quiet: bool = True) -> Workload:
    """An opened trace as a workload: scanned once (sizes only, every request
    validated) with a progress bar over its bytes.

    Raises:
        TraceFormatError: a malformed trace (the message names file and line).
        OSError: the trace cannot be read.
    """
    bar = progress(source.input_bytes(), "loading", quiet=quiet, unit="B")
    try:
        stats = source.scan(bar.update)
    finally:
        bar.close()
    notes = tuple(n for n in (source.order_note(), source.granularity_note()) if n)
    name = os.path.basename(os.path.normpath(trace))
    return Workload(
        name,
        f"{trace} ({source.describe()})",
        source,
        stats,
        notes,
        str(trace),
        source.tokens_per_id,
    )


def load_workloads(
    names: Sequence[str] | None,
    trace: str | None,
    *,
    max_requests: int | None = None,
    tokens_per_id: int | None = None,
    seed: int = 0,
    trace_format: TraceFormat | None = None,
    settings: ReadSettings | None = None,
    quiet: bool = True,
) -> list[Workload]:
    """Build the workloads of a comparison: named generators, or one trace.

    A trace is opened as a stream and scanned once (sizes only, every request
    validated) with a progress bar over its bytes.

    Args:
        names: generator names (``None`` and no trace: :data:`DEFAULT_WORKLOADS`).
        trace: a trace file or folder instead (any format :func:`open_trace` reads).
        max_requests: keep the first this many requests of each.
        tokens_per_id: hash-id traces: tokens each id expands to (default: the
            format's block size).
        seed: generator seed, and the hash-id traces' token seed.
        trace_format: the trace's format (default: detected).
        settings: the trace reader's settings (limits, vocabulary, outputs); its
            ``tokens_per_id`` and ``seed`` are replaced by the arguments above.
        quiet: no progress bar.

    Raises:
        WorkloadError: both a trace and names, a bad ``max_requests``.
        UnknownWorkloadError: a name that is neither a generator nor ``seed``.
        TraceOptionError: ``tokens_per_id`` without a hash-id trace.
        TraceFormatError: a malformed trace (the message names file and line).
        OSError: the trace cannot be read.
    """
    if max_requests is not None and (type(max_requests) is not int or max_requests < 1):
        raise WorkloadError(f"max_requests must be a positive int, got {max_requests!r}")
    if trace is not None:
        if names:
            raise WorkloadError(f"give workloads or a trace, not both: {list(names)} and {trace}")
        base = ReadSettings() if settings is None else settings
        opts = dataclasses.replace(base, tokens_per_id=tokens_per_id, seed=seed)
        source = open_trace(trace, trace_format, max_requests=max_requests, settings=opts)
        return [trace_workload(source, trace, quiet=quiet)]
    if tokens_per_id is not None:
        raise TraceOptionError(
            f"tokens_per_id={tokens_per_id} applies to hash-id traces (--trace) only"
        )
    out: list[Workload] = []
    for name in names or DEFAULT_WORKLOADS:
        if not any(w.name == name for w in out):
            out.append(_generated_workload(name, seed, max_requests))
    return out


def _generated_workload(name: str, seed: int, max_requests: int | None) -> Workload:
    """A built-in generator's requests (or the seed example), the first ``max_requests``."""
    if name == SEED_WORKLOAD:
        requests = seed_example(seed)
        source_text = f"seed document example (seed={seed})"
    else:
        if name not in WORKLOADS:
            raise UnknownWorkloadError(
                f"unknown workload {name!r}; known: {', '.join(workload_names())}"
            )
        requests = make_workload(name, seed=seed)
        source_text = f"{name}(seed={seed}), default sizes"
    kept = requests[:max_requests]
    return Workload(name, source_text, kept, stats_of(kept))
