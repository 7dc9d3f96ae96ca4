"""Deprecated: the vLLM plug-in moved to :mod:`prefixkv.adapters.vllm.scheduler`.

``--scheduler-cls prefixkv.adapters.plugins.vllm.PrefixKVScheduler`` keeps working for
one release (same classes); use
``--scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler``.
"""

from __future__ import annotations

import logging
import warnings

from ..vllm.scheduler import (
    PrefixKVAsyncScheduler,
    PrefixKVScheduler,
    check_supported,
    index_from_config,
)

__all__ = ["PrefixKVAsyncScheduler", "PrefixKVScheduler", "check_supported", "index_from_config"]

_MOVED = (
    "prefixkv.adapters.plugins.vllm is deprecated; use --scheduler-cls "
    "prefixkv.adapters.vllm.scheduler.PrefixKVScheduler"
)
warnings.warn(_MOVED, DeprecationWarning, stacklevel=2)
logging.getLogger(__name__).warning(_MOVED)  # vllm serve shows no DeprecationWarning
