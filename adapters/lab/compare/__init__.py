"""Backends head to head on the same requests, at equal capacity: the ``compare`` bench.

:func:`compare_backends` with :class:`CompareOptions` is the Python entry point; ``prefixkv
compare`` resolves its flags (:mod:`.plan`), runs each backend K-live (:mod:`.k_live`,
:mod:`.anchors`) and at arrival time (:mod:`.arrival`), and gathers the records (:mod:`.run`).
"""

from ..backends import CompareError, parse_backends
from .options import CompareOptions, compare_backends

__all__ = ["CompareError", "CompareOptions", "compare_backends", "parse_backends"]
