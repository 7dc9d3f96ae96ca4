"""Head-to-head runs of prefix-cache backends on the same requests, at equal capacity.

Each backend replays through its natural driver (hash chain: the vLLM-shaped facade,
radix: the SGLang-shaped one, anything else: the manager) with the same KV capacity
in tokens; the numbers come back as plain dicts, ready for the report and JSON.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.registry import make_index, pool_owned_options

from .replay import DRIVERS, Driver, ReplayError, ReplayResult, replay
from .sources import Workload
from .traces import TraceRequest

__all__ = [
    "NATURAL_DRIVERS",
    "BackendSpec",
    "CapacityError",
    "CompareError",
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

Tick = Callable[[int], object]
"""Progress callback: ``tick(n)`` says ``n`` more requests were replayed."""


class CompareError(PrefixKVError):
    """A comparison option is invalid (backend spec, workload name, capacity)."""


class CapacityError(CompareError):
    """The KV capacity asked for cannot hold the requests even after evicting."""


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend of a comparison.

    Attributes:
        label: the name shown in tables and plots (``radix``, ``radix:16``).
        index: the registry name.
        block_size: hit granularity in tokens (the radix tree's page size).
        driver: the replay driver.
    """

    label: str
    index: str
    block_size: int
    driver: Driver

    def make(self) -> PrefixIndex:
        """A fresh index for one replay."""
        return make_index(self.index, self.block_size, **pool_owned_options(self.index))

    def num_blocks(self, capacity_tokens: int) -> int:
        """Blocks of ``block_size`` that fit in ``capacity_tokens``."""
        return capacity_tokens // self.block_size

    def describe(self) -> str:
        """``"hash_chain (vllm driver, 16-token blocks)"``."""
        unit = "page" if self.index == "radix" else "block"
        plural = "" if self.block_size == 1 else "s"
        return f"{self.label} ({self.driver} driver, {self.block_size}-token {unit}{plural})"


def _positive(name: str, value: object) -> int:
    if type(value) is not int or value < 1:
        raise CompareError(f"{name} must be a positive int, got {value!r}")
    return value


def parse_backends(
    text: str, *, block_size: int = 16, page_size: int = 1, driver: Driver | None = None
) -> list[BackendSpec]:
    """Parse ``"hash_chain,radix,none"``; ``NAME:SIZE`` sets one backend's granularity.

    Args:
        text: comma-separated registry names, each optionally ``:SIZE``.
        block_size: granularity of every backend but the radix tree.
        page_size: the radix tree's page size.
        driver: force one driver for all (default: each backend's natural one).

    Raises:
        CompareError: an empty list, a bad size, a repeated backend or driver.
        UnknownIndexError: a name nobody registered (the message lists the names).
    """
    _positive("block size", block_size)
    _positive("page size", page_size)
    if driver is not None and driver not in DRIVERS:
        raise CompareError(f"unknown driver {driver!r}; known: {', '.join(DRIVERS)}")
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
        spec = BackendSpec(label, name, size, driver or NATURAL_DRIVERS.get(name, "manager"))
        spec.make()  # an unknown name fails here, before anything runs
        specs.append(spec)
    if not specs:
        raise CompareError(f"no backend named in {text!r}")
    return specs


def _footprint(request: TraceRequest, block: int) -> int:
    # Prompt and output, plus a spare block each end: a partial last block, and
    # SGLang's extend + page_size over-estimate for paged prefill.
    return len(request.tokens) + len(request.output) + 2 * block


def roomy_capacity(requests: Sequence[TraceRequest], backends: Sequence[BackendSpec]) -> int:
    """Tokens that hold every request's KV at once: no backend ever evicts."""
    block = max(b.block_size for b in backends)
    return sum(_footprint(r, block) for r in requests)


def min_capacity(
    requests: Sequence[TraceRequest], backends: Sequence[BackendSpec], concurrency: int
) -> int:
    """Tokens for the ``concurrency`` largest requests live at once: the tight end."""
    block = max(b.block_size for b in backends)
    sizes = sorted((_footprint(r, block) for r in requests), reverse=True)
    return sum(sizes[:concurrency])


