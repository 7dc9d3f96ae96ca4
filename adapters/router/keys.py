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
from collections.abc import Callable, Sequence
from typing import NamedTuple

import xxhash

from prefixkv.indexes.base import PrefixIndex, SupportsEventSink
from prefixkv.indexes.hash_chain import HashChainIndex
from prefixkv.indexes.hashing import make_block_hasher
from prefixkv.indexes.sglang_hashing import namespace_prior, page_hashes, to_event_hashes
from prefixkv.indexes.tokens import TOKEN_BYTES, TOKEN_TYPECODE, ChainHasher, ExtraKey
from prefixkv.indexes.vllm_hashing import VllmBlockHasher, to_external_block_hash

from .errors import ClusterConfigError

__all__ = ["HashScheme", "RouteKeys", "Worker", "local_block_hashes"]

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
        block_size: tokens per block (page).
        hashes: the wire hashes of the full blocks of a token array (and namespace).
        name: what it is (``"xxh3_128"``, ``"sha256_cbor"``, ``"sglang"``, ...).

    Build one with :meth:`for_index` (the scheme a replica's index publishes),
    :meth:`prefixkv`, :meth:`vllm` or :meth:`sglang`.
    """

    __slots__ = ("_hashes", "block_size", "name")

    def __init__(
        self,
        block_size: int,
        hashes: Callable[[array[int], ExtraKey | None], list[int]],
        name: str,
    ) -> None:
        self.block_size = block_size
        self._hashes = hashes
        self.name = name

    @classmethod
    def chained(cls, hasher: ChainHasher, name: str = "chain") -> HashScheme:
        """vLLM-style chained hashes from ``hasher``, on the wire as vLLM's 64-bit ints."""

        def hashes(tokens: array[int], extra_key: ExtraKey | None) -> list[int]:
            digests: list[bytes] = []
            hasher.extend(digests, tokens, extra_key)
            return [to_external_block_hash(d) for d in digests]

        return cls(hasher.block_size, hashes, name)

    @classmethod
    def prefixkv(
        cls, block_size: int, seed: int | str | bytes, algorithm: str = "xxh3_128"
    ) -> HashScheme:
        """The hash chain's hashes with a fleet-wide seed (vLLM's ``PYTHONHASHSEED`` role).

        Raises:
            ClusterConfigError: no seed (a random root would make every replica's
                hashes different, and no router could follow them).
        """
        if seed is None:
            raise ClusterConfigError("a fleet needs one hash seed shared by every replica")
        return cls.chained(make_block_hasher(block_size, algorithm, seed), algorithm)

    @classmethod
    def vllm(cls, block_size: int, algorithm: str = "sha256_cbor") -> HashScheme:
        """vLLM 0.33's block hashes (``--prefix-caching-hash-algo``)."""
        return cls.chained(VllmBlockHasher(block_size, algorithm), algorithm)

    @classmethod
    def sglang(cls, page_size: int) -> HashScheme:
        """SGLang 0.5.23's page hashes (sha256 chain, the first 8 bytes signed)."""

        def hashes(tokens: array[int], extra_key: ExtraKey | None) -> list[int]:
            full = len(tokens) - len(tokens) % page_size
            digests = page_hashes(tokens[:full], namespace_prior(extra_key), page_size)
            return to_event_hashes(digests) if digests else []

        return cls(page_size, hashes, "sglang")

    @classmethod
    def for_index(cls, index: PrefixIndex) -> HashScheme:
        """The scheme ``index`` publishes events with: its own chain hasher (the hash
        chain, seed included), SGLang's page hashes (the radix tree), else prefixkv's
        default chain (an index that publishes nothing: its hashes are never met).
        """
        if isinstance(index, HashChainIndex):
            return cls.chained(index.hasher, "hash_chain")
        if isinstance(index, SupportsEventSink) and index.kv_event_dialect == "sglang":
            return cls.sglang(index.block_size)
        return cls.prefixkv(index.block_size, 0)

    def block_hashes(self, tokens: array[int], extra_key: ExtraKey | None = None) -> list[int]:
        """The wire hashes of the full blocks of ``tokens``.

        Complexity: O(len(tokens)); one digest per block.
        """
        return self._hashes(tokens, extra_key)

    def first_block_hash(self, token_ids: Sequence[int]) -> int | None:
        """The wire hash of a chain's first block with these tokens (no namespace), or
        ``None`` when fewer than ``block_size`` tokens are given. For checking that a
        replica hashes as the router does."""
        if len(token_ids) < self.block_size:
            return None
        tokens = array(TOKEN_TYPECODE, token_ids[: self.block_size])
        return self.block_hashes(tokens)[0]


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
