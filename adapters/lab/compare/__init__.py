"""Backends head to head on the same requests, at equal capacity: the ``compare`` bench.

:func:`compare_backends` with :class:`CompareOptions` is the Python entry point;
``prefixkv compare`` builds :class:`CompareSettings` from its flags and writes a
report. The modules, in the order a comparison uses them:

- :mod:`.spec`: backend specs and their parsing, the errors;
- :mod:`.plan`: resolved settings and the capacities each workload runs at;
- :mod:`.k_live`: each backend's K-live replay, the capacity sweep;
- :mod:`.arrival`: each backend's arrival-time run on its natural engine;
- :mod:`.run`: a whole comparison, its records and tidy tables;
- :mod:`.options`: the options a caller writes, and :func:`compare_backends`.
"""

import importlib
import warnings

from .arrival import ArrivalRun, TimeSettings
from .k_live import BackendRun, SweepPoint
from .options import CompareOptions, compare_backends
from .plan import CompareSettings, plan_comparison
from .run import Comparison, ComparisonTables, WorkloadResult, run_comparison
from .spec import BackendSpec, CapacityError, CompareError, parse_backends

__all__ = [
    "ArrivalRun",
    "BackendRun",
    "BackendSpec",
    "CapacityError",
    "CompareError",
    "CompareOptions",
    "CompareSettings",
    "Comparison",
    "ComparisonTables",
    "SweepPoint",
    "TimeSettings",
    "WorkloadResult",
    "compare_backends",
    "parse_backends",
    "plan_comparison",
    "run_comparison",
]

_MOVED = {
    "MAX_POOL_BLOCKS": "spec",
    "NATURAL_DRIVERS": "spec",
    "Bars": "spec",
    "RequestHits": "k_live",
    "options_text": "k_live",
    "percentile": "k_live",
    "run_backend": "k_live",
    "run_sweep": "k_live",
    "select_strip_requests": "k_live",
    "check_pool": "plan",
    "min_capacity": "plan",
    "plan_capacities": "plan",
    "roomy_capacity": "plan",
    "sweep_capacities": "plan",
    "CompareInterrupted": "run",
    "compare_workload": "run",
}
"""Names the old ``compare.py`` module exported that now live in one of the modules
above: they still import from here for one release, with a ``DeprecationWarning``."""


def __getattr__(name: str) -> object:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"{__name__}.{name} is now {__name__}.{module}.{name}; "
        "the old path goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
