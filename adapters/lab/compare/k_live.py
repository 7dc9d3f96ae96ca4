"""K-live runs of a comparison: each backend replays the same requests at equal capacity.

Each backend replays through its natural driver (hash chain: the vLLM-shaped engine class,
radix: the SGLang-shaped one, anything else: the manager) with the same KV capacity
in tokens, at most K requests live. Hits and evictions come from one replay (with
boundary accounting, SPEC BB-8, when asked); index times from timed replays, each
request's time the least over them. A capacity sweep replays at several capacities.
The numbers come back as typed records whose ``row()`` and ``request_rows()`` give
the flat records of the tidy tables. A workload's requests are re-read on every run
(a trace is never held whole).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from prefixkv.indexes.registry import describe_index

from ..replay import Driver, ReplayError, ReplayResult, replay
from ..sim.metrics import RequestRow, request_table
from ..workloads import Workload
from .spec import BackendSpec, Bars, CapacityError, CompareError, Scalar

__all__ = [
    "BackendRun",
    "SweepPoint",
    "options_text",
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


@dataclass(frozen=True, slots=True)
class BackendRun:
    """One backend's K-live replay of one workload at the comparison's capacity.

    Hits and evictions come from the first replay (with boundary accounting when
    asked), index times from the timed replays (see :func:`run_backend`).

    Attributes:
        workload: the workload's name.
        backend, index, driver, block_size: which backend, driven how.
        options: its ``make_index`` options.
        capacity_tokens: the capacity asked for (the same for every backend).
        num_blocks, pool_tokens: the pool: the whole blocks that fit, and their tokens.
        concurrency: the K of the K-live schedule.
        num_requests, prompt_tokens, hit_tokens, hit_ratio: the totals.
        boundary_accounting: whether the BB-8 columns were measured.
        matched_tokens, boundary_lost_tokens, cap_lost_tokens: BB-8 totals.
        evicted_blocks, evicted_tokens: what the index evicted.
        peak_cached_blocks, peak_cached_tokens: the most it held at once.
        index_memory_bytes: its structures' estimated size at the peak.
        index_us_p50, index_us_p99, index_us_mean: index time per request.
        admit_us_p50, admit_us_p99: admission time per request.
        timing_repeats: timed replays run.
        timing_runs_agree: every timed replay hit exactly what the first did.
        seconds_by_call: index seconds per call kind (the fastest timed replay).
        wall_seconds_tracked: the first replay's wall time.
        wall_seconds_timed: each timed replay's wall time.
        requests: one row per request, in arrival order.
    """

    workload: str
    backend: str
    index: str
    driver: Driver
    block_size: int
    options: Mapping[str, Any]
    capacity_tokens: int
    num_blocks: int
    pool_tokens: int
    concurrency: int
    num_requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_ratio: float
    boundary_accounting: bool
    matched_tokens: int
    boundary_lost_tokens: int
    cap_lost_tokens: int
    evicted_blocks: int
    evicted_tokens: int
    peak_cached_blocks: int
    peak_cached_tokens: int
    index_memory_bytes: int
    index_us_p50: float
    index_us_p99: float
    index_us_mean: float
    admit_us_p50: float
    admit_us_p99: float
    timing_repeats: int
    timing_runs_agree: bool
    seconds_by_call: Mapping[str, float]
    wall_seconds_tracked: float
    wall_seconds_timed: tuple[float, ...]
    requests: list[RequestRow] = field(repr=False)

    def labels(self) -> dict[str, Scalar]:
        """The columns that say which run a row belongs to."""
        return {
            **_run_identity(self.workload, "table", self.backend, self.index, self.block_size),
            "options": options_text(self.options),
            "capacity_tokens": self.capacity_tokens,
            "num_blocks": self.num_blocks,
            "pool_tokens": self.pool_tokens,
            "driver": self.driver,
            "concurrency": self.concurrency,
        }

    def row(self) -> dict[str, Scalar]:
        """One flat run record (every field but the per-request columns)."""
        row = self.labels()
        for name in (
            "num_requests", "prompt_tokens", "hit_tokens", "hit_ratio", "boundary_accounting",
            "matched_tokens", "boundary_lost_tokens", "cap_lost_tokens", "evicted_blocks",
            "evicted_tokens", "peak_cached_blocks", "peak_cached_tokens", "index_memory_bytes",
            "index_us_p50", "index_us_p99", "index_us_mean", "admit_us_p50", "admit_us_p99",
            "timing_repeats", "timing_runs_agree", "wall_seconds_tracked",
        ):  # fmt: skip
            row[name] = getattr(self, name)
        row["wall_seconds_timed_min"] = min(self.wall_seconds_timed, default=math.nan)
        for call, seconds in sorted(self.seconds_by_call.items()):
            row[f"index_seconds_{call}"] = seconds
        return row

    def request_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per request, in arrival order."""
        return request_table(self.labels(), self.requests)


