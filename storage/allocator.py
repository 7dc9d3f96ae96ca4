"""Free block ids of one paged KV pool, and who holds each block that is not free.

vLLM's free queue minus the cached blocks: blocks come out in id order at first, and
freed blocks are reused first (LIFO, as vLLM prepends uncached blocks "for better
GPU locality"). Cached blocks are not here: the index owns them until it evicts them.

Every block that is handed out carries an owner tag in a ledger, one list slot per
block holding an ``Owner`` member (shared, so no object per block, and compared by
identity), so an entry point that takes block ids from a caller can check them in O(1)
each (a block the pool never handed out, a block a running request holds). A list of
the members, not a bytearray of bytes: compiled code reads, compares and writes a list
slot natively, while each bytearray access goes through the generic item protocol with
an int object made per access (at page size 1 a pool frees and hands out a block per
token). The ledger grows only as far as blocks have ever been handed out, so a large
pool costs nothing up front.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, Final, cast

from prefixkv.indexes.validation import MAX_BLOCKS

from .errors import BlockOwnershipError, PrefixKVError

__all__ = ["MAX_NUM_BLOCKS", "BlockAllocator", "Owner", "check_owner"]

MAX_NUM_BLOCKS: Final = MAX_BLOCKS
"""The largest pool: block ids must fit the int32 block tables engines use (vLLM)."""


class Owner(enum.IntEnum):
    """Who holds a block.

    ``CALLER`` is whoever called :meth:`BlockAllocator.allocate` without naming an
    owner (an engine class user building pages by hand); ``MANAGER`` is a
    ``CacheManager``, for the blocks of its requests and of its index.
    """

    FREE = 0
    CALLER = 1
    MANAGER = 2


_OWNERS: Final = (Owner.CALLER, Owner.MANAGER)
_ALL_OWNERS: Final = (Owner.FREE, *_OWNERS)
# The members as module constants: compiled, a Final is a C static, where ``Owner.X``
# is an attribute lookup on a Python class at every use (the decode step's hot path).
_FREE: Final = Owner.FREE
_CALLER: Final = Owner.CALLER
_MANAGER: Final = Owner.MANAGER


def check_owner(name: str, value: object, allowed: tuple[Owner, ...] = _OWNERS) -> Owner:
    """``value`` as one of the ``allowed`` owners: the member, or an int equal to one
    (not a bool).

    Raises:
        PrefixKVError: naming ``name``, the owners allowed and the value.
    """
    if type(value) is Owner:
        if value in allowed:
            return value
    elif type(value) is int and value in allowed:
        return Owner(value)  # a Python-level enum call: only for an int
    names = " or ".join(f"Owner.{o.name}" for o in allowed)
    raise PrefixKVError(f"{name} must be {names}, got {value!r:.80}")


class BlockAllocator:
    """Hands out block ids ``0 .. num_blocks-1``; all or nothing.

    Args:
        num_blocks: pool size, in ``[1, MAX_NUM_BLOCKS]``.

    Raises:
        PrefixKVError: a size that is not such an int.
    """

    __slots__ = ("_freed", "_ledger", "num_blocks")

    def __init__(self, num_blocks: int) -> None:
        if type(num_blocks) is not int or not 0 < num_blocks <= MAX_NUM_BLOCKS:
            raise PrefixKVError(
                f"num_blocks must be an int in [1, {MAX_NUM_BLOCKS}], got {num_blocks!r:.80}"
            )
        self.num_blocks = num_blocks
        # Blocks freed after use, the end of the list handed out first.
        self._freed: list[int] = []
        # The owner (an Owner member, never an equal int) of each block ever handed
        # out: ids >= len(_ledger) were never used and are free, next in id order
        # after the freed ones.
        self._ledger: list[Owner] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks available now. O(1)."""
        return len(self._freed) + self.num_blocks - len(self._ledger)

    def allocate(self, num_blocks: int, *, owner: Owner = _CALLER) -> list[int] | None:
        """Take ``num_blocks`` blocks for ``owner``, or ``None`` (and nothing) when fewer are free.

        Freed blocks come first (the last freed first), then never-used ones in id order.

        Complexity: O(num_blocks); never-used blocks are tagged in one C call.
        """
        freed = self._freed
        ledger = self._ledger
        # The type first: mypy narrows an object equal to 1 to int, and compiled code then
        # converts it, so a True or a 1.0 would pass for the int 1.
        if type(num_blocks) is int and num_blocks == 1 and (owner is _CALLER or owner is _MANAGER):
            # A decode step's one block (every step at page size 1): no slicing.
            bid = self.allocate_one(owner)
            return None if bid < 0 else [bid]
        if type(num_blocks) is not int or num_blocks < 0:
            raise PrefixKVError(f"num_blocks must be a non-negative int, got {num_blocks!r:.80}")
        # The member, also for an equal int.
        tag = owner if owner is _MANAGER or owner is _CALLER else check_owner("owner", owner)
        if num_blocks > self.num_free_blocks:
            return None
        take = min(num_blocks, len(freed))
        out = freed[len(freed) - take :]
        del freed[len(freed) - take :]
        out.reverse()
        for bid in out:
            ledger[bid] = tag
        if take < num_blocks:
            first = len(ledger)
            rest = num_blocks - take
            ledger.extend([tag] * rest)
            out.extend(range(first, first + rest))
        return out

    def allocate_one(self, owner: Owner = _CALLER) -> int:
        """One block for ``owner`` (a decode step's), or -1 (and nothing) when none is free.

        ``allocate(1)`` without the list: the last freed block first, then the next
        never-used one. O(1).

        Raises:
            PrefixKVError: ``owner`` is not ``Owner.CALLER`` or ``Owner.MANAGER``.
        """
        if owner is not _CALLER and owner is not _MANAGER:
            raise PrefixKVError(f"owner must be Owner.CALLER or Owner.MANAGER, got {owner!r}")
        ledger = self._ledger
        freed = self._freed
        if freed:
            bid = freed.pop()
            ledger[bid] = owner
            return bid
        if len(ledger) < self.num_blocks:
            ledger.append(owner)
            return len(ledger) - 1
        return -1

    def _checked(self, block_ids: object, owner: Owner, what: str) -> list[int]:
        # Ints, in range, handed out to ``owner``, none repeated: O(n) in C passes.
        if isinstance(block_ids, (str, bytes)) or not isinstance(block_ids, Iterable):
            raise BlockOwnershipError(
                f"{what}: block ids must be a list of ints, got {block_ids!r:.80}"
            )
        ids = block_ids if type(block_ids) is list else list(block_ids)
        if not ids:
            return ids
        ledger = self._ledger
        if len(ids) == 1:  # a request's partial last block: the common case
            bid = ids[0]
            if type(bid) is int and 0 <= bid < len(ledger) and ledger[bid] == owner:
                return ids
        if set(map(type, ids)) != {int}:
            bad = next(b for b in ids if type(b) is not int)
            raise BlockOwnershipError(f"{what}: block ids must be ints, got {bad!r:.80}")
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= self.num_blocks:
            bad = lo if lo < 0 else hi
            raise BlockOwnershipError(
                f"{what}: block {bad} is not in this pool of {self.num_blocks} blocks"
            )
        if hi >= len(ledger):
            raise BlockOwnershipError(f"{what}: double free of block {hi} (never handed out)")
        tags = [ledger[b] for b in ids]
        if tags.count(owner) != len(tags):
            pos = next(i for i, t in enumerate(tags) if t != owner)
            held = Owner(tags[pos])
            if held is Owner.FREE:
                raise BlockOwnershipError(f"{what}: double free of block {ids[pos]}")
            raise BlockOwnershipError(
                f"{what}: block {ids[pos]} is held by {held.name}, not by {owner.name}"
            )
        if len(set(ids)) != len(ids):
            raise BlockOwnershipError(f"{what}: a block id appears twice in one call: {ids[:16]}")
        return ids

    def free(self, block_ids: Iterable[int], *, owner: Owner = _CALLER) -> None:
        """Return blocks held by ``owner``; the first of ``block_ids`` is handed out again first.

        Raises:
            BlockOwnershipError: an id that is not an int, out of range (another
                pool's), repeated, free already, or held by another owner; nothing
                is freed then.

        Complexity: O(len(block_ids)), in C.
        """
        if owner is not _MANAGER and owner is not _CALLER:  # compiled: two compares
            owner = check_owner("owner", owner)
        ids = self._retag(block_ids, owner, _FREE, "free")
        if len(ids) == 1:
            self._freed.append(ids[0])
        elif ids:
            self._freed += ids[::-1]  # a reversed copy: fewer steps per id than reversed()

    def _retag(self, block_ids: object, owner: Owner, new: Owner, what: str) -> list[int]:
        # Check and retag in one pass over a list (a leaf's slots at page size 1 are
        # freed by the thousand); an id that fails, a repeated one included (it finds
        # its own new tag), undoes the pass and the multi-pass check names it.
        # The ledger holds the members themselves: a slot is compared by identity.
        ledger = self._ledger
        if type(block_ids) is list and type(owner) is Owner and new is not owner:
            given: list[object] = block_ids  # typed: compiled, the loop indexes the list
            size = len(ledger)
            done = 0
            for item in given:
                if type(item) is not int:
                    break
                bid: int = item
                if not 0 <= bid < size or ledger[bid] is not owner:
                    break
                ledger[bid] = new
                done += 1
            else:
                return cast(list[int], given)
            for i in range(done):
                ledger[cast(int, given[i])] = owner
        ids = self._checked(block_ids, owner, what)
        for bid in ids:
            ledger[bid] = new
        return ids

    def transfer(self, block_ids: Iterable[int], *, src: Owner, dst: Owner) -> list[int]:
        """Hand blocks held by ``src`` to ``dst`` (a caller's pages adopted by a cache).

        Raises:
            BlockOwnershipError: as :meth:`free`, for ``src``; nothing changes then.
        """
        src = check_owner("src", src)
        return self._retag(block_ids, src, check_owner("dst", dst), "transfer")

    def check_held(self, block_ids: Iterable[int], owner: Owner, what: str) -> list[int]:
        """``block_ids`` as a list, each held by ``owner``, none repeated.

        Raises:
            BlockOwnershipError: naming ``what`` and the first id that is not.
        """
        return self._checked(block_ids, check_owner("owner", owner), what)

    def owner_of(self, block_id: int) -> Owner:
        """Who holds ``block_id`` (``Owner.FREE`` if nobody). O(1).

        Raises:
            BlockOwnershipError: not a block id of this pool.
        """
        if type(block_id) is not int or not 0 <= block_id < self.num_blocks:
            raise BlockOwnershipError(
                f"block {block_id!r:.80} is not in this pool of {self.num_blocks} blocks"
            )
        ledger = self._ledger
        return ledger[block_id] if block_id < len(ledger) else _FREE  # members only

    def num_blocks_held_by(self, owner: Owner) -> int:
        """How many blocks ``owner`` holds. O(blocks ever handed out); for checks."""
        owner = check_owner("owner", owner, _ALL_OWNERS)
        if owner is Owner.FREE:
            return self.num_free_blocks
        return self._ledger.count(owner)

    def is_free(self, block_id: int) -> bool:
        """Whether ``block_id`` is free. O(1)."""
        return self.owner_of(cast(Any, block_id)) is _FREE

    def free_block_ids(self) -> list[int]:
        """Free blocks in the order they will be handed out. O(free blocks); for tests."""
        return [*reversed(self._freed), *range(len(self._ledger), self.num_blocks)]

    def check_invariants(self) -> None:
        """The freed list and the ledger agree, with no repeats.

        Raises:
            AssertionError: describing the mismatch.
        """
        ledger = self._ledger
        assert len(ledger) <= self.num_blocks, "ledger longer than the pool"
        assert len(set(self._freed)) == len(self._freed), "a block is freed twice"
        assert all(0 <= b < len(ledger) for b in self._freed), "freed id never handed out"
        assert all(ledger[b] == Owner.FREE for b in self._freed), "a freed block has an owner"
        assert ledger.count(Owner.FREE) == len(self._freed), (
            f"{ledger.count(Owner.FREE)} free blocks in the ledger, {len(self._freed)} freed"
        )
        assert all(type(t) is Owner for t in ledger), "an owner tag is not an Owner member"
        assert max(ledger, default=0) <= max(Owner), "unknown owner tag in the ledger"
