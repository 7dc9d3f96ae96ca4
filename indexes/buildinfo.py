"""Which build of prefixkv is running: modules compiled by mypyc, or pure Python.

The compiled wheel (``make build-compiled``) and the pure-Python package run the same
source; benchmarks and reports say which one produced their figures.
"""

from __future__ import annotations

import sys
from importlib.machinery import EXTENSION_SUFFIXES

__all__ = ["build_kind", "compiled_modules"]


def compiled_modules() -> list[str]:
    """Names of the imported prefixkv modules that were loaded from compiled extensions."""
    out = []
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if name.startswith("prefixkv.") and origin.endswith(tuple(EXTENSION_SUFFIXES)):
            out.append(name)
    return sorted(out)


def build_kind() -> str:
    """``"compiled"`` when the index core runs compiled, else ``"pure Python"``."""
    from . import hash_chain, radix  # the core the compiled build must cover

    core = {hash_chain.__name__, radix.__name__}
    return "compiled" if core <= set(compiled_modules()) else "pure Python"
