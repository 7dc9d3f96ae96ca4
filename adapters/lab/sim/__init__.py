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
    with_arrivals,
)
from .calibration import StepSample, calibrate, fit_profile
from .config import BATCHING_MODES, Batching, SimSettings
from .errors import (
    ProfileError,
    ProfileRangeWarning,
    SimInputError,
    SimSettingsError,
    SimUnservableError,
)
from .metrics import SimResult, percentile
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
from .requests import SimRequest, from_trace

__all__ = [
    "ARRIVAL_PROCESSES",
    "BATCHING_MODES",
    "COEFFICIENTS",
    "DEFAULT_PROFILE",
    "QUEUE_ORDERS",
    "ArrivalProcess",
    "Batching",
    "CostProfile",
    "IndexFactory",
    "ProfileError",
    "ProfileRangeWarning",
    "QueueOrder",
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
    "from_trace",
    "load_profile",
    "percentile",
    "poisson_arrivals",
    "save_profile",
    "simulate",
    "with_arrivals",
]
