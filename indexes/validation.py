"""Argument checks shared by every layer: one place that says what a count, a flag or
a list of block ids must be, and names the offending value when it is not.

Checks run before anything is mutated, so a rejected call leaves its object as it was.
Each returns the checked value, so a call site reads ``n = check_count("n", n, hi)``.

Each check declares ``object``, and the compiled build compiles each argument a public
entry point checks declared ``object`` too (pyproject.toml's
``[tool.prefixkv.mypyc.checked]``; the source keeps its precise type): a compiled
(mypyc) function checks its declared argument types on entry (``TypeError``; ``True``
given for an ``int`` is read as ``1``), and trusts mypy's narrowing of them after that
(an ``Iterable[int]`` that is not a list narrows to ``bytes`` in the branch that
reports a str or bytes, and the report would raise ``TypeError`` on ``None``), so
only an ``object`` reaches the check that names the bad value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, cast

from .errors import BlockOwnershipError, PrefixKVError

__all__ = [
    "MAX_BLOCKS",
    "MAX_BLOCK_SIZE",
    "ceil_div",
    "check_block_ids",
    "check_bool",
    "check_count",
    "check_enough_block_ids",
    "check_positive",
    "check_sequence",
]

MAX_BLOCKS: Final = 2**31 - 1
"""The most blocks a pool holds, and so the bound of every block id and block count:
engines keep block tables as int32 tensors (vLLM)."""

MAX_BLOCK_SIZE: Final = 2**20
"""The largest block (page) in tokens; engines use 1 to a few hundred."""


def check_count(
    name: str,
    value: object,
    hi: int | None = None,
    *,
    lo: int = 0,
    error: type[PrefixKVError] = PrefixKVError,
) -> int:
    """``value`` as an int in ``[lo, hi]`` (no upper bound when ``hi`` is None).

    Bools, floats, strings and ``None`` are refused even where Python would accept
    them as ints, so ``"2"`` or ``True`` never pass for a count.

    Raises:
        PrefixKVError: (or ``error``) naming ``name``, the range and the value.
    """
    if type(value) is not int or value < lo or (hi is not None and value > hi):
        where = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise error(f"{name} must be an int {where}, got {value!r:.80}")
    return value


def check_positive(
    name: str,
    value: object,
    hi: int | None = None,
    *,
    error: type[PrefixKVError] = PrefixKVError,
) -> int:
    """``value`` as an int in ``[1, hi]``; see :func:`check_count`."""
    return check_count(name, value, hi, lo=1, error=error)


def check_bool(name: str, value: object) -> bool:
    """``value`` as a bool; ``"no"``, ``0`` or ``None`` are not bools.

    Raises:
        PrefixKVError: naming ``name`` and the value.
    """
    if type(value) is not bool:
        raise PrefixKVError(f"{name} must be True or False, got {value!r:.80}")
    return value


def check_block_ids(
    block_ids: object, what: str, num_blocks: int | None = None, *, unique: bool = True
) -> list[int]:
    """Block ids as a fresh list of distinct non-negative ints (below ``num_blocks``).

    With ``unique=False`` repeats are allowed (and kept).

    Complexity: O(n): one pass for the types and the range (compiled, a native loop:
    at page size 1 a request's row is a block per token), a set for duplicates.

    Raises:
        BlockOwnershipError: not iterable, a non-int, a negative or out-of-range id,
            or an id given twice; the message names ``what`` and the id.
    """
    if num_blocks is None:
        num_blocks = MAX_BLOCKS
    if type(block_ids) is list and len(block_ids) == 1:  # a decode step's one new block
        bid = block_ids[0]
        if type(bid) is int and 0 <= bid < num_blocks:
            return [bid]
    if isinstance(block_ids, (str, bytes)) or not isinstance(block_ids, Iterable):
        raise BlockOwnershipError(
            f"{what}: block ids must be a list of ints, got {block_ids!r:.80}"
        )
    ids = list(block_ids)
    if not ids:
        return ids
    lo = hi = 0
    for item in ids:
        if type(item) is not int:
            raise BlockOwnershipError(f"{what}: block ids must be ints, got {item!r:.80}")
        value: int = item
        if value < lo:
            lo = value
        elif value > hi:
            hi = value
    if lo < 0 or hi >= num_blocks:
        bad = lo if lo < 0 else hi
        pool = f" of a {num_blocks}-block pool"
        raise BlockOwnershipError(f"{what}: block {bad} is not a block id{pool}")
    if unique and len(ids) > 1 and len(set(ids)) != len(ids):
        seen: set[int] = set()
        bad = next(b for b in ids if b in seen or seen.add(b))  # type: ignore[func-returns-value]
        raise BlockOwnershipError(f"{what}: block {bad} appears twice in one call")
    return ids


def check_sequence(name: str, value: object) -> None:
    """``value`` must be a list, tuple or other sequence (not a str or bytes).

    Raises:
        BlockOwnershipError: naming ``name`` and the value.
    """
    if type(value) is not list and (
        not isinstance(value, Sequence) or isinstance(value, (str, bytes))
    ):
        raise BlockOwnershipError(f"{name} must be a list of block ids, got {value!r:.80}")


def check_enough_block_ids(block_ids: object, needed: int, what: str) -> None:
    """``block_ids`` must be a sequence (``check_sequence``) of at least ``needed`` ids;
    ``what`` says what they are for in the error (``"pages to insert"``).

    Raises:
        BlockOwnershipError: not a sequence, or too short.
    """
    check_sequence("block_ids", block_ids)
    given = len(cast(Sequence[int], block_ids))
    if given < needed:
        raise BlockOwnershipError(f"{needed} {what} but only {given} block ids given")


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints, without floats: blocks needed for ``a`` tokens."""
    return -(-a // b)
