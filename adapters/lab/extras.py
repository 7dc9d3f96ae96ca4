"""Optional extras: which modules each optional part needs, checked before any work.

Every optional part of the lab (plots, progress bars, pandas tables, Parquet, the cost
fit, Ray, the reference engine's torch) calls :func:`require_extra` first, so a missing
extra is one line and exit status 2 at start-up, naming the ``pip install
'prefixkv[EXTRA]'`` that fixes it, never a crash after the runs. The check reads the
import system's finders (:func:`importlib.util.find_spec`) and imports nothing. The extras mirror
``[project.optional-dependencies]`` in ``pyproject.toml``; the error and its one line
are :mod:`prefixkv.storage.extras`' (the storage tensor needs torch, below this layer).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from prefixkv.storage.extras import TORCH_EXTRA, ExtraNotInstalledError, missing_extra_message

__all__ = ["EXTRAS", "ExtraNotInstalledError", "has_extra", "missing_modules", "require_extra"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "report": ("matplotlib", "tqdm"),
    "pandas": ("pandas",),
    "parquet": ("pandas", "pyarrow"),
    "calibrate": ("numpy", "scipy", "httpx"),
    "cluster": ("ray", "matplotlib"),
    TORCH_EXTRA[0]: TORCH_EXTRA[1],
}
"""Each extra's top-level modules, as ``pyproject.toml`` installs them."""


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The top-level modules of ``modules`` that cannot be imported here (none is imported).

    Complexity: one finder lookup per module.
    """
    missing = []
    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or half-imported package
            found = False
        if not found:
            missing.append(name)
    return missing


def has_extra(extra: str, modules: Sequence[str] | None = None) -> bool:
    """Whether ``modules`` (default: all of ``extra``'s) can be imported.

    Raises:
        KeyError: an extra ``pyproject.toml`` does not declare.
    """
    return not missing_modules(EXTRAS[extra] if modules is None else modules)


def require_extra(
    extra: str, what: str, modules: Sequence[str] | None = None, *, instead: str = ""
) -> None:
    """Refuse to start ``what`` unless ``modules`` (default: all of ``extra``'s) import.

    Args:
        extra: the extra that installs them (a key of :data:`EXTRAS`).
        what: the part that needs them, as the message names it (``"--ray"``).
        modules: the subset of the extra's modules this part needs.
        instead: how to do without, appended to the message (``"or give --no-plots"``).

    Raises:
        ExtraNotInstalledError: a module is missing; nothing was imported or written.
        KeyError: an extra ``pyproject.toml`` does not declare.
    """
    needed = EXTRAS[extra] if modules is None else tuple(modules)
    if not set(needed) <= set(EXTRAS[extra]):
        raise KeyError(f"the {extra!r} extra does not install {sorted(set(needed))}")
    missing = missing_modules(needed)
    if missing:
        raise ExtraNotInstalledError(missing_extra_message(extra, what, missing, instead))
