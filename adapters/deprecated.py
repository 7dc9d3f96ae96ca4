"""Old names that still import for one release, with a ``DeprecationWarning``.

A module whose names moved or were renamed sets its ``__getattr__`` (PEP 562) to
:func:`moved_names`: an old name then resolves to the object at its new place, and
the warning names that place. Nothing is imported until an old name is used.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

__all__ = ["moved_names"]


def moved_names(module: str, moved: Mapping[str, str], why: str = "") -> Callable[[str], object]:
    """A module ``__getattr__`` for names that moved.

    Args:
        module: the module's ``__name__`` (the old names' home).
        moved: old name -> new place, ``"package.module:name"``.
        why: a reason the warning adds (e.g. what a word means now).

    Returns:
        The ``__getattr__``: an unknown name raises ``AttributeError`` as usual.
    """

    def __getattr__(name: str) -> object:
        target = moved.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, attr = target.partition(":")
        reason = f" ({why})" if why else ""
        warnings.warn(
            f"{module}.{name} is now {where}.{attr}{reason}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(where), attr)

    return __getattr__