def sweep_capacities(low: int, high: int, points: int = 7) -> list[int]:
    """``points`` capacities from ``low`` to ``high``, evenly spaced on a log scale."""
    if high <= low:
        return [high]
    ratio = high / low
    caps = [round(low * ratio ** (i / (points - 1))) for i in range(points)]
    return sorted(set(caps))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank ``q``-th percentile (0 < q <= 100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def _replay(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    concurrency: int,
    track: bool,
    tick: Tick | None,
    *,
    pause_gc: bool = False,
) -> tuple[ReplayResult, int]:
    index = spec.make()
    num_blocks = spec.num_blocks(capacity_tokens)
    if num_blocks < 1:
        raise ReplayError(f"{capacity_tokens} tokens hold no {spec.block_size}-token block")

    def on_request(_count: int) -> None:
        if tick is not None:
            tick(1)

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
            on_request=on_request,
        )
    finally:
        if paused:
            gc.enable()
    # replay samples the index size only now and then; the end state is exact.
    measure = getattr(index, "memory_bytes", None)
    end_bytes = int(measure()) if measure is not None else 0
    return result, max(result.index_memory_bytes, end_bytes)


def run_backend(
    workload: Workload,
    spec: BackendSpec,
    capacity_tokens: int,
    *,
    concurrency: int = 1,
    timing_repeats: int = 3,
    tick: Tick | None = None,
) -> dict[str, Any]:
    """Replay with boundary accounting (BB-8), then ``timing_repeats`` times without it.

    Hits and evictions come from the first replay; index times from the others (the
    token-level mirror behind the accounting costs time inside the index calls),
    each request's time being its minimum over the repeats, with the garbage
    collector paused: what remains is the index's own cost, not a neighbour
    process's time slice or a collection of everyone's garbage.

    Returns:
        Totals and per-request lists (see the report's results.json).

    Raises:
        CapacityError: the capacity cannot hold the requests.
        CompareError: ``timing_repeats`` is not a positive int.
    """
    _positive("timing repeats", timing_repeats)
    num_blocks = spec.num_blocks(capacity_tokens)
    try:
        tracked, memory = _replay(workload, spec, capacity_tokens, concurrency, True, tick)
        timed = [
            _replay(workload, spec, capacity_tokens, concurrency, False, tick, pause_gc=True)[0]
            for _ in range(timing_repeats)
        ]
    except ReplayError as exc:
        raise CapacityError(
            f"capacity {capacity_tokens} tokens ({num_blocks} × {spec.block_size}-token blocks) "
            f"is too small for {workload.name!r} with {spec.label} at concurrency "
            f"{concurrency}: {exc}"
        ) from None
    records = tracked.records
    index_us = [min(col) * 1e6 for col in zip(*(t.request_seconds for t in timed), strict=True)]
    admit_us = [min(col) * 1e6 for col in zip(*(t.admit_seconds for t in timed), strict=True)]
    fastest = min(timed, key=lambda t: t.wall_seconds)
    prompt = sum(r.prompt_len for r in records)
    hit = sum(r.hit_tokens for r in records)
    bs = spec.block_size
    return {
        "backend": spec.label,
        "index": spec.index,
        "driver": spec.driver,
        "block_size": bs,
        "num_blocks": num_blocks,
        "capacity_tokens": num_blocks * bs,
        "requests": len(records),
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_ratio": hit / prompt if prompt else 0.0,
        "matched_tokens": sum(r.matched_tokens or 0 for r in records),
        "boundary_lost_tokens": sum(r.boundary_lost_tokens or 0 for r in records),
        "cap_lost_tokens": sum(r.cap_lost_tokens or 0 for r in records),
        "evicted_blocks": tracked.evicted_blocks,
        "evicted_tokens": tracked.evicted_blocks * bs,
        "peak_cached_blocks": tracked.peak_cached_blocks,
        "peak_cached_tokens": tracked.peak_cached_blocks * bs,
        "index_memory_bytes": memory,
        "index_us_p50": percentile(index_us, 50),
        "index_us_p99": percentile(index_us, 99),
        "index_us_mean": sum(index_us) / len(index_us) if index_us else 0.0,
        "admit_us_p50": percentile(admit_us, 50),
        "admit_us_p99": percentile(admit_us, 99),
        "timing_repeats": timing_repeats,
        "timing_runs_agree": all(
            [h["hit_tokens"] for h in t.hits] == [r.hit_tokens for r in records] for t in timed
        ),
        "seconds_by_call": dict(fastest.seconds_by_call),
        "wall_seconds_tracked": tracked.wall_seconds,
        "wall_seconds_timed": [t.wall_seconds for t in timed],
        "per_request": {
            "id": [r.request_id for r in records],
            "prompt_len": [r.prompt_len for r in records],
            "hit_tokens": [r.hit_tokens for r in records],
            "matched_tokens": [r.matched_tokens or 0 for r in records],
            "boundary_lost_tokens": [r.boundary_lost_tokens or 0 for r in records],
            "cap_lost_tokens": [r.cap_lost_tokens or 0 for r in records],
            "index_us": index_us,
            "admit_us": admit_us,
        },
    }


