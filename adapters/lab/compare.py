"""Head-to-head runs of prefix-cache backends on the same requests, at equal capacity.

Each backend replays through its natural driver (hash chain: the vLLM-shaped facade,
radix: the SGLang-shaped one, anything else: the manager) with the same KV capacity
in tokens. With :class:`~.timed.TimeSettings` each backend also runs at arrival time
on its natural engine (:mod:`.timed`). The numbers come back as typed records whose
``row()`` and ``request_rows()`` give the flat records of the tidy tables. A
workload's requests are re-read on every run (a trace is never held whole), and
capacity planning uses the sizes a scan found.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from prefixkv.indexes.base import IndexDescription, PrefixIndex
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.registry import describe_index, make_index, pool_owned_options

from .progress import Progress
from .replay import DRIVERS, Driver, ReplayError, ReplayInterrupted, ReplayResult, replay
from .sim import SimUnservableError
from .timed import Scalar, TimedRun, TimeSettings, run_timed
from .traces import TraceStats
from .workload_sources import Workload

__all__ = [
    "MAX_POOL_BLOCKS",
    "NATURAL_DRIVERS",
    "BackendRun",
    "BackendSpec",
    "Bars",
    "CapacityError",
    "CompareError",
    "CompareInterrupted",
    "RequestHits",
    "SweepPoint",
    "WorkloadResult",
    "check_pool",
    "compare_workload",
    "min_capacity",
    "options_text",
    "parse_backends",
    "percentile",
    "plan_capacities",
    "roomy_capacity",
    "run_backend",
    "run_sweep",
    "select_strip_requests",
    "sweep_capacities",
]

NATURAL_DRIVERS: Mapping[str | None, Driver] = MappingProxyType(
    {"vllm": "vllm", "sglang": "sglang", None: "manager"}
)
"""The scheduler order that drives a backend, by the engine it models (its
``IndexDescription.models``): a backend modelled on no engine runs through the manager."""
"""The scheduler each backend is modelled on; other backends use the manager."""

MAX_POOL_BLOCKS = 2**24
"""Default bound on one replay's pool (16,777,216 blocks); larger is refused up front."""

Bars = Callable[[str, int], Progress]
"""Makes one progress bar: ``bars(description, total prompt tokens)``."""


class CompareError(PrefixKVError):
    """A comparison option is invalid (backend spec, workload name, capacity)."""


class CapacityError(CompareError):
    """The KV capacity asked for cannot hold the requests even after evicting."""


