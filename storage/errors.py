"""Storage errors: re-exports of the index layer's hierarchy, so callers catch one family."""

from prefixkv.indexes.errors import BlockOwnershipError, PrefixKVError

__all__ = ["BlockOwnershipError", "PrefixKVError", "StorageShapeError"]


class StorageShapeError(PrefixKVError):
    """A tensor or index given to the KV cache has the wrong shape, dtype or device."""
