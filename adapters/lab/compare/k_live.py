"""K-live runs of a comparison: each backend replays the same requests at equal capacity.

Each backend replays through its natural driver (hash chain: the vLLM-shaped engine class,
radix: the SGLang-shaped one, anything else: the manager) with the same KV capacity
in tokens, at most K requests live. Hits and evictions come from one replay (with
boundary accounting, SPEC BB-8, when asked); index times from timed replays, each
request's time the least over them. A capacity sweep replays at several capacities.
Each run comes back as a :class:`~..sim.runs.RunRow`: a replay's with the parts
:class:`~..sim.runs.KLiveHits` and :class:`~..sim.runs.IndexTimes`, a sweep point's
with :class:`~..sim.runs.SweepHit`. A workload's requests are re-read on every run
(a trace is never held whole).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from prefixkv.indexes.registry import describe_index

from ..backends import BackendSpec, Bars, CapacityError, CompareError
from ..replay import ReplayError, ReplayResult, replay
from ..sim.metrics import RequestRow
from ..sim.runs import IndexTimes, KLiveHits, RunRow, SweepHit
from ..workloads import Workload

__all__ = [
    "percentile",
    "run_backend",
    "run_sweep",
    "select_strip_requests",
]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0 < q <= 100); 0.0 for no values."""
    if not len(values):
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def _replay(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    concurrency: int,
    track: bool,
    bars: Bars | None,
    what: str,
) -> tuple[ReplayResult, int]:
    index = spec.make()
    num_blocks = spec.num_blocks(capacity_tokens)
    if num_blocks < 1:
        raise ReplayError(f"{capacity_tokens} tokens hold no {spec.block_size}-token block")
    bar = (
        bars(f"{workload.name} {spec.label} {what}", workload.stats.prompt_tokens) if bars else None
    )
    try:
        result = replay(
            workload.requests,
            index,
            num_blocks,
            driver=spec.driver,
            concurrency=concurrency,
            track_boundaries=track,
            measure_memory=True,
            progress=None if bar is None else bar.update,
        )
    finally:
        if bar is not None:
            bar.close()
    # replay samples the index size only now and then; the end state is exact.
    measure = getattr(index, "memory_bytes", None)
    end_bytes = int(measure()) if measure is not None else 0
    return result, max(result.index_memory_bytes, end_bytes)


def _min_us(columns: Sequence[Sequence[float]]) -> list[float]:
    stacked = np.vstack([np.asarray(c, dtype=np.float64) for c in columns])
    return (stacked.min(axis=0) * 1e6).tolist()  # type: ignore[no-any-return]


def run_backend(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    *,
    concurrency: int = 1,
    timing_repeats: int = 3,
    boundary_accounting: bool = True,
    bars: Bars | None = None,
) -> RunRow:
    """Replay with boundary accounting (BB-8), then ``timing_repeats`` times without it.

    Hits and evictions come from the first replay; index times from the others (the
    token-level mirror behind the accounting costs time inside the index calls),
    each request's time being its minimum over the repeats (the replay collects
    garbage only between requests): what remains is the index's own cost, not a
    neighbour process's time slice or a collection of everyone's garbage. With
    ``timing_repeats=0`` the times come from the first replay (accounting
    included). Without ``boundary_accounting`` there are ``max(1, timing_repeats)``
    replays, all timed, and the BB-8 columns are zero.

    Raises:
        CapacityError: the capacity cannot hold the requests.
        CompareError: ``timing_repeats`` is not an int >= 0.
        ReplayInterrupted: Ctrl-C (from :func:`replay`).
    """
    if type(timing_repeats) is not int or timing_repeats < 0:
        raise CompareError(f"timing repeats must be an int >= 0, got {timing_repeats!r}")
    try:
        first, memory, timed = _replays(
            workload, spec, capacity_tokens, concurrency, timing_repeats, boundary_accounting, bars
        )
    except ReplayError as exc:
        raise CapacityError(
            f"capacity {capacity_tokens} tokens ({spec.num_blocks(capacity_tokens)} × "
            f"{spec.block_size}-token blocks) is too small for {workload.name!r} with "
            f"{spec.label} at concurrency {concurrency}: {exc}"
        ) from None
    labels = {
        **spec.run_labels(workload.name, "k_live", "table", capacity_tokens),
        "driver": spec.driver,
        "concurrency": concurrency,
    }
    rows = _request_rows(first, timed)
    hits = _hits(first, rows, memory, spec.block_size, boundary_accounting)
    return RunRow(labels, (hits, _index_times(first, timed, rows, timing_repeats)), rows)


def _hits(
    first: ReplayResult, rows: Sequence[RequestRow], memory: int, bs: int, boundary_accounting: bool
) -> KLiveHits:
    """The hit accounting of the first replay (``bs``: the block size)."""
    prompt, hit = first.total_prompt_tokens, first.total_hit_tokens
    return KLiveHits(
        num_requests=first.num_requests,
        prompt_tokens=prompt,
        hit_tokens=hit,
        hit_ratio=hit / prompt if prompt else 0.0,
        boundary_accounting=boundary_accounting,
        matched_tokens=sum(r.matched_tokens for r in rows),
        boundary_lost_tokens=sum(r.boundary_lost_tokens for r in rows),
        cap_lost_tokens=sum(r.cap_lost_tokens for r in rows),
        evicted_blocks=first.evicted_blocks,
        evicted_tokens=first.evicted_blocks * bs,
        peak_cached_blocks=first.peak_cached_blocks,
        peak_cached_tokens=first.peak_cached_blocks * bs,
        index_memory_bytes=memory,
    )


