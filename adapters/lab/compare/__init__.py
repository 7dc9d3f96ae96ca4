"""Backends head to head on the same requests, at equal capacity: the ``compare`` bench.

:func:`compare_backends` with :class:`CompareOptions` is the Python entry point; ``prefixkv
compare`` resolves its flags into :class:`CompareSettings` (:mod:`.plan`), runs each backend
K-live (:mod:`.k_live`, :mod:`.anchors`) and at arrival time (:mod:`.arrival`), and gathers
the records in a :class:`Comparison` (:mod:`.run`).
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
