"""Deprecated: the comparison's Python entry point lives in :mod:`.compare` now.

``from prefixkv.adapters.lab.comparison import compare_backends`` (and the module's
other names) still works for one release, with a ``DeprecationWarning``; import them
from ``prefixkv.adapters.lab.compare``.
"""

import importlib
import warnings

_MOVED = {
    "SWEEP_POINTS": "plan.SWEEP_POINTS",
    "CompareOptions": "plan.CompareSettings",  # what a caller writes is CompareOptions now
    "Comparison": "run.Comparison",
    "ComparisonTables": "run.ComparisonTables",
    "WorkloadPlan": "plan.WorkloadPlan",
    "compare_backends": "options.compare_backends",
    "default_boundary_accounting": "plan.default_boundary_accounting",
    "plan_comparison": "plan.plan_comparison",
    "run_comparison": "run.run_comparison",
}
"""The old module's names -> where they are under ``prefixkv.adapters.lab.compare``."""


def __getattr__(name: str) -> object:
    new = _MOVED.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attr = new.partition(".")
    warnings.warn(
        f"prefixkv.adapters.lab.comparison.{name} is now "
        f"prefixkv.adapters.lab.compare.{module}.{attr}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(f"prefixkv.adapters.lab.compare.{module}"), attr)
