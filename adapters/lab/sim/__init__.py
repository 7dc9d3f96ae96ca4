"""Arrival-time simulation of one engine replica: queueing, scheduling and a cost model.

``simulate(requests, index_factory, capacity_tokens, config, profile)`` replays
timed requests through vLLM- or SGLang-style scheduling over a
:class:`~prefixkv.adapters.CacheManager` and prices every step with a cost profile,
giving per-request TTFT, queueing delay and end-to-end latency, and per-run
percentiles, throughput and the prefill GPU-seconds the prefix cache saved.
"""

from .arrivals import (
    ARRIVAL_PROCESSES,
    ArrivalProcess,
    fixed_rate_arrivals,
    poisson_arrivals,
    scaled_arrivals,
    with_arrivals,
)
from .config import BATCHING_MODES, POLICIES, Batching, Policy, SimConfig
from .errors import ProfileError, SimConfigError, SimError, SimInputError, SimUnservableError
from .metrics import RequestMetrics, RunMetrics, SimResult, percentile, summarize
from .profile import (
    COEFFICIENTS,
    DEFAULT_PROFILE,
    CostProfile,
    attention_pairs,
    available_profiles,
    load_profile,
    save_profile,
)
from .replica import IndexFactory, simulate
from .requests import FILLER_TOKEN, TimedRequest, timed_request

__all__ = [
    "ARRIVAL_PROCESSES",
    "BATCHING_MODES",
    "COEFFICIENTS",
    "DEFAULT_PROFILE",
    "FILLER_TOKEN",
    "POLICIES",
    "ArrivalProcess",
    "Batching",
    "CostProfile",
    "IndexFactory",
    "Policy",
    "ProfileError",
    "RequestMetrics",
    "RunMetrics",
    "SimConfig",
    "SimConfigError",
    "SimError",
    "SimInputError",
    "SimResult",
    "SimUnservableError",
    "TimedRequest",
    "attention_pairs",
    "available_profiles",
    "fixed_rate_arrivals",
    "load_profile",
    "percentile",
    "poisson_arrivals",
    "save_profile",
    "scaled_arrivals",
    "simulate",
    "summarize",
    "timed_request",
    "with_arrivals",
]
