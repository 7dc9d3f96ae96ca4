"""What a cluster run measures: per request, per replica, per run, and its invariants.

Hit ratio is prompt tokens served from cache at each request's (last) first
admission over all prompt tokens, Dynamo's "cache efficiency". Load imbalance is the
coefficient of variation (population standard deviation over mean) of the seconds
each replica spent computing: what herding costs shows up there, whatever the
policy's own load measure. Predicted overlap is what the router's index promised for
the chosen worker (capped as admission caps), realized is what the replica then hit.
Overload shows in two figures: the offered load (compute seconds the replicas needed
per second of arrivals, per replica: above 1 the queues must grow) and the TTFT growth
(the last quarter of arrivals' mean TTFT over the first quarter's); beside them the
offered and achieved request rates and the overload verdict every timed run gives
(:mod:`~prefixkv.adapters.lab.sim.load`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from prefixkv.adapters.lab.sim.load import LoadSummary, Slo, summarize_load
from prefixkv.adapters.lab.sim.metrics import RequestRow, mean, percentile, summarize
from prefixkv.adapters.lab.sim.runs import FleetSummary, RunChecks, RunRow

__all__ = [
    "ClusterResult",
    "Invariants",
    "ReplicaSummary",
    "coefficient_of_variation",
    "summarize_run",
    "ttft_growth",
]


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population standard deviation over the mean (0 for no spread, NaN for no values)."""
    if not values:
        return math.nan
    average = mean(values)
    return statistics.pstdev(values) / average if average else 0.0


@dataclass(slots=True)
class ReplicaSummary:
    """One replica's share of a run."""

    replica: int
    requests: int
    prompt_tokens: int
    hit_tokens: int
    computed_prefill_tokens: int
    busy_s: float


@dataclass(slots=True)
class Invariants:
    """What must hold whatever the faults ("stale information may cost hits, never
    correctness"), as counted by the run.

    Attributes:
        lost_requests: requests that never finished.
        duplicate_completions: requests that finished twice.
        routed_to_dead: decisions for a replica the router knew dead.
        served_by_dead: completions from a replica after it died.
        unannounced_hits: admissions that hit blocks the replica never announced.
        diverged: replicas whose router view differs from their cache after the run
            (beyond what the faults allow: see ``phantom_blocks``).
        stale_view: dead or removed replicas the index still holds blocks for.
        phantom_blocks: blocks the router believes cached that are not (allowed
            only when removals were dropped; costs hits, never correctness).
    """

    lost_requests: list[str] = field(default_factory=list)
    duplicate_completions: list[str] = field(default_factory=list)
    routed_to_dead: int = 0
    served_by_dead: int = 0
    unannounced_hits: list[str] = field(default_factory=list)
    diverged: list[str] = field(default_factory=list)
    stale_view: list[int] = field(default_factory=list)
    phantom_blocks: int = 0

    def broken(self) -> list[str]:
        """Descriptions of the invariants that do not hold (empty when all hold)."""
        out = []
        if self.lost_requests:
            out.append(f"{len(self.lost_requests)} lost requests: {self.lost_requests[:5]}")
        if self.duplicate_completions:
            out.append(f"duplicate completions: {self.duplicate_completions[:5]}")
        if self.routed_to_dead:
            out.append(f"{self.routed_to_dead} decisions for a dead replica")
        if self.served_by_dead:
            out.append(f"{self.served_by_dead} completions from a dead replica")
        if self.unannounced_hits:
            out.append(f"hits on unannounced blocks: {self.unannounced_hits[:3]}")
        if self.diverged:
            out.append(f"router view diverged: {self.diverged[:3]}")
        if self.stale_view:
            out.append(f"index holds blocks for gone replicas {self.stale_view}")
        return out


_FROM_REPLICA = (
    "num_requests", "hit_ratio", "prompt_tokens", "hit_tokens", "ttft_mean_s", "ttft_p50_s",
    "ttft_p90_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "prefill_gpu_s",
)  # fmt: skip
"""The columns the fleet's requests give as one replica's would (:func:`summarize`)."""


def ttft_growth(metrics: Sequence[RequestRow]) -> float:
    """Mean TTFT of the last quarter of arrivals over the first quarter's (NaN for
    fewer than 8 requests or a zero first quarter): near 1 in a steady state, large
    when queues grow through the run."""
    recs = sorted(metrics, key=lambda m: m.arrival_s)
    quarter = len(recs) // 4
    if quarter < 2:
        return math.nan
    first = mean([m.ttft_s for m in recs[:quarter]])
    last = mean([m.ttft_s for m in recs[-quarter:]])
    return last / first if first > 0 else math.nan


