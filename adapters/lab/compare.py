"""Head-to-head runs of prefix-cache backends on the same requests, at equal capacity.

Each backend replays through its natural driver (hash chain: the vLLM-shaped facade,
radix: the SGLang-shaped one, anything else: the manager) with the same KV capacity
in tokens; the numbers come back as plain dicts, ready for the report and JSON. A
workload's requests are re-read on every replay (a trace is never held whole), and
capacity planning uses the sizes a scan found.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.registry import make_index, pool_owned_options

from .progress import Progress
from .replay import DRIVERS, Driver, ReplayError, ReplayInterrupted, ReplayResult, replay
from .sources import Workload
from .traces import TraceStats

__all__ = [
    "MAX_POOL_BLOCKS",
    "NATURAL_DRIVERS",
    "BackendSpec",
    "Bars",
    "CapacityError",
    "CompareError",
    "CompareInterrupted",
    "check_pool",
    "compare_workload",
    "min_capacity",
    "parse_backends",
    "percentile",
    "plan_capacities",
    "roomy_capacity",
    "run_backend",
    "run_sweep",
    "select_strip_requests",
    "sweep_capacities",
]

NATURAL_DRIVERS: Mapping[str, Driver] = MappingProxyType({"hash_chain": "vllm", "radix": "sglang"})
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
    """Ctrl-C during a comparison; ``workload`` holds the backends finished so far."""

    def __init__(self, workload: dict[str, Any]) -> None:
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

    def describe(self) -> str:
        """``"hash_chain (vllm driver, 16-token blocks)"``."""
        unit = "page" if self.index == "radix" else "block"
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
        block_size: granularity of every backend but the radix tree.
        page_size: the radix tree's page size.
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
            size = page_size if name == "radix" else block_size
        if any(s.label == label for s in specs):
            raise CompareError(f"backend {label!r} is listed twice")
        chosen = tuple(sorted(opts.get(name, {}).items()))
        spec = BackendSpec(
            label, name, size, driver or NATURAL_DRIVERS.get(name, "manager"), chosen
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
    *,
    pause_gc: bool = False,
) -> tuple[ReplayResult, int]:
    index = spec.make()
    num_blocks = spec.num_blocks(capacity_tokens)
    if num_blocks < 1:
        raise ReplayError(f"{capacity_tokens} tokens hold no {spec.block_size}-token block")
    bar = (
        bars(f"{workload.name} {spec.label} {what}", workload.stats.prompt_tokens) if bars else None
    )
    paused = pause_gc and gc.isenabled()
    if paused:  # as timeit does: a collection would bill one request for everyone's garbage
        gc.collect()
        gc.disable()
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
        if paused:
            gc.enable()
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
) -> dict[str, Any]:
    """Replay with boundary accounting (BB-8), then ``timing_repeats`` times without it.

    Hits and evictions come from the first replay; index times from the others (the
    token-level mirror behind the accounting costs time inside the index calls),
    each request's time being its minimum over the repeats, with the garbage
    collector paused: what remains is the index's own cost, not a neighbour
    process's time slice or a collection of everyone's garbage. With
    ``timing_repeats=0`` the times come from the first replay (accounting
    included). Without ``boundary_accounting`` there are ``max(1, timing_repeats)``
    replays, all timed, and the BB-8 columns are zero.

    Returns:
        Totals and per-request lists (see the report's results.json).

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
            pause_gc=not boundary_accounting,
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
                pause_gc=True,
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

    matched = column(first.matched_tokens)
    boundary = column(first.boundary_lost_tokens)
    capped = column(first.cap_lost_tokens)
    per_request: dict[str, Any] = {
        "id": list(first.ids),
        "prompt_len": first.prompt_len.tolist(),
        "hit_tokens": first.hit_tokens.tolist(),
        "matched_tokens": matched,
        "boundary_lost_tokens": boundary,
        "cap_lost_tokens": capped,
        "index_us": index_us,
        "admit_us": admit_us,
    }
    bs = spec.block_size
    prompt, hit = first.total_prompt_tokens, first.total_hit_tokens
    return {
        "backend": spec.label,
        "index": spec.index,
        "driver": spec.driver,
        "block_size": bs,
        "options": dict(spec.options),
        "num_blocks": num_blocks,
        "capacity_tokens": num_blocks * bs,
        "requests": n,
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_ratio": hit / prompt if prompt else 0.0,
        "boundary_accounting": boundary_accounting,
        "matched_tokens": sum(matched),
        "boundary_lost_tokens": sum(boundary),
        "cap_lost_tokens": sum(capped),
        "evicted_blocks": first.evicted_blocks,
        "evicted_tokens": first.evicted_blocks * bs,
        "peak_cached_blocks": first.peak_cached_blocks,
        "peak_cached_tokens": first.peak_cached_blocks * bs,
        "index_memory_bytes": memory,
        "index_us_p50": percentile(index_us, 50),
        "index_us_p99": percentile(index_us, 99),
        "index_us_mean": sum(index_us) / len(index_us) if index_us else 0.0,
        "admit_us_p50": percentile(admit_us, 50),
        "admit_us_p99": percentile(admit_us, 99),
        "timing_repeats": timing_repeats,
        "timing_runs_agree": all(t.hit_tokens == first.hit_tokens for t in timed),
        "seconds_by_call": dict(fastest.seconds_by_call),
        "wall_seconds_tracked": first.wall_seconds,
        "wall_seconds_timed": [t.wall_seconds for t in timed],
        "per_request": per_request,
    }


def run_sweep(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacities: Sequence[int],
    *,
    concurrency: int = 1,
    bars: Bars | None = None,
) -> dict[str, Any]:
    """Hit ratio (and evictions) of each backend at each capacity, without accounting.

    A capacity a backend cannot run at gives ``None`` for it.
    """
    ratios: dict[str, list[float | None]] = {b.label: [] for b in backends}
    evicted: dict[str, list[int | None]] = {b.label: [] for b in backends}
    for cap in capacities:
        for spec in backends:
            try:
                result, _ = _replay(
                    workload, spec, cap, concurrency, False, bars, f"sweep {cap:,} tok"
                )
            except ReplayError:
                ratios[spec.label].append(None)
                evicted[spec.label].append(None)
                continue
            ratios[spec.label].append(result.summary()["hit_ratio"])
            evicted[spec.label].append(result.evicted_blocks)
    return {"capacity_tokens": list(capacities), "hit_ratio": ratios, "evicted_blocks": evicted}


def select_strip_requests(results: Sequence[Mapping[str, Any]], limit: int = 6) -> list[int]:
    """Positions of a few telling requests for the strip plot, in arrival order.

    First those where some backend lost tokens to a block boundary, then those where
    the backends' hits differ, then those with a recomputed last block, then the rest.
    Complexity: O(requests * backends), one pass per criterion.
    """
    per = [r["per_request"] for r in results]
    n = len(per[0]["id"]) if per else 0
    cached = [p for p, r in zip(per, results, strict=True) if r["index"] != "none"] or per

    def boundary(i: int) -> bool:
        return any(p["boundary_lost_tokens"][i] for p in cached)

    def differ(i: int) -> bool:
        return len({p["hit_tokens"][i] for p in cached}) > 1

    def capped(i: int) -> bool:
        return any(p["cap_lost_tokens"][i] for p in cached)

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


def compare_workload(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacity_tokens: int,
    sweep: Sequence[int] = (),
    *,
    concurrency: int = 1,
    timing_repeats: int = 3,
    boundary_accounting: bool = True,
    bars: Bars | None = None,
) -> dict[str, Any]:
    """Every backend on one workload: :func:`run_backend` each, then the sweep.

    Raises:
        CapacityError: ``capacity_tokens`` cannot hold the requests (the sweep's
            capacities never raise; a failed point is ``None``).
        CompareInterrupted: Ctrl-C; it carries the backends finished so far.
    """
    doc: dict[str, Any] = {
        "name": workload.name,
        "source": workload.source,
        "notes": list(workload.notes),
        "num_requests": workload.stats.num_requests,
        "prompt_tokens": workload.stats.prompt_tokens,
        "output_tokens": workload.stats.output_tokens,
        "capacity_tokens": capacity_tokens,
        "concurrency": concurrency,
        "backends": [],
        "sweep": None,
        "strip_requests": [],
        "partial": False,
    }
    try:
        for b in backends:
            doc["backends"].append(
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
        doc["strip_requests"] = select_strip_requests(doc["backends"])
        if sweep:
            doc["sweep"] = run_sweep(workload, backends, sweep, concurrency=concurrency, bars=bars)
    except (ReplayInterrupted, KeyboardInterrupt):
        doc["partial"] = True
        if doc["backends"]:
            doc["strip_requests"] = select_strip_requests(doc["backends"])
        raise CompareInterrupted(doc) from None
    return doc
