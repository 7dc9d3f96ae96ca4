"""Engine-facing layer: the request manager, facades shaped like vLLM's and SGLang's
caches, the KV-event codec and transport, and the router a KV-aware frontend embeds.
The reference engine lives in :mod:`.engine` and the measuring bench in :mod:`.lab`;
importing this package loads neither.
"""

import warnings

from .accounting import CacheTotals, RequestRecord
from .manager import Admission, CacheManager

__all__ = ["Admission", "CacheManager", "CacheTotals", "RequestRecord"]

_MOVED_TO_ENGINE = frozenset({"Engine", "EngineConfig"})


def __getattr__(name: str) -> object:
    # Deprecated: the reference engine imports torch and is not the product's API.
    if name in _MOVED_TO_ENGINE:
        warnings.warn(
            f"prefixkv.adapters.{name} is deprecated and goes in the next release; "
            f"import it from prefixkv.adapters.engine",
            DeprecationWarning,
            stacklevel=2,
        )
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
