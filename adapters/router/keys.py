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

Both take the request's namespace (``extra_key``: LoRA, cache salt, tenant, SGLang's
extra key) as the engines do: ``block_hashes`` chain it exactly as the fleet's
engines hash it (vLLM: LoRA in every block's extra keys, the salt in block 0's), and
``local_hashes`` fold in each block's extra keys as its ``BlockStored`` publishes
them, so a request is never predicted to hit another namespace's blocks.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import xxhash

from prefixkv.adapters.events.recorder import event_extra_keys
from prefixkv.indexes.base import PrefixIndex, SupportsEventSink
from prefixkv.indexes.hash_chain import HashChainIndex
from prefixkv.indexes.hashing import make_block_hasher
from prefixkv.indexes.sglang_hashing import namespace_prior, page_hashes, to_event_hashes
from prefixkv.indexes.tokens import (
    TOKEN_BYTES,
    TOKEN_TYPECODE,
    ChainHasher,
    ExtraKey,
    normalize_extra_key,
)
from prefixkv.indexes.vllm_hashing import VllmBlockHasher, to_external_block_hash

from .errors import ClusterSettingsError

__all__ = [
    "HashScheme",
    "RouteKeys",
    "Worker",
    "local_block_hashes",
    "namespace_keys",
    "request_extra_key",
]

NamespaceKeys = Callable[[ExtraKey | None, int], "list[Any] | None"]
"""What the engines' ``BlockStored`` of a chain's first ``n`` blocks shows of a
namespace, per block (:func:`namespace_keys`)."""

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


def local_block_hashes(
    data: bytes,
    block_size: int,
    extra_keys: Sequence[Sequence[Any] | None] | None = None,
) -> list[int]:
    """xxh3-64 of each full block of ``data`` (token bytes), Dynamo's ``LocalBlockHash``.

    A block with namespace keys (``extra_keys[i]``, :func:`namespace_keys`: the LoRA
    name and the extra keys a ``BlockStored`` carries, cache salt and multimodal ids)
    hashes its tokens followed by the msgpack of its keys, so two namespaces the events
    tell apart never share a content hash; a block without hashes its tokens alone
    (Dynamo's hash).

    Complexity: O(len(data)); one C hash call per block.
    """
    step = block_size * TOKEN_BYTES
    digest = xxhash.xxh3_64_intdigest
    end = len(data) - len(data) % step
    out = [digest(data[i : i + step], LOCAL_HASH_SEED) for i in range(0, end, step)]
    if extra_keys:
        encode = msgspec.msgpack.encode
        for b, keys in enumerate(extra_keys[: len(out)]):
            if keys:
                pos = b * step
                out[b] = digest(data[pos : pos + step] + encode(keys), LOCAL_HASH_SEED)
    return out


def request_extra_key(request: object) -> ExtraKey | None:
    """A routed request's namespace: its ``extra_key`` attribute (``None`` without one),
    checked and canonicalized as the engines' indexes take it.

    Raises:
        InvalidTokenError: a namespace that is not ``None``, a str or (kind, value) pairs.
    """
    return normalize_extra_key(getattr(request, "extra_key", None))


def namespace_keys(
    lora_name: str | None, extra_keys: Sequence[Any] | None, num_blocks: int
) -> list[Any] | None:
    """Per block, what of a namespace a ``BlockStored`` shows: ``[lora_name,
    extra_keys[i]]``, or ``None`` for a block with neither; ``None`` for a chain with
    none at all. The radix index folds these into its content hashes, from the event
    on one side and from the request's namespace on the other.
    """
    if not lora_name and not extra_keys:
        return None
    keys = list(extra_keys or ())[:num_blocks]
    keys += [None] * (num_blocks - len(keys))
    return [[lora_name, k] if lora_name or k else None for k in keys]


def _vllm_namespace_keys(extra_key: ExtraKey | None, n: int) -> list[Any] | None:
    # What VllmEventRecorder (vLLM's BlockPool) publishes for a chain from block 0.
    lora = dict(extra_key or ()).get("lora")
    return namespace_keys(None if lora is None else str(lora), event_extra_keys(extra_key, 0, n), n)


def _sglang_namespace_keys(extra_key: ExtraKey | None, n: int) -> list[Any] | None:
    # SGLang's events carry its only hashed namespace, the salt; the codec places it in
    # block 0's extra keys, as vLLM does. No LoRA name (see SGLangEventRecorder).
    salt = dict(extra_key or ()).get("cache_salt", "")
    return namespace_keys(None, [(str(salt),)], n) if salt != "" and n else None


class HashScheme:
    """How the fleet's engines hash blocks, as the router recomputes it.

    Args:
        block_size: tokens per block (page).
        hashes: the wire hashes of the full blocks of a token array (and namespace).
        name: what it is (``"xxh3_128"``, ``"sha256_cbor"``, ``"sglang"``, ...).
        namespace: what the engines' events show of a namespace per block (default:
            vLLM's ``lora_name`` and ``extra_keys``; see :func:`namespace_keys`).

    Build one with :meth:`for_index` (the scheme a replica's index publishes),
    :meth:`prefixkv`, :meth:`vllm` or :meth:`sglang`.
    """

    __slots__ = ("_hashes", "_namespace", "block_size", "name")

    def __init__(
        self,
        block_size: int,
        hashes: Callable[[array[int], ExtraKey | None], list[int]],
        name: str,
        namespace: NamespaceKeys = _vllm_namespace_keys,
    ) -> None:
        self.block_size = block_size
        self._hashes = hashes
        self.name = name
        self._namespace = namespace

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
            ClusterSettingsError: no seed (a random root would make every replica's
                hashes different, and no router could follow them).
        """
        if seed is None:
            raise ClusterSettingsError("a fleet needs one hash seed shared by every replica")
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

        return cls(page_size, hashes, "sglang", _sglang_namespace_keys)

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

    def local_hashes(self, tokens: array[int], extra_key: ExtraKey | None = None) -> list[int]:
        """The content hashes of the full blocks of ``tokens`` in namespace ``extra_key``
        (:func:`local_block_hashes` with the extra keys the engines publish).

        Complexity: O(len(tokens)); one C hash call per block.
        """
        n = len(tokens) // self.block_size
        keys = self._namespace(extra_key, n) if extra_key else None
        return local_block_hashes(tokens.tobytes(), self.block_size, keys)

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
        extra_key: the request's namespace (see :func:`request_extra_key`), ``None``
            for the shared one.
    """

    __slots__ = (
        "_block_hashes",
        "_local_hashes",
        "extra_key",
        "num_tokens",
        "scheme",
        "tokens",
    )

    def __init__(
        self, tokens: array[int], scheme: HashScheme, extra_key: ExtraKey | None = None
    ) -> None:
        self.tokens = tokens
        self.scheme = scheme
        self.extra_key = extra_key
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
            self._block_hashes = self.scheme.block_hashes(self.tokens, self.extra_key)
        return self._block_hashes

    @property
    def local_hashes(self) -> list[int]:
        """Content hashes of the full blocks (what a Dynamo-style tree walks)."""
        if self._local_hashes is None:
            self._local_hashes = self.scheme.local_hashes(self.tokens, self.extra_key)
        return self._local_hashes
