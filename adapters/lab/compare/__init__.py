"""Backends head to head on the same requests, at equal capacity: the ``compare`` bench.

:func:`compare_backends` with :class:`CompareOptions` is the Python entry point;
``prefixkv compare`` builds :class:`CompareSettings` from its flags and writes a
report. The modules, in the order a comparison uses them:

- :mod:`.spec`: backend specs and their parsing, the errors;
- :mod:`.plan`: resolved settings and the capacities each workload runs at;
- :mod:`.k_live`: each backend's K-live replay, the capacity sweep;
- :mod:`.arrival`: each backend's arrival-time run under each scheduler asked for;
- :mod:`.run`: a whole comparison, its records and tidy tables;
- :mod:`.options`: the options a caller writes, and :func:`compare_backends`.
"""

from prefixkv.adapters.deprecated import moved_names

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
    "MAX_POOL_BLOCKS": f"{__name__}.spec:MAX_POOL_BLOCKS",
    "NATURAL_DRIVERS": f"{__name__}.spec:NATURAL_DRIVERS",
    "Bars": f"{__name__}.spec:Bars",
    "RequestHits": f"{__name__}.k_live:RequestHits",
    "options_text": f"{__name__}.k_live:options_text",
    "percentile": f"{__name__}.k_live:percentile",
    "run_backend": f"{__name__}.k_live:run_backend",
    "run_sweep": f"{__name__}.k_live:run_sweep",
    "select_strip_requests": f"{__name__}.k_live:select_strip_requests",
    "check_pool": f"{__name__}.plan:check_pool",
    "min_capacity": f"{__name__}.plan:min_capacity",
    "plan_capacities": f"{__name__}.plan:plan_capacities",
    "roomy_capacity": f"{__name__}.plan:roomy_capacity",
    "sweep_capacities": f"{__name__}.plan:sweep_capacities",
    "CompareInterrupted": f"{__name__}.run:CompareInterrupted",
    "compare_workload": f"{__name__}.run:compare_workload",
}
"""Names the old ``compare.py`` module exported that now live in one of the modules
above: they still import from here for one release, with a ``DeprecationWarning``."""

__getattr__ = moved_names(__name__, _MOVED)
