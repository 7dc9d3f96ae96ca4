"""Backends head to head on the same requests, at equal capacity: the ``compare`` bench.

:func:`compare_backends` with :class:`CompareOptions` is the Python entry point;
``prefixkv compare`` builds :class:`CompareSettings` from its flags and writes a
report. The modules, in the order a comparison uses them:

- :mod:`..backends` (beside this package, as ``prefixkv replay`` runs one without it):
  backend specs and their parsing, the capacities that fit them, the errors;
- :mod:`.plan`: resolved settings and the capacities each workload runs at;
- :mod:`.k_live`: each backend's K-live replay, the capacity sweep;
- :mod:`.arrival`: each backend's arrival-time run under each scheduler asked for;
- :mod:`.run`: a whole comparison, its records and tidy tables;
- :mod:`.options`: the options a caller writes, and :func:`compare_backends`.
"""

from ..backends import CompareError, parse_backends
from .arrival import TimeSettings
from .options import CompareOptions, compare_backends
from .plan import CompareSettings
from .run import Comparison

__all__ = [
    "CompareError",
    "CompareOptions",
    "CompareSettings",
    "Comparison",
    "TimeSettings",
    "compare_backends",
    "parse_backends",
]
