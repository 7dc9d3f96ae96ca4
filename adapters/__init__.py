"""Engine-facing layer: the request manager, facades shaped like vLLM's and SGLang's
caches, the KV-event codec and transport, and the router a KV-aware frontend embeds.
The reference engine lives in :mod:`.engine` and the measuring bench in :mod:`.lab`;
importing this package loads neither.
"""

from .accounting import CacheTotals, RequestRecord
from .deprecated import moved_names
from .manager import Admission, CacheManager

__all__ = ["Admission", "CacheManager", "CacheTotals", "RequestRecord"]

__getattr__ = moved_names(
    __name__,
    {"Engine": f"{__name__}.engine:Engine", "EngineConfig": f"{__name__}.engine:EngineConfig"},
    "the reference engine imports torch and is not the product's API",
)
