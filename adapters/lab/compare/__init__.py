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
