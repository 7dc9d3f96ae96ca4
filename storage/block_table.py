"""Block tables and slot mappings (SPEC BB-4), the nano-vllm / vLLM conventions.

Token ``t`` of a request lives in slot ``block_table[t // block_size] * block_size
+ t % block_size``; block tables are padded with ``-1`` to a common width, and a
slot of ``-1`` means "do not write".
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.indexes.validation import MAX_BLOCK_SIZE, MAX_BLOCKS, check_count, check_positive

from .errors import PrefixKVError

__all__ = ["PAD_SLOT", "pad_block_tables", "slot_mapping", "token_slot"]

PAD_SLOT = -1
"""Padding in block tables and slot mappings: no block / do not write."""


def token_slot(block_table: Sequence[int], position: int, block_size: int) -> int:
    """The slot of token ``position``.

    Raises:
        PrefixKVError: a bad block size or position, or a position past the table.
    """
    check_positive("block_size", block_size, MAX_BLOCK_SIZE)
    check_count("position", position)
    index, offset = divmod(position, block_size)
    if index >= len(block_table):
        raise PrefixKVError(
            f"token {position} is outside a {len(block_table)}-block table "
            f"(block_size {block_size})"
        )
    return block_table[index] * block_size + offset


def slot_mapping(block_table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Slots of tokens ``start .. end-1`` (the tokens a step writes).

    Complexity: O(end - start), one C ``range`` per block.

    Raises:
        PrefixKVError: a bad block size, or a range that is negative or runs past the table.
    """
    check_positive("block_size", block_size, MAX_BLOCK_SIZE)
    check_count("start", start)
    check_count("end", end, lo=start)
    if end > 0 and (end - 1) // block_size >= len(block_table):
        raise PrefixKVError(
            f"tokens [{start}, {end}) do not fit a {len(block_table)}-block table "
            f"(block_size {block_size})"
        )
    out: list[int] = []
    pos = start
    while pos < end:
        index, offset = divmod(pos, block_size)
        run = min(block_size - offset, end - pos)
        base = block_table[index] * block_size + offset
        out.extend(range(base, base + run))
        pos += run
    return out


def pad_block_tables(tables: Sequence[Sequence[int]], width: int | None = None) -> list[list[int]]:
    """Pad block tables with ``-1`` to ``width`` (default: the longest).

    Raises:
        PrefixKVError: a table is longer than ``width``.
    """
    if width is not None:
        check_count("width", width, MAX_BLOCKS)
    w = max((len(t) for t in tables), default=0) if width is None else width
    out = []
    for t in tables:
        if len(t) > w:
            raise PrefixKVError(f"a {len(t)}-block table does not fit width {w}")
        out.append([*t, *([PAD_SLOT] * (w - len(t)))])
    return out
