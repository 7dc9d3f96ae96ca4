"""Deprecated: the SGLang plug-in moved to :mod:`prefixkv.adapters.sglang.plugin`.

Kept for one release, so an environment whose ``sglang.srt.plugins`` entry point still
names ``prefixkv.adapters.plugins.sglang:register`` keeps working.
"""

from __future__ import annotations

import warnings

from ..sglang.plugin import BACKENDS, PrefixKVPrefixCache, make_prefix_cache, register

__all__ = ["BACKENDS", "PrefixKVPrefixCache", "make_prefix_cache", "register"]

warnings.warn(
    "prefixkv.adapters.plugins.sglang is deprecated and goes in the next release: use "
    "prefixkv.adapters.sglang.plugin (the entry point is "
    "prefixkv.adapters.sglang.plugin:register)",
    DeprecationWarning,
    stacklevel=2,
)
