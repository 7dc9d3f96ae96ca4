"""Deprecated: the comparison's Python entry point lives in :mod:`.compare` now.

``from prefixkv.adapters.lab.comparison import compare_backends`` (and the module's
other names) still works for one release, with a ``DeprecationWarning``; import them
from ``prefixkv.adapters.lab.compare``.
"""

from prefixkv.adapters.deprecated import moved_names

_COMPARE = "prefixkv.adapters.lab.compare"
_MOVED = {
    "SWEEP_POINTS": f"{_COMPARE}.plan:SWEEP_POINTS",
    "CompareOptions": f"{_COMPARE}.plan:CompareSettings",  # a caller writes CompareOptions now
    "Comparison": f"{_COMPARE}:Comparison",
    "ComparisonTables": f"{_COMPARE}:ComparisonTables",
    "WorkloadPlan": f"{_COMPARE}.plan:WorkloadPlan",
    "compare_backends": f"{_COMPARE}:compare_backends",
    "default_boundary_accounting": f"{_COMPARE}.plan:default_boundary_accounting",
    "plan_comparison": f"{_COMPARE}:plan_comparison",
    "run_comparison": f"{_COMPARE}:run_comparison",
}
"""The old module's names -> where they are now."""

__getattr__ = moved_names(__name__, _MOVED)
