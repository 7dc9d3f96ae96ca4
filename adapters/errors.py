"""Errors the engine integrations raise (no engine imported here)."""

from __future__ import annotations

from prefixkv.indexes.errors import PrefixKVError

__all__ = ["UnsupportedEngineFeatureError"]


class UnsupportedEngineFeatureError(PrefixKVError):
    """The engine is configured with a feature (or is a version) prefixkv does not support.

    Raised at start-up, before any request runs; the message is one line naming the
    feature and the flag that turned it on.
    """
