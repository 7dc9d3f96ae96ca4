"""What a run measures: one record per request (every kind of run) and one summary per run.

Percentiles interpolate linearly between ranks, as ``numpy.percentile`` does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "RequestRow",
    "RunMetrics",
    "SimResult",
    "mean",
    "percentile",
    "request_table",
    "summarize",
]


def percentile(values: Sequence[float], q: int) -> float:
    """The ``q``-th percentile (an int in 1..99), as ``numpy.percentile``; NaN for none."""
    if not values:
        return math.nan
    if len(values) == 1:
        return float(values[0])
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass(slots=True)
class RequestRow:
    """What a run records per request, from the K-live replay to the cluster: the cache's
    part always; on a clock the timeline (virtual seconds) and prefill GPU-seconds; in a
    K-live replay the BB-8 accounting and index times (wall us); behind a router, the
    route. :meth:`as_row` gives the filled parts' columns.

    Attributes:
        arrival_s: NaN for a K-live row (no clock).
        hit_tokens: prompt tokens served from the cache, counted at its first admission.
        prefill_gpu_s: marginal GPU time of its prefill chunks; the per-step ``step_s`` left out.
        replica: the replica that finished it; ``None``: not routed.
        routes: routing decisions; more than 1: rerouted after a replica died.
        predicted_hit_tokens: the router index's promise; ``None``: the policy reads no index.
        decision_cpu_us: CPU (not wall) microseconds of the last decision.
    """

    request_id: str
    arrival_s: float = math.nan
    prompt_tokens: int = 0
    output_tokens: int = 0
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    finish_s: float = math.nan
    hit_tokens: int = 0
    computed_prefill_tokens: int = 0
    recomputed_tokens: int = 0
    num_preemptions: int = 0
    prefill_gpu_s: float = 0.0
    saved_gpu_s: float = 0.0
    matched_tokens: int = 0
    boundary_lost_tokens: int = 0
    cap_lost_tokens: int = 0
    index_us: float = math.nan
    admit_us: float = math.nan
    replica: int | None = None
    routes: int = 0
    predicted_hit_tokens: int | None = None
    decision_us: float = math.nan
    hash_us: float = math.nan
    decision_cpu_us: float = math.nan

    @property
    def queueing_delay_s(self) -> float:
        """Arrival to the first step that computed any of it."""
        return self.first_scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        """Arrival to the end of its first token's step."""
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        """Arrival to the end of its last token's step."""
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (NaN for one-token outputs)."""
        if self.output_tokens < 2:
            return math.nan
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def uncached_prefill_tokens(self) -> int:
        """Prompt tokens not served from the cache at first admission."""
        return self.prompt_tokens - self.hit_tokens

    def route(
        self,
        replica: int,
        routes: int,
        predicted_hit_tokens: int | None,
        decision_us: float,
        hash_us: float,
        decision_cpu_us: float,
    ) -> RequestRow:
        """Note its last route; ``self``."""
        self.replica, self.routes = replica, routes
        self.predicted_hit_tokens = predicted_hit_tokens
        self.decision_us, self.hash_us, self.decision_cpu_us = decision_us, hash_us, decision_cpu_us
        return self

    def as_row(self) -> dict[str, Any]:
        """The filled parts' columns, flat."""
        if math.isnan(self.arrival_s):
            return {name: getattr(self, name) for name in _K_LIVE_COLUMNS}
        row = {name: getattr(self, name) for name in _CLOCK_COLUMNS}
        if self.replica is not None:
            row.update((name, getattr(self, name)) for name in _ROUTE_COLUMNS)
        return row


# The parts of a row, in the fields' order (the order requests.csv has always had).
_FIELDS = tuple(f.name for f in fields(RequestRow))
_K_LIVE_AT, _ROUTE_AT = _FIELDS.index("matched_tokens"), _FIELDS.index("replica")
_DERIVED = ("queueing_delay_s", "ttft_s", "e2e_s", "tpot_s", "uncached_prefill_tokens")
_CLOCK_COLUMNS = (*_FIELDS[:_K_LIVE_AT], *_DERIVED)
_K_LIVE_COLUMNS = (*_FIELDS[:1], *_FIELDS[2:3], *_FIELDS[7:8], _DERIVED[-1],
                   *_FIELDS[_K_LIVE_AT:_ROUTE_AT])  # fmt: skip
