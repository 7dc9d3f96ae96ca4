"""What a cluster run measures: per request, per replica, per run, and its invariants.

Load imbalance is the coefficient of variation of each replica's compute seconds;
the TTFT growth, the last quarter of arrivals' mean TTFT over the first quarter's.
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

__all__ = ["ClusterResult", "Invariants", "ReplicaSummary", "summarize_run"]


def _cv(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    average = mean(values)
    return statistics.pstdev(values) / average if average else 0.0


@dataclass(slots=True)
class ReplicaSummary:
    """One replica's share of a run."""

    replica: int
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    computed_prefill_tokens: int = 0
    busy_s: float = 0.0


@dataclass(slots=True)
class Invariants:
    """What must hold whatever the faults, as counted by the run (``phantom_blocks``:
    believed cached but not, allowed only when removals were dropped)."""

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
        lost, twice = self.lost_requests, self.duplicate_completions
        checks = (
            (lost, f"{len(lost)} lost requests: {lost[:5]}"),
            (twice, f"duplicate completions: {twice[:5]}"),
            (self.routed_to_dead, f"{self.routed_to_dead} decisions for a dead replica"),
            (self.served_by_dead, f"{self.served_by_dead} completions from a dead replica"),
            (self.unannounced_hits, f"hits on unannounced blocks: {self.unannounced_hits[:3]}"),
            (self.diverged, f"router view diverged: {self.diverged[:3]}"),
            (self.stale_view, f"index holds blocks for gone replicas {self.stale_view}"),
        )
        return [text for failed, text in checks if failed]


_FROM_REPLICA = (
    "num_requests", "hit_ratio", "prompt_tokens", "hit_tokens", "ttft_mean_s", "ttft_p50_s",
    "ttft_p90_s", "ttft_p99_s", "e2e_p50_s", "e2e_p99_s", "prefill_gpu_s",
)  # fmt: skip


def _ttft_growth(metrics: Sequence[RequestRow]) -> float:
    recs = sorted(metrics, key=lambda m: m.arrival_s)
    quarter = len(recs) // 4
    if quarter < 2:
        return math.nan
    first = mean([m.ttft_s for m in recs[:quarter]])
    last = mean([m.ttft_s for m in recs[-quarter:]])
    return last / first if first > 0 else math.nan


def summarize_run(
    requests: Sequence[RequestRow],
    replicas: Sequence[ReplicaSummary],
    *,
    swept: int,
    offered_arrivals: Sequence[float] | None = None,
    slo: Slo | None = None,
    closed_loop: bool = False,
) -> FleetSummary:
    """Fold a run's records into a :class:`~..sim.runs.FleetSummary` (latencies and totals
    as :func:`~..sim.metrics.summarize` folds a replica's, load as ``summarize_load``)."""
    busy = [r.busy_s for r in replicas]
    mean_busy = mean(busy)
    base = summarize(requests, busy_s=math.fsum(busy), num_steps=0, evicted_blocks=0)
    arrivals = [m.arrival_s for m in requests]
    span = max(arrivals, default=0.0) - min(arrivals, default=0.0)
    load = summarize_load(
        requests, offered_arrivals=offered_arrivals, slo=slo, closed_loop=closed_loop
    )
    pairs = [
        (r.predicted_hit_tokens, r.hit_tokens)
        for r in requests
        if r.predicted_hit_tokens is not None
    ]
    n = len(pairs)
    decisions = [r.decision_us for r in requests]
    hashes = [r.hash_us for r in requests]
    return FleetSummary(
        **{name: getattr(base, name) for name in _FROM_REPLICA},
        **{f.name: getattr(load, f.name) for f in fields(LoadSummary) if f.name != "num_requests"},
        num_replicas=len(replicas),
        load_cv=_cv(busy),
        load_max_over_mean=max(busy) / mean_busy if busy and mean_busy else math.nan,
        requests_cv=_cv([r.requests for r in replicas]),
        prompt_tokens_cv=_cv([r.prompt_tokens for r in replicas]),
        decision_p50_us=percentile(decisions, 50),
        decision_p99_us=percentile(decisions, 99),
        decision_cpu_p99_us=percentile([r.decision_cpu_us for r in requests], 99),
        hash_p50_us=percentile(hashes, 50),
        hash_p99_us=percentile(hashes, 99),
        overlap_predictions=n,
        overlap_mae_tokens=mean([abs(p - h) for p, h in pairs]),
        phantom_rate=sum(p > h for p, h in pairs) / n if n else math.nan,
        missed_rate=sum(p < h for p, h in pairs) / n if n else math.nan,
        rerouted_requests=sum(r.routes > 1 for r in requests),
        swept_reservations=swept,
        makespan_s=base.duration_s,
        offered_load=math.fsum(busy) / (len(busy) * span) if busy and span > 0 else math.nan,
        ttft_growth=_ttft_growth(requests),
    )


@dataclass
class ClusterResult:
    """Everything one cluster run produced: its labels, a row per finished request (in
    arrival order), a summary per replica that ran, the run's summary, the invariants
    and the counters of the event path, the index and the router."""

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
        """The run's row: labels, summary and checks."""
        checks = RunChecks(not self.invariants.broken(), self.invariants.phantom_blocks, self.stats)
        return RunRow(self.labels, (self.run, checks), self.requests)
