"""Hash-chain prefix index in the style of vLLM v1's ``BlockPool`` prefix cache.

A flat dict maps chained block hashes to blocks (no parent/child links, SPEC HC-5);
lookup probes it once per block from block 0 and stops at the first miss (HC-4).
Unlocked blocks wait in an LRU free queue, a finished request's tail first (HC-7),
and eviction takes them from its head. An optional event sink hears what vLLM's
``BlockPool`` queues as KV events: each newly cached chain (``cache_full_blocks``),
each dropped entry (``_maybe_evict_cached_block``) and each reset.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from itertools import islice
from operator import attrgetter
from types import MappingProxyType
from typing import Any, ClassVar, Final, cast

from .base import CacheHandle, EventSink, IndexDescription, IndexStats, InsertResult, PrefixMatch
from .block_map import (
    BlockHashToBlockMap,
    CachedBlock,
    Entry,
    add_blocks,
    drop_blocks,
    entry_members,
)
from .errors import (
    BlockOwnershipError,
    CacheInUseError,
    InvalidHandleError,
    LockStateError,
    StaleHandleError,
)
from .free_queue import FreeBlockQueue
from .hashing import Digest, make_block_hasher
from .tokens import TOKEN_BYTES, ChainHasher, TokenKey, key_error
from .validation import (
    MAX_BLOCKS,
    check_block_ids,
    check_bool,
    check_count,
    check_enough_block_ids,
)

__all__ = ["HashChainIndex"]

_tokens: Final = attrgetter("tokens")
_parent: Final = attrgetter("parent")


class _ChainHandle:
    """Blocks ``chain[:length]``, a run from block 0 (``match_prefix`` / ``insert``).

    A request's successive handles share one append-only ``chain`` list, so
    registering a decoded block extends it in O(1) instead of copying the run. A
    plain class, not a NamedTuple: one is made per registered block of a decoding
    request, and a compiled class is built about ten times faster.
    """

    __slots__ = ("chain", "epoch", "length", "owner")

    def __init__(
        self, owner: HashChainIndex, chain: list[CachedBlock], length: int, epoch: int
    ) -> None:
        self.owner = owner
        self.chain = chain
        self.length = length
        self.epoch = epoch  # the owner's drop count when made: unchanged => all still cached

    def blocks(self) -> list[CachedBlock]:
        """The handle's blocks (a copy unless the handle covers the whole chain)."""
        return self.chain if self.length == len(self.chain) else self.chain[: self.length]

    def __repr__(self) -> str:
        return f"<hash-chain handle: {self.length} blocks, epoch {self.epoch}>"


def _check_limit(num_tokens: object, key: TokenKey, what: str) -> int:
    return len(key) if num_tokens is None else check_count(what, num_tokens, len(key))


def _runs_of(
    chain: list[CachedBlock], start: int, end: int, new: set[int]
) -> list[tuple[int, int]]:
    """The maximal runs ``[i, j)`` within ``chain[start:end]`` of the blocks in ``new``
    (by ``id``), in chain order."""
    runs = []
    i = start
    while i < end:
        if id(chain[i]) not in new:
            i += 1
            continue
        j = i + 1
        while j < end and id(chain[j]) in new:
            j += 1
        runs.append((i, j))
        i = j
    return runs


