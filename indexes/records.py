"""The records an index returns: ``PrefixMatch`` (a lookup) and ``InsertResult``.

Plain classes, not NamedTuples: a lookup makes one and a decoding request makes an
``InsertResult`` with every block it fills, and a NamedTuple is built through a
Python-level ``__new__`` (about 0.5 µs, as much as the rest of a hash-chain insert),
where these classes, compiled with the indexes, are built in a few tens of
nanoseconds. They live apart from ``base.py`` because that module's
runtime-checkable Protocols must stay Python.
"""

from __future__ import annotations

__all__ = ["InsertResult", "PrefixMatch"]


class PrefixMatch:
    """The longest cached prefix of a key.

    Attributes:
        num_tokens: hit length in tokens, a multiple of ``block_size``.
        block_ids: the blocks holding the hit, one per block, in order.
        handle: pass to ``lock`` to pin the hit (``count_evictable`` says, at the
            moment of asking, how many of its blocks locking would protect).
    """

    __slots__ = ("block_ids", "handle", "num_tokens")

    def __init__(self, num_tokens: int, block_ids: list[int], handle: object) -> None:
        self.num_tokens = num_tokens
        self.block_ids = block_ids
        self.handle = handle

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefixMatch):
            return NotImplemented
        return (
            self.num_tokens == other.num_tokens
            and self.block_ids == other.block_ids
            and self.handle == other.handle
        )

    __hash__ = None  # type: ignore[assignment]  # mutable fields, compared by value

    def __repr__(self) -> str:
        return (
            f"PrefixMatch(num_tokens={self.num_tokens}, block_ids={self.block_ids!r}, "
            f"handle={self.handle!r})"
        )


class InsertResult:
    """What ``insert`` did.

    Attributes:
        num_cached_tokens: leading tokens of the key the index already held before
            the call (SGLang's ``prefix_len``).
        block_ids: the index's blocks for the inserted prefix, from block
            ``first_block`` on. Where an entry was already cached under other
            blocks and the index kept its own (the radix tree), these differ from
            the caller's: the caller's copies are duplicates to free. An index that
            keeps duplicates (the hash chain, vLLM's choice) returns the caller's.
            Past the first ``num_cached_tokens`` tokens they are always the caller's.
        handle: covers the whole inserted prefix; lock it to pin the prefix.
        first_block: where ``block_ids`` starts: 0, or the end of the ``prefix``
            handle the caller passed (that part is unchanged, so an index may skip
            it and keep a decoding request's inserts O(new blocks)).
    """

    __slots__ = ("block_ids", "first_block", "handle", "num_cached_tokens")

    def __init__(
        self, num_cached_tokens: int, block_ids: list[int], handle: object, first_block: int = 0
    ) -> None:
        self.num_cached_tokens = num_cached_tokens
        self.block_ids = block_ids
        self.handle = handle
        self.first_block = first_block

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InsertResult):
            return NotImplemented
        return (
            self.num_cached_tokens == other.num_cached_tokens
            and self.block_ids == other.block_ids
            and self.handle == other.handle
            and self.first_block == other.first_block
        )

    __hash__ = None  # type: ignore[assignment]  # mutable fields, compared by value

    def __repr__(self) -> str:
        return (
            f"InsertResult(num_cached_tokens={self.num_cached_tokens}, "
            f"block_ids={self.block_ids!r}, handle={self.handle!r}, "
            f"first_block={self.first_block})"
        )