def options_text(options: Mapping[str, Any]) -> str:
    """``{"eviction": "lfu"}`` -> ``"eviction=lfu"`` (``,``-joined, sorted; ``""`` for none)."""
    return ",".join(f"{k}={v}" for k, v in sorted(options.items()))


def run_backend(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    *,
    concurrency: int = 1,
    timing_repeats: int = 3,
    boundary_accounting: bool = True,
    bars: Bars | None = None,
) -> BackendRun:
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
    return _backend_run(
        workload, spec, capacity_tokens, concurrency, timing_repeats, boundary_accounting,
        first, memory, timed,
    )  # fmt: skip


def _backend_run(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    concurrency: int,
    timing_repeats: int,
    boundary_accounting: bool,
    first: ReplayResult,
    memory: int,
    timed: Sequence[ReplayResult],
) -> BackendRun:
    """The record of a backend's replays: hits from ``first``, times from ``timed``."""
    rows = _request_rows(first, timed)
    index_us = [r.index_us for r in rows]
    admit_us = [r.admit_us for r in rows]
    bs = spec.block_size
    num_blocks = spec.num_blocks(capacity_tokens)
    prompt, hit = first.total_prompt_tokens, first.total_hit_tokens
    return BackendRun(
        workload=workload.name,
        backend=spec.label,
        index=spec.index,
        driver=spec.driver,
        block_size=bs,
        options=dict(spec.options),
        capacity_tokens=capacity_tokens,
        num_blocks=num_blocks,
        pool_tokens=num_blocks * bs,
        concurrency=concurrency,
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
        index_us_p50=percentile(index_us, 50),
        index_us_p99=percentile(index_us, 99),
        index_us_mean=sum(index_us) / len(index_us) if index_us else 0.0,
        admit_us_p50=percentile(admit_us, 50),
        admit_us_p99=percentile(admit_us, 99),
        timing_repeats=timing_repeats,
        timing_runs_agree=all(t.hit_tokens == first.hit_tokens for t in timed),
        seconds_by_call=dict(min(timed, key=lambda t: t.wall_seconds).seconds_by_call),
        wall_seconds_tracked=first.wall_seconds,
        wall_seconds_timed=tuple(t.wall_seconds for t in timed),
        requests=rows,
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


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One backend's K-live hit ratio at one capacity of the sweep.

    Attributes:
        workload, backend, index, block_size: which run.
        capacity_tokens: the capacity asked for.
        concurrency: the K of the K-live schedule.
        hit_ratio: ``None`` when the requests do not fit this capacity.
        evicted_blocks: ``None`` likewise.
    """

    workload: str
    backend: str
    index: str
    block_size: int
    capacity_tokens: int
    concurrency: int
    hit_ratio: float | None
    evicted_blocks: int | None

    def row(self) -> dict[str, Scalar]:
        """One flat run record (``fits`` false where the capacity was too small)."""
        return {
            **_run_identity(self.workload, "sweep", self.backend, self.index, self.block_size),
            "capacity_tokens": self.capacity_tokens,
            "num_blocks": self.capacity_tokens // self.block_size,
            "pool_tokens": self.capacity_tokens // self.block_size * self.block_size,
            "concurrency": self.concurrency,
            "fits": self.hit_ratio is not None,
            "hit_ratio": self.hit_ratio,
            "evicted_blocks": self.evicted_blocks,
        }


def _run_identity(
    workload: str, role: str, backend: str, index: str, block_size: int
) -> dict[str, Scalar]:
    """The leading columns of a K-live run record: which run, in the tables' order."""
    return {
        "workload": workload,
        "schedule": "k_live",
        "role": role,
        "backend": backend,
        "index": index,
        "block_size": block_size,
    }


def run_sweep(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacities: Sequence[int],
    *,
    concurrency: int = 1,
    bars: Bars | None = None,
) -> list[SweepPoint]:
    """Hit ratio (and evictions) of each backend at each capacity, without accounting.

    A capacity a backend cannot run at gives ``None`` for it. Points come capacity
    by capacity, backends in order.
    """
    points: list[SweepPoint] = []
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
            points.append(
                SweepPoint(
                    workload.name, spec.label, spec.index, spec.block_size, cap, concurrency,
                    ratio, evicted,
                )
            )  # fmt: skip
    return points


def select_strip_requests(results: Sequence[BackendRun], limit: int = 6) -> list[int]:
    """Positions of a few telling requests for the strip plot, in arrival order.

    First those where some backend lost tokens to a block boundary, then those where
    the backends' hits differ, then those with a recomputed last block, then the rest.
    Complexity: O(requests * backends), one pass per criterion.
    """
    per = [r.requests for r in results]
    n = len(per[0]) if per else 0
    cached = [p for p, r in zip(per, results, strict=True) if describe_index(r.index).caches] or per

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
