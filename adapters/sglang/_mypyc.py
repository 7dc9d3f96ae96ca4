"""``mypyc_attr`` for the compiled build, a no-op without ``mypy_extensions``.

The compiled build reads the decorator at compile time (mypy resolves it to
``mypy_extensions.mypyc_attr``); at run time nothing needs it, so an environment
without mypy installed gets a decorator that returns the class unchanged. Python
(not compiled): a compiled module cannot define a fallback for an import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

try:
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # pragma: no cover - an environment without mypy

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[_T], _T]:
        """The class unchanged (only the compiled build reads these attributes)."""

        def keep(cls: _T) -> _T:
            return cls

        return keep


__all__ = ["mypyc_attr"]
