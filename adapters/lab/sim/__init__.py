"""Arrival-time simulation of one engine replica: queueing, scheduling and a cost model.

``simulate(requests, index_factory, capacity_tokens, config, profile)`` replays
timed requests through vLLM- or SGLang-style scheduling over a seat of
:mod:`.seats` (the shipped engine classes: vLLM's ``KVCacheManager``, SGLang's
``PrefixCache``) on a :class:`~.runner.Replica` and prices every step with a cost profile,
giving per-request TTFT, queueing delay and end-to-end latency, and per-run
percentiles, throughput and the prefill GPU-seconds the prefix cache saved.

The names below load their module on first use (:func:`__getattr__`), so a run that
needs one part (``prefixkv replay``: the K-live seats) does not load the rest (the
calibration, the arrival-time replica).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_names

if TYPE_CHECKING:
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

_HOMES = {
    "ARRIVAL_PROCESSES": "arrivals",
    "ArrivalProcess": "arrivals",
    "BATCHING_MODES": "config",
    "Batching": "config",
    "COEFFICIENTS": "profile",
    "CostProfile": "profile",
    "DEFAULT_PROFILE": "profile",
    "IndexFactory": "replica",
    "ProfileError": "errors",
    "ProfileRangeWarning": "errors",
    "QUEUE_ORDERS": "queue_order",
    "QueueOrder": "queue_order",
    "SimInputError": "errors",
    "SimRequest": "requests",
    "SimResult": "metrics",
    "SimSettings": "config",
    "SimSettingsError": "errors",
    "SimUnservableError": "errors",
    "StepSample": "calibration",
    "attention_pairs": "profile",
    "available_profiles": "profile",
    "calibrate": "calibration",
    "fit_profile": "calibration",
    "fixed_rate_arrivals": "arrivals",
    "from_trace": "requests",
    "load_profile": "profile",
    "percentile": "metrics",
    "poisson_arrivals": "arrivals",
    "save_profile": "profile",
    "simulate": "replica",
    "with_arrivals": "arrivals",
}
"""Each name and the module that defines it, loaded on first use."""


_lookup = lazy_names(__name__, _HOMES)


def __getattr__(name: str) -> object:
    return _lookup(name)


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
