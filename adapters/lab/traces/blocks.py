"""Deterministic token content for hash-id traces: each block id becomes a fixed block.

Hash-id traces (Mooncake, Qwen-Bailian, kv-cache-tester) publish one integer per
block of tokens, equal ids meaning equal prefixes. To replay them through token- and
block-granular indexes alike, a block id stands for pseudo-random tokens derived from
its name ``tag:seed:[scope:]id``. Token ``j`` depends on the name and ``j`` only, so a
partial block is a prefix of the full block with the same id at any tokens-per-id,
and the content is the same in any process on any platform:

- the first :data:`HEAD_TOKENS` tokens are SHAKE-128 of the name read as
  little-endian 32-bit words ``w``, each ``w % (vocab_size - 1) + 1`` — the
  derivation first published, kept because where two different blocks agree by
  chance decides token-granular hits, and recorded fixtures pin those;
- the rest come from a 64-bit key (xxh3 of the name) mixed with a fixed per-seed
  sequence in numpy's fixed-width arithmetic, vectorized over every new block of a
  request (hashing whole blocks with SHAKE costs 20 µs a 512-token block).

A bounded LRU keeps recent blocks, so memory never grows with the trace.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

import numpy as np
import xxhash

from .base import TraceOptionError

__all__ = ["HEAD_TOKENS", "BlockTokens", "TokenDeriver"]

HEAD_TOKENS = 4
"""Leading tokens of every derived run that come from SHAKE-128."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_HIGH = np.uint64(32)
_ONE_HIGH = np.uint64(1 << 32)
_HIGH_WORD = 1 if sys.byteorder == "little" else 0
"""Which ``uint32`` of a ``uint64`` in memory holds its high 32 bits."""


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, elementwise (uint64 wraps modulo 2**64)."""
    z = z ^ (z >> np.uint64(30))
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


class TokenDeriver:
    """Token ids in ``[1, vocab_size)`` derived from names, reproducibly anywhere.

    Args:
        vocab_size: ids are drawn from ``[1, vocab_size)`` (2 to 2**32).

    Raises:
        TraceOptionError: a bad ``vocab_size``.
    """

    __slots__ = ("_table", "vocab_size")

    def __init__(self, vocab_size: int) -> None:
        if type(vocab_size) is not int or not 2 <= vocab_size <= 2**32:
            raise TraceOptionError(f"vocab_size must be an int in [2, 2**32], got {vocab_size!r}")
        self.vocab_size = vocab_size
        self._table = np.zeros(0, dtype=np.uint64)

    def _steps(self, n: int) -> np.ndarray:
        if len(self._table) < n:
            size = max(n, 2 * len(self._table), 64)
            self._table = _splitmix64(np.arange(1, size + 1, dtype=np.uint64) * _GOLDEN)
        return self._table[:n]

    def tokens(self, names: Sequence[str], n: int) -> bytes:
        """``n`` tokens for each name, concatenated, as native ``uint32`` bytes.

        Complexity: O(len(names) * n) in numpy, plus a SHAKE-128 call per name.
        """
        if not names or n <= 0:
            return b""
        return self.rows(names, n).tobytes()

    def rows(self, names: Sequence[str], n: int) -> np.ndarray:
        """``n`` tokens for each name: a ``(len(names), n)`` C-contiguous ``uint32``
        array (non-empty ``names``, ``n >= 1``), what :meth:`tokens` returns as bytes.

        Five passes over the tail in place, then a copy of each element's high word
        into the ``uint32`` rows: each pass is a loop over every element, so the fewer
        the faster.
        """
        head = min(n, HEAD_TOKENS)
        raw = [name.encode() for name in names]
        out = np.empty((len(raw), n), dtype=np.uint32)
        words = np.frombuffer(b"".join(hashlib.shake_128(r).digest(4 * head) for r in raw), "<u4")
        out[:, :head] = (words % np.uint32(self.vocab_size - 1) + np.uint32(1)).reshape(-1, head)
        if n > head:
            keys = np.fromiter(map(xxhash.xxh3_64_intdigest, raw), np.uint64, count=len(raw))
            # xor, not add: with z = (key + step) * c two keys would differ by one
            # constant at every position, and close keys would give whole equal blocks.
            z = keys[:, None] ^ self._steps(n)[None, head:]
            z *= _MIX1
            z >>= _HIGH
            # Lemire's multiply-shift onto [1, V): z * (V - 1) < 2**64 - 2**32, so adding
            # 2**32 adds 1 to the high word, and the high words are the tokens: copied
            # out as they lie, no shift and no cast.
            z *= np.uint64(self.vocab_size - 1)
            z += _ONE_HIGH
            out[:, head:] = z.view(np.uint32)[:, _HIGH_WORD::2]
        return out

    def named(self, name: str, n: int) -> array[int]:
        """``n`` tokens derived from ``name`` alone (outputs, a request's own tail)."""
        result: array[int] = array("I")
        if n > 0:
            result.frombytes(self.rows([name], n).data.cast("B"))
        return result


class BlockTokens:
    """The tokens of hash-id blocks, ``tokens_per_id`` a block, cached in a bounded LRU.

    Args:
        deriver: the token source (vocabulary).
        prefix: every block's name starts with it (``"mooncake-block:0:"``: format
            and seed), so traces of different formats never share content by accident.
        tokens_per_id: tokens a block stands for (the format's block size, or an
            override that keeps the sharing pattern at another granularity).
        cache_bytes: token bytes of recent blocks kept (each entry also costs about
            150 bytes of bookkeeping, counted too); 0 keeps none.

    Raises:
        TraceOptionError: a bad ``tokens_per_id``.
    """

    __slots__ = ("_cache", "_capacity", "_deriver", "_prefix", "tokens_per_id")

    def __init__(
        self, deriver: TokenDeriver, prefix: str, tokens_per_id: int, cache_bytes: int = 4 * 2**20
    ) -> None:
        if type(tokens_per_id) is not int or tokens_per_id < 1:
            raise TraceOptionError(f"tokens_per_id must be a positive int, got {tokens_per_id!r}")
        self._deriver = deriver
        self._prefix = prefix
        self.tokens_per_id = tokens_per_id
        self._cache: OrderedDict[object, bytes] = OrderedDict()  # an id, or (scope, id)
        self._capacity = cache_bytes // (4 * tokens_per_id + 150)

    def prompt(self, scope: str, hash_ids: Sequence[int], length: int) -> array[int]:
        """The blocks of ``hash_ids`` in order, cut to ``length`` tokens.

        Args:
            scope: a namespace for the ids (``""`` when ids are global to the trace;
                a conversation id when they are local to it).
            hash_ids: the block ids.
            length: tokens wanted, at most ``len(hash_ids) * tokens_per_id``; the
                caller bounds it.

        Complexity: O(length) copying; one vectorized derivation for the blocks not
        in the LRU. A request none of whose blocks is cached (most of a long trace's)
        is copied out of the derived rows once, never joined.
        """
        cache = self._cache
        keys: Sequence[object] = [(scope, h) for h in hash_ids] if scope else hash_ids
        parts: list[bytes | None] = list(map(cache.get, keys))
        missing = [pos for pos, block in enumerate(parts) if block is None]
        out: array[int] = array("I")
        if len(missing) < len(parts):
            for pos, key in enumerate(keys):
                if parts[pos] is not None:
                    cache.move_to_end(key)
        if missing:
            rows = self._fill(scope, hash_ids, keys, missing, parts)
            if len(missing) == len(parts):  # none cached: straight from the rows
                out.frombytes(rows.data.cast("B")[: 4 * length])
                return out
        data = b"".join(cast("list[bytes]", parts))
        out.frombytes(data if len(data) == 4 * length else memoryview(data)[: 4 * length])
        return out

    def _fill(
        self,
        scope: str,
        hash_ids: Sequence[int],
        keys: Sequence[object],
        missing: list[int],
        parts: list[bytes | None],
    ) -> np.ndarray:
        # One vectorized pass over every missing block of the request: numpy's
        # per-call overhead would otherwise exceed the arithmetic. Returns their rows.
        name = f"{self._prefix}{scope}:" if scope else self._prefix
        rows = self._deriver.rows([f"{name}{hash_ids[p]}" for p in missing], self.tokens_per_id)
        data = rows.data.cast("B")  # each block copied out once, the rows never whole
        width = 4 * self.tokens_per_id
        cache = self._cache
        at = 0
        for p in missing:
            block = data[at : at + width].tobytes()
            at += width
            parts[p] = block
            cache[keys[p]] = block
        while len(cache) > self._capacity:
            cache.popitem(last=False)
        return rows