def _overlap(requests: Sequence[RequestRow]) -> dict[str, Any]:
    """The index's promises against the hits they led to: how many, the mean absolute
    error, and the shares above (phantom) and below (missed) the realized hit."""
    pairs = [
        (r.predicted_hit_tokens, r.hit_tokens)
        for r in requests
        if r.predicted_hit_tokens is not None
    ]
    n = len(pairs)
    return {
        "overlap_predictions": n,
        "overlap_mae_tokens": mean([abs(p - h) for p, h in pairs]),
        "phantom_rate": sum(p > h for p, h in pairs) / n if n else math.nan,
        "missed_rate": sum(p < h for p, h in pairs) / n if n else math.nan,
    }


def summarize_run(
    requests: Sequence[RequestRow],
    replicas: Sequence[ReplicaSummary],
    *,
    swept: int,
    offered_arrivals: Sequence[float] | None = None,
    slo: Slo | None = None,
    closed_loop: bool = False,
) -> FleetSummary:
    """Fold a run's records into a :class:`~..sim.runs.FleetSummary` (the latencies and
    totals as one replica's :func:`~prefixkv.adapters.lab.sim.metrics.summarize` folds them);
    ``offered_arrivals``, ``slo`` and ``closed_loop`` as
    :func:`~prefixkv.adapters.lab.sim.load.summarize_load` takes them."""
    busy = [r.busy_s for r in replicas]
    mean_busy = mean(busy)
    base = summarize(requests, busy_s=math.fsum(busy), num_steps=0, evicted_blocks=0)
    arrivals = [m.arrival_s for m in requests]
    span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    load = summarize_load(
        requests, offered_arrivals=offered_arrivals, slo=slo, closed_loop=closed_loop
    )
    return FleetSummary(
        **{name: getattr(base, name) for name in _FROM_REPLICA},
        **{f.name: getattr(load, f.name) for f in fields(LoadSummary) if f.name != "num_requests"},
        num_replicas=len(replicas),
        load_cv=coefficient_of_variation(busy),
        load_max_over_mean=max(busy) / mean_busy if busy and mean_busy else math.nan,
        requests_cv=coefficient_of_variation([r.requests for r in replicas]),
        prompt_tokens_cv=coefficient_of_variation([r.prompt_tokens for r in replicas]),
        **_router_times(requests),
        **_overlap(requests),
        rerouted_requests=sum(r.routes > 1 for r in requests),
        swept_reservations=swept,
        makespan_s=base.duration_s,
        offered_load=math.fsum(busy) / (len(busy) * span) if busy and span > 0 else math.nan,
        ttft_growth=ttft_growth(requests),
    )


def _router_times(requests: Sequence[RequestRow]) -> dict[str, Any]:
    """The router's decision and hashing times, in microseconds."""
    decisions = [r.decision_us for r in requests]
    hashes = [r.hash_us for r in requests]
    return {
        "decision_p50_us": percentile(decisions, 50),
        "decision_p99_us": percentile(decisions, 99),
        "decision_cpu_p99_us": percentile([r.decision_cpu_us for r in requests], 99),
        "hash_p50_us": percentile(hashes, 50),
        "hash_p99_us": percentile(hashes, 99),
    }


@dataclass
class ClusterResult:
    """Everything one cluster run produced.

    Attributes:
        labels: what the run was (policy, index, replicas, capacity, faults, ...).
        requests: one record per finished request, in arrival order.
        replicas: one summary per replica that ever ran.
        run: the summary.
        invariants: what was checked.
        stats: counters of the event path, the index and the router.
    """

    labels: Mapping[str, Any]
    requests: list[RequestRow] = field(repr=False)
    replicas: list[ReplicaSummary]
    run: FleetSummary
    invariants: Invariants
    stats: dict[str, Any]

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming every broken invariant."""
        broken = self.invariants.broken()
        if broken:
            raise AssertionError(f"{self.labels.get('policy')}: " + "; ".join(broken))

    def run_row(self) -> RunRow:
        """The run's row: its labels, its :class:`~..sim.runs.FleetSummary` and its
        :class:`~..sim.runs.RunChecks` (the invariants and counters)."""
        checks = RunChecks(not self.invariants.broken(), self.invariants.phantom_blocks, self.stats)
        return RunRow(self.labels, (self.run, checks), self.requests)
