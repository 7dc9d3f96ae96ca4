"""Package faces whose names load their modules on first use (PEP 562), so that importing
a package costs only what its caller uses."""

from __future__ import annotations

import pkgutil
import sys
from collections.abc import Callable, Mapping


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], object]:
    """The lookup behind a package's ``__getattr__``: a name of ``homes`` is imported from
    its module (``homes[name]``, inside ``package``) on first use and kept on the package,
    so later lookups skip it; any other name raises ``AttributeError``."""

    def lookup(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = pkgutil.resolve_name(f"{package}.{home}:{name}")
        setattr(sys.modules[package], name, value)
        return value

    return lookup
