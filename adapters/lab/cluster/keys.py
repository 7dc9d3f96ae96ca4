"""What a router knows workers and requests by: worker keys and a request's block keys.

A *worker* is one cache a request can be sent to: (replica, data-parallel rank, KV-cache
group), Dynamo's ``WorkerWithDpRank`` with vLLM's ``group_idx`` beside it, so data
parallelism and hybrid models need no new key later. A request is known by two lists
of per-block keys, computed once when it is routed:

* ``block_hashes``: the chained hashes the fleet's engines publish in ``BlockStored``
  (vLLM's wire ints), recomputed from the token ids with the engines' own hasher, as
  Ray's ``KVAwareRouter`` and llm-d do;
* ``local_hashes``: a hash of each block's tokens alone (Dynamo's ``LocalBlockHash``),
  what a radix tree keyed by content walks; no engine hash is needed for it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import xxhash

from prefixkv.indexes.hashing import BlockHasher
from prefixkv.indexes.tokens import TOKEN_BYTES, TOKEN_TYPECODE, ExtraKey
from prefixkv.indexes.vllm_hashing import VllmBlockHasher, to_external_block_hash

from .errors import ClusterConfigError

__all__ = ["ChainHasher", "HashScheme", "RouteKeys", "Worker", "local_block_hashes"]

LOCAL_HASH_SEED = 1337
"""Seed of the per-block content hash (the one Dynamo's ``LocalBlockHash`` uses)."""


class Worker(NamedTuple):
    """One cache a request can be routed to."""

    replica: int
    """The replica's id in the fleet."""
    data_parallel_rank: int = 0
    """The engine's data-parallel rank (a batch's ``data_parallel_rank``)."""
    group_idx: int = 0
    """The KV-cache group (an event's ``group_idx``)."""


class ChainHasher(Protocol):
    """The interface of prefixkv's ``BlockHasher`` and ``VllmBlockHasher``."""

    block_size: int

    def extend(self, hashes: list[bytes], tokens: array[int], extra_key: ExtraKey | None) -> None:
        """Append the digests of the full blocks of ``tokens`` not in ``hashes`` yet."""
        ...


def local_block_hashes(data: bytes, block_size: int) -> list[int]:
    """xxh3-64 of each full block of ``data`` (token bytes), Dynamo's ``LocalBlockHash``.

    Complexity: O(len(data)); one C hash call per block.
    """
    step = block_size * TOKEN_BYTES
    digest = xxhash.xxh3_64_intdigest
    end = len(data) - len(data) % step
    return [digest(data[i : i + step], LOCAL_HASH_SEED) for i in range(0, end, step)]


class HashScheme:
    """How the fleet's engines hash blocks, as the router recomputes it.

    Args:
        hasher: the engines' chained hasher: prefixkv's :class:`BlockHasher` with the
            fleet's seed (what ``make_index("hash_chain", seed=...)`` uses), or
            :class:`VllmBlockHasher` for vLLM engines.

    Use :meth:`prefixkv` or :meth:`vllm` to build one.
    """

    __slots__ = ("block_size", "hasher")

    def __init__(self, hasher: ChainHasher) -> None:
        self.hasher = hasher
        self.block_size = hasher.block_size

    @classmethod
    def prefixkv(
        cls, block_size: int, seed: int | str | bytes, algorithm: str = "xxh3_128"
    ) -> HashScheme:
        """prefixkv's hash chain with a fleet-wide seed (vLLM's ``PYTHONHASHSEED`` role).

        Raises:
            ClusterConfigError: no seed (a random root would make every replica's
                hashes different, and no router could follow them).
        """
        if seed is None:
            raise ClusterConfigError("a fleet needs one hash seed shared by every replica")
        return cls(BlockHasher(block_size, algorithm, seed))

    @classmethod
    def vllm(cls, block_size: int, algorithm: str = "sha256_cbor") -> HashScheme:
        """vLLM 0.33's block hashes (``--prefix-caching-hash-algo``)."""
        return cls(VllmBlockHasher(block_size, algorithm))

    def block_hashes(self, tokens: array[int], extra_key: ExtraKey | None = None) -> list[int]:
        """The wire hashes (vLLM's 64-bit ints) of the full blocks of ``tokens``.

        Complexity: O(len(tokens)); one digest per block.
        """
        digests: list[bytes] = []
        self.hasher.extend(digests, tokens, extra_key)
        return [to_external_block_hash(d) for d in digests]

    def first_block_hash(self, token_ids: Sequence[int]) -> int | None:
        """The wire hash of a chain's first block with these tokens (no namespace), or
        ``None`` when fewer than ``block_size`` tokens are given. For checking that a
        replica hashes as the router does."""
        if len(token_ids) < self.block_size:
            return None
        tokens = array(TOKEN_TYPECODE, token_ids[: self.block_size])
        hashes = self.block_hashes(tokens)
        return hashes[0]


class RouteKeys:
    """A request's per-block keys, each list computed on first use.

    Args:
        tokens: the prompt's token ids.
        scheme: the fleet's hash scheme.
    """

    __slots__ = ("_block_hashes", "_local_hashes", "num_tokens", "scheme", "tokens")

    def __init__(self, tokens: array[int], scheme: HashScheme) -> None:
        self.tokens = tokens
        self.scheme = scheme
        self.num_tokens = len(tokens)
        self._block_hashes: list[int] | None = None
        self._local_hashes: list[int] | None = None

    @property
    def num_blocks(self) -> int:
        """Full blocks of the prompt."""
        return self.num_tokens // self.scheme.block_size

    @property
    def block_hashes(self) -> list[int]:
        """Chained wire hashes of the full blocks (what engines publish)."""
        if self._block_hashes is None:
            self._block_hashes = self.scheme.block_hashes(self.tokens)
        return self._block_hashes

    @property
    def local_hashes(self) -> list[int]:
        """Content hashes of the full blocks (what a Dynamo-style tree walks)."""
        if self._local_hashes is None:
            self._local_hashes = local_block_hashes(self.tokens.tobytes(), self.scheme.block_size)
        return self._local_hashes
