"""Backends head to head on the same requests, at equal capacity: the ``compare`` bench.
:func:`compare_backends` with :class:`CompareOptions` is the Python entry point; the plan
(:mod:`.plan`), K-live runs (:mod:`.k_live`, :mod:`.anchors`) and arrival-time runs and
records (:mod:`.run`)."""

from ..backends import CompareError, parse_backends
from .options import CompareOptions, compare_backends

__all__ = ["CompareError", "CompareOptions", "compare_backends", "parse_backends"]
