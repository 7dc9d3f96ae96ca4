"""Engine-facing layer: the request manager, facades shaped like vLLM's and SGLang's
caches, and the reference engine. The measuring bench lives in :mod:`.lab`, which
nothing here imports."""

from typing import TYPE_CHECKING

from .accounting import CacheTotals, RequestRecord
from .manager import Admission, CacheManager

if TYPE_CHECKING:
    from .engine import Engine, EngineConfig

__all__ = ["Admission", "CacheManager", "CacheTotals", "Engine", "EngineConfig", "RequestRecord"]


def __getattr__(name: str) -> object:
    # The engine imports torch; the manager and facades do not need it.
    if name in ("Engine", "EngineConfig"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
