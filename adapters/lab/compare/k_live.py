"""K-live runs of a comparison: each backend replays the same requests through its natural
driver at equal capacity, at most K requests live.

Hits and evictions come from one replay (with boundary accounting, SPEC BB-8, when asked),
index times from timed replays, each request's the least over them. A workload's requests
are re-read on every run (a trace is never held whole).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from prefixkv.indexes.registry import describe_index

from ..backends import BackendSpec, Bars, CapacityError, CompareError
from ..replay import ReplayError, ReplayResult, replay
from ..sim.metrics import RequestRow
from ..sim.runs import IndexTimes, KLiveHits, RunRow, SweepHit
from ..workloads import Workload

__all__ = ["percentile", "run_backend", "run_sweep", "select_strip_requests"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0 < q <= 100); 0.0 for no values."""
    if not len(values):
        return 0.0
    ordered = sorted(values)
    return float(ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1])


def _replay(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    concurrency: int,
    track: bool,
    bars: Bars | None,
    what: str,
) -> tuple[ReplayResult, int]:
    """One replay and the index's peak bytes."""
    index = spec.make()
    num_blocks = spec.num_blocks(capacity_tokens)
    if num_blocks < 1:
        raise ReplayError(f"{capacity_tokens} tokens hold no {spec.block_size}-token block")
    desc = f"{workload.name} {spec.label} {what}"
    bar = bars(desc, workload.stats.prompt_tokens) if bars else None
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
    # The replay samples the index's size now and then; the end state is exact.
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

    Hits come from the first replay, index times from the others (each request's the least
    over them; with ``timing_repeats=0``, from the first). Without ``boundary_accounting``
    there are ``max(1, timing_repeats)`` replays, all timed, and the BB-8 columns are zero.

    Raises:
        CapacityError: the capacity cannot hold the requests.
        CompareError: ``timing_repeats`` is not an int >= 0.
        ReplayInterrupted: Ctrl-C.
    """
    if type(timing_repeats) is not int or timing_repeats < 0:
        raise CompareError(f"timing repeats must be an int >= 0, got {timing_repeats!r}")
    # With accounting, one tracked replay then the timed ones; without, the first timed
    # replay gives the hits too.
    extra = timing_repeats if boundary_accounting else max(0, timing_repeats - 1)
    args = (workload, spec, capacity_tokens, concurrency)
    try:
        first, memory = _replay(*args, boundary_accounting, bars, f"1/{1 + extra}")
        timed = [_replay(*args, False, bars, f"{k + 2}/{1 + extra}")[0] for k in range(extra)]
    except ReplayError as exc:
        raise CapacityError(
            f"capacity {capacity_tokens} tokens ({spec.num_blocks(capacity_tokens)} × "
            f"{spec.block_size}-token blocks) is too small for {workload.name!r} with "
            f"{spec.label} at concurrency {concurrency}: {exc}"
        ) from None
    if not boundary_accounting or not timed:
        timed.insert(0, first)
    labels = {
        **spec.run_labels(workload.name, "k_live", "table", capacity_tokens),
        "driver": spec.driver,
        "concurrency": concurrency,
    }
    rows = _request_rows(first, timed)
    return RunRow(
        labels,
        _parts(first, timed, rows, memory, spec.block_size, timing_repeats, boundary_accounting),
        rows,
    )


def _parts(
    first: ReplayResult,
    timed: Sequence[ReplayResult],
    rows: Sequence[RequestRow],
    memory: int,
    bs: int,
    repeats: int,
    boundary_accounting: bool,
) -> tuple[KLiveHits, IndexTimes]:
    """The first replay's hits and the timed replays' index times."""
    prompt, hit = first.total_prompt_tokens, first.total_hit_tokens
    index_us, admit_us = [r.index_us for r in rows], [r.admit_us for r in rows]
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
    ), IndexTimes(
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


def _request_rows(first: ReplayResult, timed: Sequence[ReplayResult]) -> list[RequestRow]:
    """One row per request: hits from ``first``, times the least over ``timed``."""
    n = first.num_requests

    def column(values: Sequence[int]) -> list[int]:
        return list(values) if len(values) == n else [0] * n

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
    """Hit ratio and evictions of each backend at each capacity, without accounting
    (``None`` where a backend cannot run), capacity by capacity."""
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
    """Positions of a few telling requests for the strip plot, in arrival order: first
    those with tokens lost to a block boundary, then those whose hits differ between
    backends, then those with a recomputed last block, then the rest."""
    per = [r.requests for r in results]
    n = len(per[0]) if per else 0
    indexes = [r.labels["index"] for r in results]
    cached = [p for p, i in zip(per, indexes, strict=True) if describe_index(i).caches] or per
    tests: tuple[Callable[[int], bool], ...] = (
        lambda i: any(p[i].boundary_lost_tokens for p in cached),
        lambda i: len({p[i].hit_tokens for p in cached}) > 1,
        lambda i: any(p[i].cap_lost_tokens for p in cached),
        lambda _i: True,
    )
    chosen: list[int] = []
    for test in tests:
        for i in range(n):
            if len(chosen) >= limit:
                return sorted(chosen)
            if i not in chosen and test(i):
                chosen.append(i)
    return sorted(chosen)