def _index_times(
    first: ReplayResult, timed: Sequence[ReplayResult], rows: Sequence[RequestRow], repeats: int
) -> IndexTimes:
    """The index times of the timed replays (each request's the least of them, in ``rows``)."""
    index_us = [r.index_us for r in rows]
    admit_us = [r.admit_us for r in rows]
    return IndexTimes(
        index_us_p50=percentile(index_us, 50),
        index_us_p99=percentile(index_us, 99),
        index_us_mean=sum(index_us) / len(index_us) if index_us else 0.0,
        admit_us_p50=percentile(admit_us, 50),
        admit_us_p99=percentile(admit_us, 99),
        timing_repeats=repeats,
        timing_runs_agree=all(t.hit_tokens == first.hit_tokens for t in timed),
        wall_seconds_tracked=first.wall_seconds,
        wall_seconds_timed=tuple(t.wall_seconds for t in timed),
        seconds_by_call=dict(min(timed, key=lambda t: t.wall_seconds).seconds_by_call),
    )


def _replays(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    concurrency: int,
    timing_repeats: int,
    boundary_accounting: bool,
    bars: Bars | None,
) -> tuple[ReplayResult, int, list[ReplayResult]]:
    """The first replay (hits, evictions, memory) and the timed ones (never empty)."""
    # With accounting, one tracked replay then the timed ones; without, the first
    # timed replay gives the hits too.
    extra = timing_repeats if boundary_accounting else max(0, timing_repeats - 1)
    runs = 1 + extra
    args = (workload, spec, capacity_tokens, concurrency)
    first, memory = _replay(*args, boundary_accounting, bars, f"1/{runs}")
    timed = [_replay(*args, False, bars, f"{k + 2}/{runs}")[0] for k in range(extra)]
    if not boundary_accounting or not timed:
        timed.insert(0, first)
    return first, memory, timed


def _request_rows(first: ReplayResult, timed: Sequence[ReplayResult]) -> list[RequestRow]:
    """One row per request: hits from ``first``, times the least over ``timed``."""
    n = first.num_requests
    zeros = [0] * n

    def column(values: Sequence[int]) -> list[int]:
        return list(values) if len(values) == n else zeros

    return [
        RequestRow(
            rid,
            prompt_tokens=prompt,
            hit_tokens=hit,
            matched_tokens=matched,
            boundary_lost_tokens=boundary,
            cap_lost_tokens=cap,
            index_us=index,
            admit_us=admit,
        )
        for rid, prompt, hit, matched, boundary, cap, index, admit in zip(
            first.ids,
            first.prompt_len.tolist(),
            first.hit_tokens.tolist(),
            column(first.matched_tokens),
            column(first.boundary_lost_tokens),
            column(first.cap_lost_tokens),
            _min_us([t.request_seconds for t in timed]),
            _min_us([t.admit_seconds for t in timed]),
            strict=True,
        )
    ]


def run_sweep(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacities: Sequence[int],
    *,
    concurrency: int = 1,
    bars: Bars | None = None,
) -> list[RunRow]:
    """Hit ratio (and evictions) of each backend at each capacity, without accounting.

    A capacity a backend cannot run at gives ``None`` for it. Points come capacity
    by capacity, backends in order.
    """
    points: list[RunRow] = []
    for cap in capacities:
        for spec in backends:
            ratio: float | None = None
            evicted: int | None = None
            try:
                result, _ = _replay(
                    workload, spec, cap, concurrency, False, bars, f"sweep {cap:,} tok"
                )
                ratio, evicted = result.summary()["hit_ratio"], result.evicted_blocks
            except ReplayError:
                pass
            labels = {
                **spec.run_labels(workload.name, "k_live", "sweep", cap, options=False),
                "concurrency": concurrency,
            }
            points.append(RunRow(labels, (SweepHit(ratio, evicted),)))
    return points


def select_strip_requests(results: Sequence[RunRow], limit: int = 6) -> list[int]:
    """Positions of a few telling requests for the strip plot, in arrival order.

    First those where some backend lost tokens to a block boundary, then those where
    the backends' hits differ, then those with a recomputed last block, then the rest.
    Complexity: O(requests * backends), one pass per criterion.
    """
    per = [r.requests for r in results]
    n = len(per[0]) if per else 0
    indexes = [r.labels["index"] for r in results]
    cached = [p for p, i in zip(per, indexes, strict=True) if describe_index(i).caches] or per

    def boundary(i: int) -> bool:
        return any(p[i].boundary_lost_tokens for p in cached)

    def differ(i: int) -> bool:
        return len({p[i].hit_tokens for p in cached}) > 1

    def capped(i: int) -> bool:
        return any(p[i].cap_lost_tokens for p in cached)

    chosen: list[int] = []
    taken: set[int] = set()
    for test in (boundary, differ, capped, lambda _i: True):
        for i in range(n):
            if len(chosen) >= limit:
                return sorted(chosen)
            if i not in taken and test(i):
                chosen.append(i)
                taken.add(i)
    return sorted(chosen)
