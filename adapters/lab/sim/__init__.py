"""Arrival-time simulation of one engine replica; names load their module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixkv.indexes.lazy import lazy_names

if TYPE_CHECKING:
    from .arrivals import (
        ARRIVAL_PROCESSES,
        ArrivalProcess,
        fixed_rate_arrivals,
        poisson_arrivals,
        with_arrivals,
    )
    from .calibration import StepSample, fit_profile
    from .config import BATCHING_MODES, QUEUE_ORDERS, Batching, QueueOrder, SimSettings
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
    from .replica import IndexFactory, simulate
    from .requests import SimRequest, from_trace

_HOMES = {
    name: home
    for home, names in {
        "arrivals": "ARRIVAL_PROCESSES ArrivalProcess fixed_rate_arrivals poisson_arrivals"
        " with_arrivals",
        "calibration": "StepSample fit_profile",
        "config": "BATCHING_MODES Batching QUEUE_ORDERS QueueOrder SimSettings",
        "errors": "ProfileError ProfileRangeWarning SimInputError SimSettingsError"
        " SimUnservableError",
        "metrics": "SimResult percentile",
        "profile": "COEFFICIENTS CostProfile DEFAULT_PROFILE attention_pairs available_profiles"
        " load_profile save_profile",
        "replica": "IndexFactory simulate",
        "requests": "SimRequest from_trace",
    }.items()
    for name in names.split()
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
