"""Errors the engine plug-ins raise; kept for one release, now in ``prefixkv.adapters.errors``."""

from __future__ import annotations

from ..errors import UnsupportedEngineFeatureError

__all__ = ["UnsupportedEngineFeatureError"]