class CompareInterrupted(KeyboardInterrupt):
    """Ctrl-C during a comparison; ``workload`` holds what finished so far."""

    def __init__(self, workload: WorkloadResult) -> None:
        super().__init__("comparison interrupted")
        self.workload = workload


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend of a comparison.

    Attributes:
        label: the name shown in tables and plots (``radix``, ``radix:16``).
        index: the registry name.
        block_size: hit granularity in tokens (the radix tree's page size).
        driver: the replay driver.
        options: backend options passed to ``make_index`` (``hash_algorithm``,
            ``eviction``, ...).
    """

    label: str
    index: str
    block_size: int
    driver: Driver
    options: tuple[tuple[str, Any], ...] = ()

    def make(self) -> PrefixIndex:
        """A fresh index for one replay."""
        opts = {**pool_owned_options(self.index), **dict(self.options)}
        return make_index(self.index, self.block_size, **opts)

    def num_blocks(self, capacity_tokens: int) -> int:
        """Blocks of ``block_size`` that fit in ``capacity_tokens``."""
        return capacity_tokens // self.block_size

    @property
    def description(self) -> IndexDescription:
        """What the backend says about itself."""
        return describe_index(self.index)

    def describe(self) -> str:
        """``"hash_chain (vllm driver, 16-token blocks)"``."""
        unit = self.description.unit
        plural = "" if self.block_size == 1 else "s"
        opts = "".join(f", {k}={v}" for k, v in self.options)
        return f"{self.label} ({self.driver} driver, {self.block_size}-token {unit}{plural}{opts})"


def _positive(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise CompareError(f"{name} must be a positive int, got {value!r}")
    return value


def parse_backends(
    text: str,
    *,
    block_size: int = 16,
    page_size: int = 1,
    driver: Driver | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[BackendSpec]:
    """Parse ``"hash_chain,radix,none"``; ``NAME:SIZE`` sets one backend's granularity.

    Args:
        text: comma-separated registry names, each optionally ``:SIZE``.
        block_size: granularity of the backends whose unit is a block (vLLM's).
        page_size: granularity of the backends whose unit is a page (SGLang's).
        driver: force one driver for all (default: each backend's natural one).
        options: per registry name, options for ``make_index`` (checked here by
            building each backend once).

    Raises:
        CompareError: an empty list, a bad size, a repeated backend or driver, an
            option a backend does not take or a bad option value.
        UnknownIndexError: a name nobody registered (the message lists the names).
    """
    _positive("block size", block_size)
    _positive("page size", page_size)
    if driver is not None and driver not in DRIVERS:
        raise CompareError(f"unknown driver {driver!r}; known: {', '.join(DRIVERS)}")
    opts = options or {}
    specs: list[BackendSpec] = []
    for part in text.split(","):
        label = part.strip()
        if not label:
            continue
        name, _, size_text = label.partition(":")
        if size_text:
            if not size_text.isdigit() or int(size_text) < 1:
                raise CompareError(f"bad size in backend {label!r}: want NAME:POSITIVE_INT")
            size = int(size_text)
        else:
            size = page_size if describe_index(name).unit == "page" else block_size
        if any(s.label == label for s in specs):
            raise CompareError(f"backend {label!r} is listed twice")
        chosen = tuple(sorted(opts.get(name, {}).items()))
        spec = BackendSpec(
            label,
            name,
            size,
            driver or NATURAL_DRIVERS.get(describe_index(name).models, "manager"),
            chosen,
        )
        try:
            spec.make()  # an unknown name or option fails here, before anything runs
        except PrefixKVError:
            raise
        except ValueError as exc:
            raise CompareError(f"backend {label!r}: bad option in {dict(chosen)}: {exc}") from None
        specs.append(spec)
    if not specs:
        raise CompareError(f"no backend named in {text!r}")
    unused = set(opts) - {s.index for s in specs}
    if unused:
        raise CompareError(f"options given for backends not compared: {sorted(unused)}")
    return specs


def _spare(backends: Sequence[BackendSpec]) -> int:
    # A spare block each end of every request: a partial last block, and SGLang's
    # extend + page_size over-estimate for paged prefill.
    return 2 * max(b.block_size for b in backends)


def roomy_capacity(stats: TraceStats, backends: Sequence[BackendSpec]) -> int:
    """Tokens that hold every request's KV at once: no backend ever evicts."""
    return stats.prompt_tokens + stats.output_tokens + _spare(backends) * stats.num_requests


def min_capacity(stats: TraceStats, backends: Sequence[BackendSpec], concurrency: int) -> int:
    """Tokens for the ``concurrency`` largest requests live at once: the tight end."""
    largest = stats.largest[:concurrency]
    return sum(largest) + _spare(backends) * len(largest)


def check_pool(
    capacity_tokens: int, backends: Sequence[BackendSpec], max_pool_blocks: int = MAX_POOL_BLOCKS
) -> None:
    """Refuse a capacity that holds no block, or more blocks than ``max_pool_blocks``.

    Raises:
        CapacityError: naming the backend, the capacity and the limit.
    """
    for b in backends:
        blocks = b.num_blocks(capacity_tokens)
        if blocks < 1:
            raise CapacityError(
                f"capacity {capacity_tokens:,} tokens holds no {b.block_size}-token block "
                f"of {b.label}"
            )
        if blocks > max_pool_blocks:
            raise CapacityError(
                f"capacity {capacity_tokens:,} tokens is {blocks:,} blocks of {b.block_size} "
                f"tokens for {b.label}, over the limit of {max_pool_blocks:,} blocks a pool "
                "(--max-pool-blocks); give a smaller --capacity-tokens"
            )


def sweep_capacities(low: int, high: int, points: int = 7) -> list[int]:
    """``points`` capacities from ``low`` to ``high``, evenly spaced on a log scale."""
    if high <= low:
        return [high]
    ratio = high / low
    caps = [round(low * ratio ** (i / (points - 1))) for i in range(points)]
    return sorted(set(caps))


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
class RequestHits:
    """Per-request columns of one K-live replay, in arrival order.

    Attributes:
        ids: request ids.
        prompt_tokens: prompt length.
        hit_tokens: prompt tokens served from the cache.
        matched_tokens: tokens equal to cached content (BB-8; 0 without accounting).
        boundary_lost_tokens: matched but recomputed at a block boundary (BB-8).
        cap_lost_tokens: matched but recomputed in the last block (BB-1, BB-3).
        index_us: index time of all the request's calls (min over timed replays).
        admit_us: the part spent admitting it.
    """

    ids: list[str]
    prompt_tokens: list[int]
    hit_tokens: list[int]
    matched_tokens: list[int]
    boundary_lost_tokens: list[int]
    cap_lost_tokens: list[int]
    index_us: list[float]
    admit_us: list[float]

    def __len__(self) -> int:
        return len(self.ids)


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
        per_request: the per-request columns.
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
    per_request: RequestHits = field(repr=False)

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
        labels = self.labels()
        p = self.per_request
        return [
            {
                **labels,
                "position": k,
                "request_id": p.ids[k],
                "prompt_tokens": p.prompt_tokens[k],
                "hit_tokens": p.hit_tokens[k],
                "uncached_prefill_tokens": p.prompt_tokens[k] - p.hit_tokens[k],
                "matched_tokens": p.matched_tokens[k],
                "boundary_lost_tokens": p.boundary_lost_tokens[k],
                "cap_lost_tokens": p.cap_lost_tokens[k],
                "index_us": p.index_us[k],
                "admit_us": p.admit_us[k],
            }
            for k in range(len(p))
        ]


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
    num_blocks = spec.num_blocks(capacity_tokens)
    # With accounting, one tracked replay then the timed ones; without, the first
    # timed replay gives the hits too.
    extra = timing_repeats if boundary_accounting else max(0, timing_repeats - 1)
    runs = 1 + extra
    try:
        first, memory = _replay(
            workload,
            spec,
            capacity_tokens,
            concurrency,
            boundary_accounting,
            bars,
            f"1/{runs}",
        )
        timed = [
            _replay(
                workload,
                spec,
                capacity_tokens,
                concurrency,
                False,
                bars,
                f"{k + 2}/{runs}",
            )[0]
            for k in range(extra)
        ]
        if not boundary_accounting or not timed:
            timed.insert(0, first)
    except ReplayError as exc:
        raise CapacityError(
            f"capacity {capacity_tokens} tokens ({num_blocks} × {spec.block_size}-token blocks) "
            f"is too small for {workload.name!r} with {spec.label} at concurrency "
            f"{concurrency}: {exc}"
        ) from None
    index_us = _min_us([t.request_seconds for t in timed])
    admit_us = _min_us([t.admit_seconds for t in timed])
    fastest = min(timed, key=lambda t: t.wall_seconds)
    n = first.num_requests
    zeros = [0] * n

    def column(values: Sequence[int]) -> list[int]:
        return list(values) if len(values) == n else zeros

    hits = RequestHits(
        ids=list(first.ids),
        prompt_tokens=first.prompt_len.tolist(),
        hit_tokens=first.hit_tokens.tolist(),
        matched_tokens=column(first.matched_tokens),
        boundary_lost_tokens=column(first.boundary_lost_tokens),
        cap_lost_tokens=column(first.cap_lost_tokens),
        index_us=index_us,
        admit_us=admit_us,
    )
    bs = spec.block_size
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
        num_requests=n,
        prompt_tokens=prompt,
        hit_tokens=hit,
        hit_ratio=hit / prompt if prompt else 0.0,
        boundary_accounting=boundary_accounting,
        matched_tokens=sum(hits.matched_tokens),
        boundary_lost_tokens=sum(hits.boundary_lost_tokens),
        cap_lost_tokens=sum(hits.cap_lost_tokens),
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
        seconds_by_call=dict(fastest.seconds_by_call),
        wall_seconds_tracked=first.wall_seconds,
        wall_seconds_timed=tuple(t.wall_seconds for t in timed),
        per_request=hits,
    )


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
    per = [r.per_request for r in results]
    n = len(per[0]) if per else 0
    cached = [p for p, r in zip(per, results, strict=True) if describe_index(r.index).caches] or per

    def boundary(i: int) -> bool:
        return any(p.boundary_lost_tokens[i] for p in cached)

    def differ(i: int) -> bool:
        return len({p.hit_tokens[i] for p in cached}) > 1

    def capped(i: int) -> bool:
        return any(p.cap_lost_tokens[i] for p in cached)

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


def plan_capacities(
    workload: Workload,
    backends: Sequence[BackendSpec],
    *,
    capacity_tokens: int | None = None,
    concurrency: int = 1,
    sweep_points: int = 0,
) -> tuple[int, list[int]]:
    """The capacity of the table (default: roomy) and of the sweep (tight to roomy).

    Returns:
        ``(capacity_tokens, sweep)``; the sweep is empty when ``sweep_points`` is 0.
    """
    roomy = roomy_capacity(workload.stats, backends)
    cap = roomy if capacity_tokens is None else capacity_tokens
    if not sweep_points:
        return cap, []
    tight = min_capacity(workload.stats, backends, concurrency)
    return cap, sweep_capacities(tight, max(roomy, cap), sweep_points)


@dataclass(slots=True)
class WorkloadResult:
    """Everything a comparison measured on one workload.

    Attributes:
        name, source, notes: the workload, where it came from, what the report
            must say about it.
        num_requests, prompt_tokens, output_tokens: its sizes.
        capacity_tokens: the capacity of the table (asked for; each backend uses
            the whole blocks that fit).
        concurrency: the K of the K-live schedule.
        backends: each backend's K-live replay at ``capacity_tokens``.
        sweep: K-live hit ratios at the sweep's capacities (empty: no sweep).
        strip_requests: positions of the requests the strip plot shows.
        timed: arrival-time runs, the table's capacity first, then the sweep's
            (empty without :class:`~.timed.TimeSettings`).
        partial: Ctrl-C stopped it; what is here finished.
    """

    name: str
    source: str
    notes: tuple[str, ...]
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    capacity_tokens: int
    concurrency: int
    backends: list[BackendRun] = field(default_factory=list)
    sweep: list[SweepPoint] = field(default_factory=list)
    strip_requests: list[int] = field(default_factory=list)
    timed: list[TimedRun] = field(default_factory=list)
    partial: bool = False

    @property
    def sweep_capacities(self) -> list[int]:
        """The sweep's capacities, ascending."""
        return sorted({p.capacity_tokens for p in self.sweep})

    def timed_at_table(self) -> list[TimedRun]:
        """The arrival-time runs at the table's capacity, one per backend."""
        return [t for t in self.timed if t.role == "table"]

    def row(self) -> dict[str, Scalar]:
        """The workload as one flat record."""
        return {
            "workload": self.name,
            "source": self.source,
            "notes": " ".join(self.notes),
            "num_requests": self.num_requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "capacity_tokens": self.capacity_tokens,
            "concurrency": self.concurrency,
            "partial": self.partial,
        }

    def run_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per run: K-live table, K-live sweep, arrival-time runs."""
        return [
            *(b.row() for b in self.backends),
            *(p.row() for p in self.sweep),
            *(t.row() for t in self.timed),
        ]

    def request_rows(self) -> list[dict[str, Scalar]]:
        """One flat record per request x backend x configuration."""
        rows: list[dict[str, Scalar]] = []
        for b in self.backends:
            rows += b.request_rows()
        for t in self.timed:
            rows += t.request_rows()
        return rows


def compare_workload(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacity_tokens: int,
    sweep: Sequence[int] = (),
    *,
    concurrency: int = 1,
    timing_repeats: int = 3,
    boundary_accounting: bool = True,
    time: TimeSettings | None = None,
    bars: Bars | None = None,
) -> WorkloadResult:
    """Every backend on one workload: :func:`run_backend` each, the sweep, then (with
    ``time``) each backend's arrival-time run at the table's capacity and at each
    capacity of the sweep.

    Raises:
        CapacityError: ``capacity_tokens`` cannot hold the requests (the sweep's
            capacities never raise; a failed point is ``None``, a failed
            arrival-time point is left out).
        CompareInterrupted: Ctrl-C; it carries what finished so far.
    """
    result = WorkloadResult(
        name=workload.name,
        source=workload.source,
        notes=tuple(workload.notes),
        num_requests=workload.stats.num_requests,
        prompt_tokens=workload.stats.prompt_tokens,
        output_tokens=workload.stats.output_tokens,
        capacity_tokens=capacity_tokens,
        concurrency=concurrency,
    )
    try:
        for b in backends:
            result.backends.append(
                run_backend(
                    workload,
                    b,
                    capacity_tokens,
                    concurrency=concurrency,
                    timing_repeats=timing_repeats,
                    boundary_accounting=boundary_accounting,
                    bars=bars,
                )
            )
        result.strip_requests = select_strip_requests(result.backends)
        if sweep:
            result.sweep = run_sweep(workload, backends, sweep, concurrency=concurrency, bars=bars)
        if time is not None:
            _run_timed_all(result, workload, backends, capacity_tokens, sweep, time, bars)
    except (ReplayInterrupted, KeyboardInterrupt):
        result.partial = True
        if result.backends:
            result.strip_requests = select_strip_requests(result.backends)
        raise CompareInterrupted(result) from None
    return result


def _run_timed_all(
    result: WorkloadResult,
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacity_tokens: int,
    sweep: Sequence[int],
    time: TimeSettings,
    bars: Bars | None,
) -> None:
    for b in backends:
        try:
            run = run_timed(workload, b, capacity_tokens, time, bars=bars)
        except SimUnservableError as exc:
            raise CapacityError(
                f"capacity {capacity_tokens:,} tokens is too small for {workload.name!r} "
                f"with {b.label} in the arrival-time run: {exc}"
            ) from None
        result.timed.append(run)
    for cap in sweep:
        if cap == capacity_tokens:
            continue  # the table's run is that point
        for b in backends:
            try:
                result.timed.append(run_timed(workload, b, cap, time, role="sweep", bars=bars))
            except SimUnservableError:
                continue  # a point that does not fit is left out (plotted as a gap)