_ROUTE_COLUMNS = _FIELDS[_ROUTE_AT:]


def request_table(
    labels: Mapping[str, Any],
    requests: Iterable[RequestRow],
    *,
    keys: Sequence[str] | None = None,
    position: bool = True,
) -> list[dict[str, Any]]:
    """The tidy request rows of one run: its labels (``keys`` of them when given), the
    request's ``position`` (when asked), then :meth:`RequestRow.as_row`."""
    head = dict(labels) if keys is None else {k: labels[k] for k in keys}
    return [
        {**head, **({"position": k} if position else {}), **r.as_row()}
        for k, r in enumerate(requests)
    ]


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """One run's summary: the percentiles vLLM's and SGLang's serving benchmarks report
    (seconds; throughputs per second of ``duration_s``, first arrival to last finish)
    and the cache totals: prompt and hit tokens at each request's first admission;
    computed prefill includes recompute; saved GPU-seconds over every admission."""

    num_requests: int
    duration_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    queueing_mean_s: float
    queueing_p90_s: float
    tpot_p50_s: float
    request_throughput: float
    output_throughput: float
    prompt_tokens: int
    hit_tokens: int
    uncached_prefill_tokens: int
    hit_ratio: float
    computed_prefill_tokens: int
    prefill_gpu_s: float
    saved_gpu_s: float
    busy_s: float
    num_steps: int
    num_preemptions: int
    evicted_blocks: int

    def as_row(self) -> dict[str, Any]:
        """Every field, flat."""
        return asdict(self)


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean (``math.fsum``); NaN for no values."""
    return math.fsum(values) / len(values) if values else math.nan


def summarize(
    records: Iterable[RequestRow], *, busy_s: float, num_steps: int, evicted_blocks: int
) -> RunMetrics:
    """Fold finished requests' records into a :class:`RunMetrics`."""
    recs = list(records)
    ttft = [r.ttft_s for r in recs]
    e2e = [r.e2e_s for r in recs]
    queueing = [r.queueing_delay_s for r in recs]
    tpot = [t for t in (r.tpot_s for r in recs) if not math.isnan(t)]
    start = min((r.arrival_s for r in recs), default=0.0)
    end = max((r.finish_s for r in recs), default=0.0)
    duration = end - start
    prompt = sum(r.prompt_tokens for r in recs)
    hit = sum(r.hit_tokens for r in recs)
    rate = (lambda n: n / duration) if duration > 0 else (lambda n: math.nan)
    return RunMetrics(
        num_requests=len(recs),
        duration_s=duration,
        ttft_mean_s=mean(ttft),
        ttft_p50_s=percentile(ttft, 50),
        ttft_p90_s=percentile(ttft, 90),
        ttft_p99_s=percentile(ttft, 99),
        e2e_p50_s=percentile(e2e, 50),
        e2e_p90_s=percentile(e2e, 90),
        e2e_p99_s=percentile(e2e, 99),
        queueing_mean_s=mean(queueing),
        queueing_p90_s=percentile(queueing, 90),
        tpot_p50_s=percentile(tpot, 50),
        request_throughput=rate(len(recs)),
        output_throughput=rate(sum(r.output_tokens for r in recs)),
        prompt_tokens=prompt,
        hit_tokens=hit,
        uncached_prefill_tokens=prompt - hit,
        hit_ratio=hit / prompt if prompt else 0.0,
        computed_prefill_tokens=sum(r.computed_prefill_tokens for r in recs),
        prefill_gpu_s=math.fsum(r.prefill_gpu_s for r in recs),
        saved_gpu_s=math.fsum(r.saved_gpu_s for r in recs),
        busy_s=busy_s,
        num_steps=num_steps,
        num_preemptions=sum(r.num_preemptions for r in recs),
        evicted_blocks=evicted_blocks,
    )


@dataclass(frozen=True)
class SimResult:
    """One simulated run: its labels, one record per request in arrival order, the summary."""

    labels: Mapping[str, Any]
    requests: list[RequestRow] = field(repr=False)
    run: RunMetrics
