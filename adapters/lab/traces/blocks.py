"""Deterministic token content for hash-id traces: each block id becomes a fixed block.

A block named ``tag:seed:[scope:]id`` has tokens that depend on the name and position
only (the first :data:`HEAD_TOKENS` from SHAKE-128, the rest from its xxh3 key mixed in
numpy), so a partial block is a prefix of the full one, the same on any platform.
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
    """SplitMix64's finalizer, elementwise."""
    z = z ^ (z >> np.uint64(30))
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


class TokenDeriver:
    """Token ids in ``[1, vocab_size)`` (``vocab_size`` 2 to 2**32) derived from names.

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

    def rows(self, names: Sequence[str], n: int) -> np.ndarray:
        """``n >= 1`` tokens for each of ``names``: a C-contiguous ``uint32`` array."""
        head = min(n, HEAD_TOKENS)
        raw = [name.encode() for name in names]
        out = np.empty((len(raw), n), dtype=np.uint32)
        words = np.frombuffer(b"".join(hashlib.shake_128(r).digest(4 * head) for r in raw), "<u4")
        out[:, :head] = (words % np.uint32(self.vocab_size - 1) + np.uint32(1)).reshape(-1, head)
        if n > head:
            keys = np.fromiter(map(xxhash.xxh3_64_intdigest, raw), np.uint64, count=len(raw))
            # xor, not add: with add, close keys would give whole equal blocks
            z = keys[:, None] ^ self._steps(n)[None, head:]
            z *= _MIX1
            z >>= _HIGH
            # Lemire's multiply-shift onto [1, V): the high words are the tokens
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
    """The tokens of hash-id blocks, ``tokens_per_id`` a block, in an LRU of ``cache_bytes``
    (0: none kept) whose names start with ``prefix`` (format and seed).

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
        """The blocks of ``hash_ids`` in order, cut to ``length`` tokens (at most theirs).

        ``scope`` namespaces the ids (``""``: global to the trace).
        """
        cache = self._cache
        keys: Sequence[object] = [(scope, h) for h in hash_ids] if scope else hash_ids
        parts: list[bytes | None] = list(map(cache.get, keys))
        missing = [pos for pos, block in enumerate(parts) if block is None]
        out: array[int] = array("I")
        for key, block in zip(keys, parts, strict=True):
            if block is not None:
                cache.move_to_end(key)
        if missing:  # derived in one vectorized call, each block copied out once
            name = f"{self._prefix}{scope}:" if scope else self._prefix
            rows = self._deriver.rows([f"{name}{hash_ids[p]}" for p in missing], self.tokens_per_id)
            data = rows.data.cast("B")
            width = 4 * self.tokens_per_id
            for i, p in enumerate(missing):
                parts[p] = cache[keys[p]] = data[i * width : (i + 1) * width].tobytes()
            while len(cache) > self._capacity:
                cache.popitem(last=False)
            if len(missing) == len(parts):  # none cached: straight from the rows
                out.frombytes(data[: 4 * length])
                return out
        joined = b"".join(cast("list[bytes]", parts))
        out.frombytes(joined if len(joined) == 4 * length else memoryview(joined)[: 4 * length])
        return out