class HashChainIndex:
    """vLLM's prefix cache: chained block hashes in a flat dict, an LRU free queue.

    Semantics (SPEC HC-1..HC-13):

    * Only full blocks are hashed; ``H_i = D(H_{i-1}, tokens_i)`` with the
      namespace in block 0 (:class:`~prefixkv.indexes.hashing.BlockHasher`).
    * ``match_prefix`` probes one hash per block and stops at the first miss.
    * A locked block has ``ref_cnt > 0`` and is out of the free queue; at 0 it goes
      to the queue's tail and keeps its hash entry, so it still hits.
    * ``unlock`` releases a run tail first, so eviction trims chains from the tail.
    * Duplicates (HC-13): when two requests computed the same block, both blocks
      are registered under the hash, as vLLM does; lookups return the first one
      still cached, and each is evicted on its own.
    * Events (``set_event_sink``): ``on_stored`` once per run of newly registered
      blocks (duplicates too), ``on_removed`` per dropped entry, ``on_cleared`` on
      reset: exactly the calls behind vLLM 0.33's ``BlockStored``/``BlockRemoved``/
      ``AllBlocksCleared``.

    Args:
        block_size: tokens per block (vLLM's default 16).
        hash_algorithm: ``"xxh3_128"`` (default), ``"sha256_raw"``, vLLM's own
            ``"sha256"``, ``"sha256_cbor"``, ``"xxhash"``, ``"xxhash_cbor"`` (hashes
            identical to vLLM 0.33's), or a digest callable
            (:func:`~prefixkv.indexes.hashing.make_block_hasher`).
        seed: prefixkv's chains: the root seed (``None`` draws a random one);
            vLLM's: its ``PYTHONHASHSEED`` (``None``: vLLM's rule).
        verify: store each block's tokens, namespace and parent, and accept a hit
            only if they equal the key's, so a hash collision can never return
            another sequence's KV (costs memory and a compare per hit block).
        check_block_ids: refuse, in ``insert``, a block id given twice in one call (a
            set operation per new block). The engine classes, which draw every block
            from their own pool, turn it off; a block cached under another hash is
            refused either way.

    Thread safety: none; call from one scheduler thread.
    """

    kv_event_dialect: ClassVar[str] = "vllm"
    DESCRIPTION: ClassVar[IndexDescription] = IndexDescription(
        unit="block",
        models="vllm",
        default_block_size=16,
        # A manager's blocks come from its own allocator, distinct by construction: the
        # per-insert duplicate set would repeat its ledger (a set operation per block).
        pool_owned_options=MappingProxyType({"check_block_ids": False}),
    )

    def __init__(
        self,
        block_size: int = 16,
        *,
        hash_algorithm: str | Digest = "xxh3_128",
        seed: int | str | bytes | None = None,
        verify: bool = False,
        check_block_ids: bool = True,
    ) -> None:
        # the callee checks what the caller gave (Any: no check, no boxing on the way)
        self._hasher = make_block_hasher(
            cast(Any, block_size), cast(Any, hash_algorithm), cast(Any, seed)
        )
        self.block_size = self._hasher.block_size
        self.verify = check_bool("verify", verify)
        self.check_block_ids = check_bool("check_block_ids", check_block_ids)
        self._table: BlockHashToBlockMap = {}
        # Block id -> its record. A record that left the index (evicted, reset away)
        # may stay as a dead one (ref_cnt -1) until its id is registered again: a
        # pool's ids come straight back, and overwriting an entry costs a third of a
        # delete plus an insert. _num_live counts the others; dead ones are purged when
        # they outnumber them.
        self._blocks: dict[int, CachedBlock] = {}
        self._num_live = 0
        self._free = FreeBlockQueue()
        # Counts hash entries dropped (evicted, evict_blocks, reset): a handle made at
        # the current count names only cached blocks, so validating it is O(1).
        self._epoch = 0
        self._num_evicted = 0
        self._sink: EventSink | None = None

    @property
    def hasher(self) -> ChainHasher:
        """The block hasher (its root seed included)."""
        return self._hasher

    def set_event_sink(self, sink: EventSink | None) -> None:
        """Report cache-content changes to ``sink`` from now on (``None``: stop). O(1)."""
        self._sink = sink

    # ------------------------------------------------------------------ lookup

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """Longest run of cached blocks from block 0 (SPEC HC-4).

        Mutates nothing but the key's hash memo: it computes the hashes it lacks, and a
        hit's hash is replaced by the equal bytes object the table is keyed by, so a later
        probe with it (from a memo the hasher reuses) compares by identity.

        Complexity: O(new blocks to hash) + one dict probe per hit block.
        """
        limit = _check_limit(max_num_tokens, key, "max_num_tokens") // self.block_size
        hashes = key.block_hashes(self._hasher)
        # One probe per hash; the run stops at the first miss. A hash with duplicate
        # blocks (a dict entry, rare) sends the whole run to the slow path.
        table = self._table
        hit: list[CachedBlock] = []
        duplicates = False
        for i in range(limit):  # limit <= len(hashes): every full block is hashed
            digest = hashes[i]
            entry = table.get(digest)
            if type(entry) is not CachedBlock:
                duplicates = entry is not None
                break
            hit.append(entry)
            cached = entry.block_hash  # the table's key: equal, maybe another object
            if cached is not digest and cached is not None:
                hashes[i] = cached  # the next probe of it (a reuse of this memo) is by identity
        if duplicates or (self.verify and hit and not self._run_matches(hit, key)):
            # Pick among duplicates, or find where a collision breaks the run.
            hit = self._resolve(self._probe(hashes, limit), key)
        ids = [b.block_id for b in hit]  # a list of known size: no append per block
        n = len(hit)
        return PrefixMatch(n * self.block_size, ids, _ChainHandle(self, hit, n, self._epoch))

    def _probe(self, hashes: list[bytes], limit: int) -> list[Entry]:
        # The entries of the run up to the first miss.
        probed = list(map(self._table.get, islice(hashes, limit)))
        if None in probed:
            del probed[probed.index(None) :]
        return cast("list[Entry]", probed)

    def cached_blocks(self, key: TokenKey, max_num_tokens: int | None = None) -> list[int]:
        """The hit's blocks; ``match_prefix`` has no side effects here. O(hit blocks)."""
        if not isinstance(key, TokenKey):
            raise key_error("key", key)
        return self.match_prefix(key, cast(Any, max_num_tokens)).block_ids

    def _run_matches(self, hit: list[CachedBlock], key: TokenKey) -> bool:
        # verify, in bulk: the run's stored tokens equal the key's, block 0 is in the
        # key's namespace, and each block was registered right after its predecessor.
        first = hit[0]
        if first.parent is not None or first.extra_key != key.extra_key:
            return False
        stored = b"".join(map(_tokens, hit))
        if stored != key.tokens[: len(hit) * self.block_size].tobytes():
            return False
        return list(map(_parent, hit[1:])) == hit[:-1]

    def _resolve(self, entries: list[Entry], key: TokenKey) -> list[CachedBlock]:
        # Slow path: duplicate entries (pick one) or verification (check each).
        hit: list[CachedBlock] = []
        for entry in entries:
            if type(entry) is CachedBlock:
                block = entry
            else:
                found = self._pick_duplicate(entry, key, len(hit), hit)  # type: ignore[arg-type]
                if found is None:
                    break
                block = found
            if self.verify and not self._content_matches(block, key, len(hit), hit):
                break
            hit.append(block)
        return hit

    def _pick_duplicate(
        self, entry: dict[int, CachedBlock], key: TokenKey, pos: int, hit: list[CachedBlock]
    ) -> CachedBlock | None:
        # vLLM returns the first block registered under the hash; with verify we
        # take the first whose registered parent is the block we just matched.
        if not self.verify:
            return next(iter(entry.values()))
        for block in entry.values():
            if self._content_matches(block, key, pos, hit):
                return block
        return None

    def _content_matches(
        self, block: CachedBlock, key: TokenKey, pos: int, hit: list[CachedBlock]
    ) -> bool:
        bs = self.block_size
        if block.tokens != key.tokens[pos * bs : (pos + 1) * bs].tobytes():
            return False
        if pos == 0:
            return block.parent is None and block.extra_key == key.extra_key
        return block.parent is hit[pos - 1]

    # ---------------------------------------------------------------- register

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """Register the full blocks of the first ``num_tokens`` tokens (vLLM ``cache_full_blocks``).

        A block id already cached under its hash is kept as is (a hit block); a new
        block id is registered even when its hash is cached already (a duplicate,
        HC-13). New blocks start unlocked, at the tail of the free queue in the
        order a release would put them (the chain's tail evicted first).

        Args:
            key: the sequence.
            block_ids: its blocks, one per block.
            num_tokens: tokens with KV (default ``len(key)``).
            prefix: optional handle the caller holds locked on a prefix of this
                key (its previous insert): those blocks are not re-checked, so a
                decoding request registers each new block in O(1).

        Raises:
            BlockOwnershipError: too few or malformed block ids, a repeated id (with
                ``check_block_ids``), or an id cached under another hash; nothing is
                registered then.

        Complexity: O(blocks after ``prefix``).
        """
        bs = self.block_size
        num_full = _check_limit(num_tokens, key, "num_tokens") // bs
        check_enough_block_ids(block_ids, num_full, "full blocks to register")
        hashes = key.block_hashes(self._hasher)
        chain, start = self._continued_run(prefix, block_ids, num_full)
        new_ids = check_block_ids(block_ids[start:num_full], "insert", unique=self.check_block_ids)
        known = self._check_not_cached_elsewhere(key, hashes, new_ids, start)
        num_cached = start
        while num_cached < num_full and hashes[num_cached] in self._table:
            num_cached += 1
        created = self._register_run(key, hashes, new_ids, chain, start, known)
        self._free.extend(created[::-1])  # unlocked: queued tail first, like a release
        if self._sink is not None and created:
            self._announce(key, hashes, chain, start, created)
        return InsertResult(
            num_cached * self.block_size,
            new_ids,
            _ChainHandle(self, chain, max(start, num_full), self._epoch),
            start,
        )

    def extend_locked(
        self, key: TokenKey, block_ids: Sequence[int], num_tokens: int, prefix: CacheHandle
    ) -> CacheHandle | None:
        """``insert(key, block_ids, num_tokens, prefix)`` then ``relock(prefix, handle)``
        in one step, for a caller that registers fresh blocks right after the locked
        ``prefix`` it holds (a request's prompt after its hit, a decoded block).

        Returns the new handle, locked, and the lock moved off ``prefix`` exactly as the
        two calls would (same entries, events and free queue: the new blocks would join
        the queue's tail and leave it at once, so they never enter it). Returns ``None``,
        with nothing changed, whenever that case does not hold (a foreign handle, a
        prefix the run does not continue, a block id the index holds, a repeated id to
        check): then the caller makes the two calls, which check and raise.

        Complexity: O(new blocks), without the general insert's per-call checks.
        """
        if type(prefix) is not _ChainHandle or prefix.owner is not self:
            return None
        bs = self.block_size
        if type(num_tokens) is not int or not 0 <= num_tokens <= len(key):
            return None
        num_full = num_tokens // bs
        chain = prefix.chain
        start = prefix.length
        if type(block_ids) is not list or not start <= num_full <= len(block_ids):
            return None
        if len(chain) != start or (start and not self._continues(chain[-1], block_ids[start - 1])):
            return None  # insert would branch off a copy of the run, or start afresh
        new_ids = self._fresh_ids(block_ids, start, num_full)
        if new_ids is None:
            return None
        hashes = key.block_hashes(self._hasher)
        created = self._register_run(key, hashes, new_ids, chain, start, False)
        for block in created:
            block.ref_cnt = 1  # locked by the caller, as relock would pin it
        if self._sink is not None and created:
            self._announce(key, hashes, chain, start, created)
        return _ChainHandle(self, chain, num_full, self._epoch)

    @staticmethod
    def _continues(last: CachedBlock, block_id: object) -> bool:
        # _continued_run's test: the prefix's last block is the caller's there, locked.
        return type(block_id) is int and block_id == last.block_id and last.ref_cnt > 0

    def _fresh_ids(self, block_ids: list[int], start: int, end: int) -> list[int] | None:
        # block_ids[start:end] when each is a block id the index holds no live record of
        # (and, where ids are checked, none repeats); else None.
        new_ids = block_ids[start:end]
        if self.check_block_ids and len(new_ids) > 1:
            return None
        blocks = self._blocks
        for bid in cast("list[object]", new_ids):
            if type(bid) is not int or not 0 <= bid <= MAX_BLOCKS:
                return None
            old = blocks.get(bid)
            if old is not None and old.ref_cnt >= 0:
                return None
        return new_ids

    def _check_not_cached_elsewhere(
        self, key: TokenKey, hashes: list[bytes], new_ids: list[int], start: int
    ) -> bool:
        # Each new block id, block start + j of key, is free or cached under this hash;
        # True when some is cached (a re-registration), so the run looks its ids up.
        blocks = cast("dict[Any, CachedBlock]", self._blocks)  # probed with the ids as given
        known = False
        j = start
        for bid in cast("list[Any]", new_ids):  # boxed as given: no int to box per probe
            old = blocks.get(bid)
            if old is not None and old.ref_cnt >= 0:  # a dead record holds nothing
                known = True
                if old.block_hash is not None and old.block_hash != hashes[j]:
                    raise BlockOwnershipError(
                        f"block {bid} is cached for other content; "
                        f"it cannot hold block {j} of {key!r}"
                    )
            j += 1
        return known

    def _continued_run(
        self, prefix: CacheHandle | None, block_ids: Sequence[int], num_full: int
    ) -> tuple[list[CachedBlock], int]:
        # The run an insert extends and where its new blocks start: the caller's locked
        # prefix vouches for its blocks when its last one is alive, locked and holding
        # the caller's block there; its run grows in place (or branches off a copy).
        if prefix is None:
            return [], 0
        pre = self._own(prefix)
        k = min(pre.length, num_full)
        last = pre.chain[k - 1] if k else None
        if last is None or last.block_id != block_ids[k - 1] or last.ref_cnt <= 0:
            return [], 0
        in_place = k == len(pre.chain) or k == num_full
        return (pre.chain if in_place else pre.chain[:k]), k

    def _register_run(
        self,
        key: TokenKey,
        hashes: list[bytes],
        new_ids: list[int],
        chain: list[CachedBlock],
        start: int,
        known: bool,
    ) -> list[CachedBlock]:
        # Append blocks start.. to the run, making a record for each block id not
        # cached yet (a duplicate of a cached hash included, HC-13); returns the new ones.
        # ``known``: some id is cached already (else none is looked up again).
        bs = self.block_size
        blocks = cast("dict[Any, CachedBlock]", self._blocks)  # ids stay the caller's objects
        prev = chain[start - 1] if start else None
        created: list[CachedBlock] = []
        verify = self.verify
        i = start
        for bid in cast("list[Any]", new_ids):
            block = blocks.get(bid) if known else None
            if block is None or block.ref_cnt < 0:
                block = CachedBlock(bid, hashes[i])
                blocks[bid] = block  # over a dead record, if any
                if verify:
                    block.tokens = key.tokens[i * bs : (i + 1) * bs].tobytes()
                    block.parent = prev
                    block.extra_key = key.extra_key if i == 0 else None
                created.append(block)
            chain.append(block)
            prev = block
            i += 1
        add_blocks(self._table, created)
        self._num_live += len(created)
        return created

    def _announce(
        self,
        key: TokenKey,
        hashes: list[bytes],
        chain: list[CachedBlock],
        start: int,
        created: list[CachedBlock],
    ) -> None:
        # vLLM's cache_full_blocks: one BlockStored per run of newly cached blocks,
        # chained to the block before it. The new blocks are one run at the end of the
        # chain unless the caller re-registered some blocks in between.
        assert self._sink is not None
        bs = self.block_size
        end = len(chain)
        first = end - len(created)
        if chain[first] is created[0]:  # the usual case: one run ending the chain
            runs = [(first, end)]
        else:
            runs = _runs_of(chain, start, end, {id(b) for b in created})
        for i, j in runs:
            self._sink.on_stored(
                hashes[i:j],
                hashes[i - 1] if i else None,
                key.tokens[i * bs : j * bs],
                bs,
                key.extra_key,
            )

    def _drop_entries(self, blocks: list[CachedBlock]) -> None:
        # The one place entries die, so the one place handles learn it (the epoch).
        # Its callers (evict, evict_blocks) tell the event sink, once per call.
        self._epoch += 1
        drop_blocks(self._table, blocks)

    # ----------------------------------------------------------------- locking

    def _own(self, handle: CacheHandle) -> _ChainHandle:
        if type(handle) is not _ChainHandle or handle.owner is not self:
            raise InvalidHandleError(f"handle {handle!r} was not made by this hash chain")
        return handle

    def count_evictable(self, handle: CacheHandle) -> int:
        """Validate ``handle`` and count its blocks with ``ref_cnt == 0`` now. O(blocks)."""
        # Plain loops over the records here and below: compiled, each step reads a
        # struct field, where map(attrgetter) made a Python call per block (an
        # admission counts its hit twice, so this was a tenth of the vLLM class's
        # time per request on a shared prompt).
        n = 0
        for block in self._valid_blocks(self._own(handle)):
            if block.ref_cnt == 0:
                n += 1
        return n

    def lock(self, handle: CacheHandle) -> None:
        """Pin the blocks of ``handle``: ``ref_cnt += 1``, out of the free queue (HC-6).

        Raises:
            InvalidHandleError: a foreign handle.
            StaleHandleError: a block's entry was dropped since the match (evicted,
                ``evict_blocks``, reset); nothing changes.

        Complexity: O(blocks).
        """
        self._free.pin(self._valid_blocks(self._own(handle)))

    def _valid_blocks(
        self, handle: _ChainHandle, start: int = 0, held: list[CachedBlock] | None = None
    ) -> list[CachedBlock]:
        # A block's entry dies only in _drop_entries, which moves the epoch: a handle made
        # at the current epoch is valid as it stands. Otherwise every block must still
        # be cached, except those the caller holds already (``held``: its old handle,
        # whose entries evict_blocks may have dropped while it held them).
        chain = handle.chain
        # The chain itself when the handle covers it (callers only read it), else a slice
        # (islice would walk from 0).
        whole = start == 0 and handle.length == len(chain)
        blocks = chain if whole else chain[start : handle.length]
        if handle.epoch != self._epoch:
            mine: set[int] | None = None
            for block in blocks:
                if block.block_hash is None:
                    if mine is None:
                        mine = {id(b) for b in held} if held else set()
                    if id(block) not in mine:
                        raise StaleHandleError(
                            f"block {block.block_id} of this handle is no longer cached "
                            "(evicted, dropped by evict_blocks or reset since the match); "
                            "match again"
                        )
        return blocks

    def unlock(self, handle: CacheHandle) -> list[int]:
        """Release one lock, tail block first (HC-6, HC-7).

        Blocks reaching ``ref_cnt == 0`` join the free queue's tail and keep their
        hash; a block whose entry ``evict_blocks`` dropped is handed back instead.

        Raises:
            LockStateError: some block of the handle is not locked (double unlock).

        Complexity: O(blocks).
        """
        return self._unlock_blocks(self._own(handle).blocks())

    def _unlock_blocks(self, blocks: list[CachedBlock]) -> list[int]:
        for block in blocks:
            if block.ref_cnt <= 0:
                raise LockStateError(
                    f"block {block.block_id} is not locked; unlock without a matching lock"
                )
        released: list[int] = []
        for block in self._free.release(blocks):
            released.append(block.block_id)
            del self._blocks[block.block_id]
            block.ref_cnt = -1
            self._num_live -= 1
        return released

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """Move a lock from ``old`` to ``new``; only the blocks past ``old`` are touched
        when ``new`` extends it (a decoding request's next insert)."""
        o, n = self._own(old), self._own(new)
        if n.chain is o.chain and n.length >= o.length:
            self._free.pin(self._valid_blocks(n, start=o.length))
            return []
        held = o.blocks()
        self._free.pin(self._valid_blocks(n, held=held))
        return self._unlock_blocks(held)

    # ---------------------------------------------------------------- eviction

    def evict(self, num_blocks: int) -> list[int]:
        """Free up to ``num_blocks`` evictable blocks from the queue head (LRU, tails first).

        Each freed block loses its hash entry before it is handed back, so a cached
        entry never points at overwritten KV (HC-9).

        Complexity: O(num_blocks).
        """
        n = (
            num_blocks
            if type(num_blocks) is int and 0 <= num_blocks <= MAX_BLOCKS
            else check_count("num_blocks", num_blocks, MAX_BLOCKS)
        )
        popped = self._free.popleft_many(n)
        if not popped:
            return []
        if self._sink is not None:  # vLLM: one BlockRemoved per evicted block
            self._sink.on_removed([cast("bytes", b.block_hash) for b in popped])
        self._forget(popped)
        self._num_evicted += len(popped)
        return [b.block_id for b in popped]  # a native read each (map(attrgetter): a call)

    def _forget(self, dead: list[CachedBlock]) -> None:
        # Records die here: their entries go (which stales handles naming them) and the
        # block ids leave the index (their records stay, dead, until the ids come back).
        self._drop_entries(dead)
        for block in dead:
            block.ref_cnt = -1
            block.parent = None
            block.tokens = None
        self._num_live -= len(dead)
        if len(self._blocks) > 2 * self._num_live + 4096:
            self._purge_dead()

    def _purge_dead(self) -> None:
        # Dead records outnumber the live ones (ids that do not come back): drop them,
        # O(records) once per as many deaths.
        self._blocks = {bid: b for bid, b in self._blocks.items() if b.ref_cnt >= 0}

    def evict_blocks(self, block_ids: Iterable[int]) -> list[int]:
        """Drop the hash entries of the given blocks (vLLM ``BlockPool.evict_blocks``, HC-10).

        Used by KV connectors. Only entries go: a locked block stays with its
        requests and is handed back at its last unlock. Blocks chained after a
        dropped one stay cached but unreachable (lookups stop at the missing
        link) until the free queue reaches them. Ids not cached are ignored.

        Returns:
            The unlocked blocks freed now, owned by the caller.
        """
        # A set in vLLM: repeats mean nothing.
        ids = list(dict.fromkeys(check_block_ids(block_ids, "evict_blocks", unique=False)))
        freed: list[int] = []
        dropped: list[bytes] = []
        for bid in ids:
            block = self._blocks.get(bid)
            if block is None or block.block_hash is None:
                continue
            dropped.append(block.block_hash)
            if block.ref_cnt == 0:
                self._free.remove(block)
                self._forget([block])
                freed.append(bid)
            else:
                self._drop_entries([block])
        if self._sink is not None and dropped:
            self._sink.on_removed(dropped)
        self._num_evicted += len(freed)
        return freed

    def reset(self) -> list[int]:
        """Drop every entry (vLLM ``reset_prefix_cache``); blocks come back LRU first.

        Raises:
            CacheInUseError: a block is locked; nothing changes.
        """
        locked = self._num_live - len(self._free)
        if locked:
            raise CacheInUseError(f"cannot reset: {locked} cached blocks are locked by requests")
        out = [b.block_id for b in self._free]
        for block in self._blocks.values():
            block.ref_cnt = -1
            block.block_hash = None
            block.parent = None
        self._free.clear()
        self._table.clear()
        self._blocks.clear()
        self._num_live = 0
        self._epoch += 1
        if self._sink is not None:
            self._sink.on_cleared()
        return out

    # ----------------------------------------------------------------- queries

    def num_common_prefix_blocks(self, block_ids: Sequence[int], num_requests: int) -> int:
        """Leading blocks of ``block_ids`` held by all ``num_requests`` requests (HC-11).

        vLLM's ``get_num_common_prefix_blocks``: count from block 0 while the
        block is cached with ``ref_cnt == num_requests``.

        Complexity: O(result).
        """
        check_count("num_requests", num_requests)
        n = 0
        blocks = self._blocks
        for bid in block_ids:
            block = blocks.get(bid)
            if block is None or block.ref_cnt != num_requests:
                break
            n += 1
        return n

    def ref_cnt(self, block_id: int) -> int:
        """A cached block's ref count (0 = evictable); -1 when the block is not cached."""
        block_id = check_count("block_id", block_id, error=BlockOwnershipError)
        block = self._blocks.get(block_id)
        return -1 if block is None else block.ref_cnt

    def is_cached(self, block_id: int) -> bool:
        """Whether ``block_id`` has a hash entry (is matchable)."""
        block_id = check_count("block_id", block_id, error=BlockOwnershipError)
        block = self._blocks.get(block_id)
        return block is not None and block.block_hash is not None

    def cached_block_hashes(self) -> list[bytes]:
        """The digest of every cached entry, once per block (duplicates repeat).

        What a sink attached since the index was empty has been told is cached:
        stored and not yet removed or cleared. O(n); for tests and consumers' checks.
        """
        out: list[bytes] = []
        for entry in self._table.values():
            if type(entry) is CachedBlock:
                out.append(cast("bytes", entry.block_hash))
            else:
                out += (cast("bytes", b.block_hash) for b in entry.values())  # type: ignore[union-attr]
        return out

    def free_queue_block_ids(self) -> list[int]:
        """Evictable blocks in eviction order (head first). O(n); for tests and reports."""
        return [b.block_id for b in self._free]

    def num_evictable_blocks(self) -> int:
        """``stats().num_evictable_blocks`` without building the stats. O(1).

        A manager asks it whenever the free blocks run short (each step that fills a
        block on a full pool), where building the stats costs more than the answer.
        """
        return len(self._free)

    def stats(self) -> IndexStats:
        """Sizes and counters. O(1)."""
        cached = self._num_live
        evictable = len(self._free)
        return IndexStats(
            cached, evictable, cached - evictable, len(self._table), self._num_evicted
        )

    def memory_bytes(self) -> int:
        """Estimated bytes held by the index's own structures (not the KV)."""
        per_block = sys.getsizeof(CachedBlock(0, None)) + 28  # + the block-id int
        total = sys.getsizeof(self._table) + sys.getsizeof(self._blocks)
        total += len(self._blocks) * per_block  # dead records too: they take memory
        digest_len = len(next(iter(self._table))) if self._table else 0
        total += len(self._table) * (33 + digest_len)  # the hash bytes objects
        dup = sum(sys.getsizeof(e) for e in self._table.values() if type(e) is dict)
        if self.verify:
            total += sum(sys.getsizeof(b.tokens) for b in self._blocks.values())
        held = getattr(self._hasher, "memory_bytes", None)  # prefixkv's hasher: its recent memos
        return total + dup + (held() if callable(held) else 0)

    def check_invariants(self) -> None:
        """Every block is queued iff evictable; the table and blocks agree.

        Raises:
            AssertionError: describing the first inconsistency.
        """
        self._free.check_invariants()
        queued = {id(b) for b in self._free}
        live = 0
        for bid, block in self._blocks.items():
            assert block.block_id == bid, f"block {bid} stored under id {block.block_id}"
            if block.ref_cnt == -1:  # dead: no entry, not queued
                assert block.block_hash is None, f"dead block {bid} keeps its hash"
                assert block.prev is None and block.next is None, f"dead block {bid} queued"
                continue
            live += 1
            assert block.ref_cnt >= 0, f"live block {bid} has ref_cnt {block.ref_cnt}"
            if block.ref_cnt == 0:
                assert id(block) in queued, f"evictable block {bid} is not in the free queue"
                assert block.block_hash is not None, f"unlocked block {bid} has no hash"
            else:
                assert id(block) not in queued, f"locked block {bid} is in the free queue"
            if block.block_hash is not None:
                entry = self._table.get(block.block_hash)
                assert entry is not None, f"block {bid}'s hash has no table entry"
                members = entry_members(entry)
                assert any(m is block for m in members), f"block {bid} missing from its entry"
            if self.verify and block.tokens is not None:
                assert len(block.tokens) == self.block_size * TOKEN_BYTES, (
                    f"block {bid} stores a partial block"
                )
        assert live == self._num_live, f"{live} live records, counted {self._num_live}"
        for block_hash, entry in self._table.items():
            members = entry_members(entry)
            assert members, "empty duplicate entry"
            for m in members:
                assert m.block_hash == block_hash, f"block {m.block_id} under a foreign hash"
                assert self._blocks.get(m.block_id) is m, f"block {m.block_id} not owned"
