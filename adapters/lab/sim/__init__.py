"""Arrival-time simulation of one engine replica: queueing, scheduling and a cost model.

``simulate(requests, index_factory, capacity_tokens, config, profile)`` replays
timed requests through vLLM- or SGLang-style scheduling over a seat of
:mod:`.seats` (the shipped engine classes: vLLM's ``KVCacheManager``, SGLang's
``PrefixCache``) on a :class:`~.runner.Replica` and prices every step with a cost profile,
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
from .calibration import StepSample, calibrate, fit_profile, measure_engine
from .config import BATCHING_MODES, Batching, SimSettings
from .errors import (
    ProfileError,
    ProfileRangeWarning,
    SimError,
    SimInputError,
    SimSettingsError,
    SimUnservableError,
)
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
from .queue_order import QUEUE_ORDERS, QueueOrder
from .replica import IndexFactory, simulate
from .requests import FILLER_TOKEN, SimRequest, sim_request

__all__ = [
    "ARRIVAL_PROCESSES",
    "BATCHING_MODES",
    "COEFFICIENTS",
    "DEFAULT_PROFILE",
    "FILLER_TOKEN",
    "QUEUE_ORDERS",
    "ArrivalProcess",
    "Batching",
    "CostProfile",
    "IndexFactory",
    "ProfileError",
    "ProfileRangeWarning",
    "QueueOrder",
    "RequestMetrics",
    "RunMetrics",
    "SimError",
    "SimInputError",
    "SimRequest",
    "SimResult",
    "SimSettings",
    "SimSettingsError",
    "SimUnservableError",
    "StepSample",
    "attention_pairs",
    "available_profiles",
    "calibrate",
    "fit_profile",
    "fixed_rate_arrivals",
    "load_profile",
    "measure_engine",
    "percentile",
    "poisson_arrivals",
    "save_profile",
    "scaled_arrivals",
    "sim_request",
    "simulate",
    "summarize",
    "with_arrivals",
]