def run_sweep(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacities: Sequence[int],
    *,
    concurrency: int = 1,
    tick: Tick | None = None,
) -> dict[str, Any]:
    """Hit ratio (and evictions) of each backend at each capacity, without accounting.

    A capacity a backend cannot run at gives ``None`` for it.
    """
    ratios: dict[str, list[float | None]] = {b.label: [] for b in backends}
    evicted: dict[str, list[int | None]] = {b.label: [] for b in backends}
    n = len(workload.requests)
    for cap in capacities:
        for spec in backends:
            done = [0]

            def count(k: int, done: list[int] = done) -> None:
                done[0] += k
                if tick is not None:
                    tick(k)

            try:
                result, _ = _replay(workload, spec, cap, concurrency, False, count)
            except ReplayError:
                ratios[spec.label].append(None)
                evicted[spec.label].append(None)
                count(n - done[0])  # the requests the failed replay never reached
                continue
            ratios[spec.label].append(result.summary()["hit_ratio"])
            evicted[spec.label].append(result.evicted_blocks)
    return {"capacity_tokens": list(capacities), "hit_ratio": ratios, "evicted_blocks": evicted}


def select_strip_requests(results: Sequence[Mapping[str, Any]], limit: int = 6) -> list[int]:
    """Positions of a few telling requests for the strip plot, in arrival order.

    First those where some backend lost tokens to a block boundary, then those where
    the backends' hits differ, then those with a recomputed last block, then the rest.
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
    for test in (boundary, differ, capped, lambda _i: True):
        for i in range(n):
            if len(chosen) >= limit:
                return sorted(chosen)
            if i not in chosen and test(i):
                chosen.append(i)
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
    roomy = roomy_capacity(workload.requests, backends)
    cap = roomy if capacity_tokens is None else capacity_tokens
    if not sweep_points:
        return cap, []
    tight = min_capacity(workload.requests, backends, concurrency)
    return cap, sweep_capacities(tight, max(roomy, cap), sweep_points)


def compare_workload(
    workload: Workload,
    backends: Sequence[BackendSpec],
    capacity_tokens: int,
    sweep: Sequence[int] = (),
    *,
    concurrency: int = 1,
    timing_repeats: int = 3,
    tick: Tick | None = None,
) -> dict[str, Any]:
    """Every backend on one workload: :func:`run_backend` each, then the sweep.

    Each replay calls ``tick(1)`` per request: ``len(requests) * len(backends) *
    (1 + timing_repeats + len(sweep))`` in all.

    Raises:
        CapacityError: ``capacity_tokens`` cannot hold the requests (the sweep's
            capacities never raise; a failed point is ``None``).
    """
    rows = [
        run_backend(
            workload,
            b,
            capacity_tokens,
            concurrency=concurrency,
            timing_repeats=timing_repeats,
            tick=tick,
        )
        for b in backends
    ]
    swept = (
        run_sweep(workload, backends, sweep, concurrency=concurrency, tick=tick) if sweep else None
    )
    return {
        "name": workload.name,
        "source": workload.source,
        "num_requests": len(workload.requests),
        "prompt_tokens": sum(len(r.tokens) for r in workload.requests),
        "capacity_tokens": capacity_tokens,
        "concurrency": concurrency,
        "backends": rows,
        "sweep": swept,
        "strip_requests": select_strip_requests(rows),
    }
