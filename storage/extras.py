"""The rule for optional dependencies, at the lowest layer that has one (torch, here).

``pip install .`` gives the indexes, the engine classes, the router and the lab; the
parts that need more come with an extra (``pip install 'prefixkv[torch]'`` adds
:class:`~prefixkv.storage.PagedKVCache` and the reference engine). Without it, such a
part fails in one line naming the extra: :class:`ExtraNotInstalledError`, raised by a
check before any work (``prefixkv.adapters.lab.extras.require_extra``) or by the
guarded import itself (:func:`extra_imports`). Inside vLLM or SGLang torch is there
and nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from prefixkv.indexes.errors import PrefixKVError

__all__ = ["TORCH_EXTRA", "ExtraNotInstalledError", "extra_imports", "missing_extra_message"]

TORCH_EXTRA = ("torch", ("torch",))
"""The extra that adds the tensor parts, and its top-level modules."""


class ExtraNotInstalledError(PrefixKVError, ImportError):
    """An optional part was asked for without its extra installed.

    An ``ImportError`` too, so code that probes with ``except ImportError`` keeps
    working. The message is one line: what needed which modules, and the
    ``pip install`` that adds them.
    """


def missing_extra_message(extra: str, what: str, missing: Sequence[str], instead: str = "") -> str:
    """The one line every missing extra is reported in.

    ``"WHAT: MODS is/are not installed; pip install 'prefixkv[EXTRA]' INSTEAD"``.
    """
    names = " and ".join(missing)
    verb = "is" if len(missing) == 1 else "are"
    tail = f" {instead}" if instead else ""
    return f"{what}: {names} {verb} not installed; pip install 'prefixkv[{extra}]'{tail}"


@contextlib.contextmanager
def extra_imports(extra: str, modules: Sequence[str], what: str) -> Iterator[None]:
    """Guard the imports of an extra's modules: a ``ModuleNotFoundError`` for one of
    ``modules`` (or a submodule of one) becomes :class:`ExtraNotInstalledError`, one
    line naming ``pip install 'prefixkv[EXTRA]'``. Any other import error passes
    unchanged (a broken install is not a missing extra).

    Args:
        extra: the extra that installs ``modules`` (``"torch"``).
        modules: its top-level modules.
        what: the part being imported, as the message names it.

    Raises:
        ExtraNotInstalledError: a guarded module is not installed.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in modules:
            raise
        raise ExtraNotInstalledError(missing_extra_message(extra, what, [top])) from None
