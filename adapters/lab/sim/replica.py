"""Arrival-time replay of one engine replica: a discrete-event loop in virtual time.

Two kinds of event move the clock: a request arrives, or a step ends. While the
replica is busy, steps run back to back and requests that arrived during a step
join the waiting queue when it ends (where the next ``schedule`` sees them); when
it is idle, the clock jumps to the next arrival. A step lasts what the cost
profile says its work costs. Nothing reads the wall clock, so a run is a pure
function of its requests, arrivals, settings and profile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.servable import unservable
from prefixkv.indexes.base import PrefixIndex
from prefixkv.storage.allocator import BlockAllocator

from .config import SimConfig
from .errors import SimConfigError, SimError, SimInputError, SimUnservableError
from .metrics import RequestMetrics, SimResult, summarize
from .profile import CostProfile, load_profile
from .replica_scheduler import ReplicaScheduler, SimSeq
from .requests import SimRequest

__all__ = ["IndexFactory", "simulate"]

IndexFactory = Callable[[], PrefixIndex]
"""Makes a fresh, empty index for one run (``BackendSpec.make``, ``lambda: make_index(...)``)."""


def _check_servable(
    request: SimRequest, num_blocks: int, block_size: int, config: SimConfig
) -> None:
    reason = unservable(
        len(request.prompt),
        request.output_len,
        block_size=block_size,
        num_blocks=num_blocks,
        enable_chunked_prefill=config.enable_chunked_prefill,
        max_num_batched_tokens=config.max_num_batched_tokens,
    )
    if reason is not None:
        raise SimUnservableError(f"request {request.id!r} {reason}")


def simulate(
    requests: Iterable[SimRequest],
    index_factory: IndexFactory,
    capacity_tokens: int,
    config: SimConfig | None = None,
    profile: CostProfile | None = None,
    *,
    labels: Mapping[str, Any] | None = None,
    progress: Callable[[int], object] | None = None,
) -> SimResult:
    """Replay ``requests`` at their arrival times through one simulated replica.

    Args:
        requests: in arrival order, each with an arrival time (see
            :func:`~.arrivals.with_arrivals`); read lazily, so a streamed trace works.
        index_factory: makes the replica's (empty) prefix index.
        capacity_tokens: KV pool size in tokens; the pool has
            ``capacity_tokens // block_size`` blocks.
        config: scheduler settings (default ``SimConfig()``).
        profile: step costs (default: the shipped default profile).
        labels: extra columns for the result's tables (workload, arrivals, ...).
        progress: called with a request's prompt tokens when it finishes (a
            progress bar's ``update``).

    Returns:
        Per-request records and the run's summary; ``labels`` holds the index,
        block size, capacity, scheduler settings, profile name and ``labels``.

    Raises:
        SimConfigError: a non-positive capacity.
        SimInputError: a request without an arrival, out of order, or a repeated id.
        SimUnservableError: a request that cannot fit the pool even alone.

    Cost: O(steps x running requests) scheduler work plus the index's operations;
    a step is O(1) per running request when no block is added.
    """
    cfg = SimConfig() if config is None else config
    prof = load_profile() if profile is None else profile
    if type(capacity_tokens) is not int or capacity_tokens < 1:
        raise SimConfigError(f"capacity_tokens must be a positive int, got {capacity_tokens!r}")
    index = index_factory()
    block_size = index.block_size
    num_blocks = capacity_tokens // block_size
    if num_blocks < 1:
        raise SimConfigError(
            f"capacity_tokens {capacity_tokens} holds no block of {block_size} tokens"
        )
    allocator = BlockAllocator(num_blocks)
    manager = CacheManager(index, allocator)
    sched = ReplicaScheduler(manager, allocator, index, cfg, prof)
    records: list[RequestMetrics] = []
    seen: set[str] = set()
    arrivals = iter(requests)
    pending = next(arrivals, None)
    last_arrival = 0.0
    now = busy = 0.0
    num_steps = 0
    while True:
        while pending is not None and _arrival(pending, last_arrival) <= now:
            _check_servable(pending, num_blocks, block_size, cfg)
            if pending.id in seen:
                raise SimInputError(f"request id {pending.id!r} appears twice")
            seen.add(pending.id)
            last_arrival = _arrival(pending, last_arrival)
            m = RequestMetrics(pending.id, last_arrival, len(pending.prompt), pending.output_len)
            records.append(m)
            sched.add(SimSeq(pending, m))
            pending = next(arrivals, None)
        if not sched.has_unfinished():
            if pending is None:
                break
            now = _arrival(pending, last_arrival)
            continue
        plan = sched.schedule(now)
        if not plan.chunks:
            raise SimError(  # pragma: no cover - the servability check rules this out
                f"no request could be scheduled at t={now:.6f} s with "
                f"{len(sched.waiting)} waiting and {len(sched.running)} running"
            )
        seconds = plan.seconds(prof)
        now += seconds
        busy += seconds
        num_steps += 1
        finished = sched.complete(plan, now)
        if progress is not None and finished:
            progress(sum(len(s.request.prompt) for s in finished))
        if cfg.check_invariants:
            manager.check_invariants()
    all_labels: dict[str, Any] = {
        "index": type(index).__name__,
        "block_size": block_size,
        "capacity_tokens": capacity_tokens,
        **cfg.as_dict(),
        "profile": prof.name,
        **(labels or {}),
    }
    run = summarize(
        records,
        busy_s=busy,
        num_steps=num_steps,
        evicted_blocks=manager.totals.num_evicted_blocks,
    )
    return SimResult(all_labels, records, run)


def _arrival(request: SimRequest, last: float) -> float:
    t = request.arrival
    if t is None:
        raise SimInputError(
            f"request {request.id!r} has no arrival time; stamp it with with_arrivals()"
        )
    if t < last:
        raise SimInputError(
            f"request {request.id!r} arrives at {t} s, before the previous one ({last} s); "
            "requests must come in arrival order"
        )
    return t
