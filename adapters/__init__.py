"""Engine-facing layer: the request manager, engine classes shaped like vLLM's and SGLang's
caches, the KV-event codec and transport, and the router a KV-aware frontend embeds.
The reference engine lives in :mod:`.engine` and the measuring bench in :mod:`.lab`;
importing this package loads neither.

The four names below load their modules on first use, so that ``import
prefixkv.adapters.<sub>`` (the ``prefixkv`` command, a router) costs only what it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixkv.indexes.lazy import lazy_names

if TYPE_CHECKING:
    from .accounting import RequestRecord
    from .manager import Admission, CacheManager
    from .totals import CacheTotals

__all__ = ["Admission", "CacheManager", "CacheTotals", "RequestRecord"]

_HOMES = {
    "Admission": "manager",
    "CacheManager": "manager",
    "CacheTotals": "totals",
    "RequestRecord": "accounting",
}


_lookup = lazy_names(__name__, _HOMES)


def __getattr__(name: str) -> object:
    return _lookup(name)
