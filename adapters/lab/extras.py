"""Optional extras (``[project.optional-dependencies]``), checked before any work: a missing
one is one line naming its ``pip install 'prefixkv[EXTRA]'``. Nothing is imported to check."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from prefixkv.storage.extras import TORCH_EXTRA, ExtraNotInstalledError, missing_extra_message

EXTRAS: dict[str, tuple[str, ...]] = {
    "report": ("matplotlib", "tqdm"),
    "pandas": ("pandas",),
    "parquet": ("pandas", "pyarrow"),
    "calibrate": ("numpy", "scipy", "httpx"),
    "cluster": ("ray", "matplotlib"),
    TORCH_EXTRA[0]: TORCH_EXTRA[1],
}
"""Each extra's top-level modules, as ``pyproject.toml`` installs them."""


def _found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a broken or half-imported package
        return False


def missing_modules(modules: Sequence[str]) -> list[str]:
    """The modules of ``modules`` that cannot be imported here (none is imported)."""
    return [name for name in modules if not _found(name)]


def has_extra(extra: str, modules: Sequence[str] | None = None) -> bool:
    """Whether ``modules`` (default: all of ``extra``'s) can be imported; ``KeyError`` for
    an ``extra`` that pyproject.toml does not declare."""
    return not missing_modules(EXTRAS[extra] if modules is None else modules)


def require_extra(
    extra: str, what: str, modules: Sequence[str] | None = None, *, instead: str = ""
) -> None:
    """Refuse to start ``what`` (as the message names it) unless ``modules`` (default: all
    of ``extra``'s) import; ``instead`` (how to do without) ends the message.

    Raises:
        ExtraNotInstalledError: a module is missing; nothing was imported or written.
        KeyError: an extra ``pyproject.toml`` does not declare, or not one of its modules.
    """
    needed = EXTRAS[extra] if modules is None else tuple(modules)
    if not set(needed) <= set(EXTRAS[extra]):
        raise KeyError(f"the {extra!r} extra does not install {sorted(set(needed))}")
    if missing := missing_modules(needed):
        raise ExtraNotInstalledError(missing_extra_message(extra, what, missing, instead))
