"""Block hashes computed exactly as vLLM 0.33 computes them, for KV-event interop.

Mirrors ``vllm/utils/hashing.py`` (``sha256``, ``sha256_cbor``, ``xxhash``,
``xxhash_cbor``) and ``vllm/v1/core/kv_cache_utils.py`` (``init_none_hash`` with its
``PYTHONHASHSEED`` rule, ``hash_block_tokens``, ``generate_block_hash_extra_keys``,
``maybe_convert_block_hash``): block ``i`` hashes
``(parent_hash, tuple(block_tokens), extra_keys_i)`` serialized by pickle or canonical
CBOR, the parent of block 0 being ``NONE_HASH``. A router that knows the token ids
recomputes the hashes a vLLM replica publishes, and prefixkv's hash chain can publish
hashes a vLLM-fed router understands.

These are slower than ``hashing.BlockHasher`` (one serialization per block): use them
where hashes leave the process; keep ``xxh3_128`` otherwise.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cbor2
import xxhash as _xxhash

from .errors import PrefixKVError
from .tokens import ExtraKey, ExtraValue
from .validation import MAX_BLOCK_SIZE, check_positive

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "VLLM_HASH_FUNCTIONS",
    "VllmBlockHasher",
    "block_extra_keys",
    "hash_block_tokens",
    "none_hash",
    "resolve_none_hash_seed",
    "sha256",
    "sha256_cbor",
    "to_external_block_hash",
    "to_external_block_hashes",
    "xxhash",
    "xxhash_cbor",
]

HashFunction = Callable[[Any], bytes]

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""vLLM's fixed ``NONE_HASH`` seed for cryptographic hashes when PYTHONHASHSEED is unset."""


def sha256(value: Any) -> bytes:
    """SHA-256 of ``pickle.dumps(value, HIGHEST_PROTOCOL)`` (vLLM's default ``sha256``).

    NOTE: pickle memoizes objects by identity within one call, so two equal strings
    that are one object (say a LoRA name equal to its path, both interned) pickle
    differently from two distinct equal objects. vLLM has the same quirk; use
    ``sha256_cbor`` where hashes must be reproducible from values alone.
    """
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(value: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding of ``value`` (vLLM's ``sha256_cbor``)."""
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def xxhash(value: Any) -> bytes:
    """xxh3-128 of the pickled ``value`` (vLLM's ``xxhash``)."""
    return _xxhash.xxh3_128_digest(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(value: Any) -> bytes:
    """xxh3-128 of the canonical CBOR encoding of ``value`` (vLLM's ``xxhash_cbor``)."""
    return _xxhash.xxh3_128_digest(cbor2.dumps(value, canonical=True))


VLLM_HASH_FUNCTIONS: Mapping[str, HashFunction] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
}
"""vLLM's ``prefix_caching_hash_algo`` names and their functions."""

_NON_CRYPTOGRAPHIC = frozenset({"xxhash", "xxhash_cbor"})


def _check_algorithm(algorithm: str) -> HashFunction:
    fn = VLLM_HASH_FUNCTIONS.get(algorithm) if isinstance(algorithm, str) else None
    if fn is None:
        known = ", ".join(VLLM_HASH_FUNCTIONS)
        raise PrefixKVError(f"unknown vLLM hash algorithm {algorithm!r}; known: {known}")
    return fn


def resolve_none_hash_seed(algorithm: str, environ: Mapping[str, str] | None = None) -> str:
    """The seed vLLM derives ``NONE_HASH`` from (``resolve_none_hash_seed``).

    ``PYTHONHASHSEED`` wins when set; otherwise ``sha256``/``sha256_cbor`` use the fixed
    :data:`DEFAULT_NONE_HASH_SEED` (shareable across processes) and the xxhash
    algorithms 32 random bytes in hex (unpredictable, so not reproducible).

    Args:
        algorithm: a name in :data:`VLLM_HASH_FUNCTIONS`.
        environ: the environment to read (default ``os.environ``).

    Raises:
        PrefixKVError: an unknown algorithm.
    """
    _check_algorithm(algorithm)
    seed = (os.environ if environ is None else environ).get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    if algorithm in _NON_CRYPTOGRAPHIC:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def none_hash(algorithm: str, seed: str) -> bytes:
    """vLLM's ``NONE_HASH``: the hash function applied to the seed string itself."""
    return _check_algorithm(algorithm)(seed)


def hash_block_tokens(
    hash_function: HashFunction,
    parent_block_hash: bytes,
    block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """One block's hash: ``hash_function((parent, tuple(tokens), extra_keys))``.

    Unlike vLLM's function of the same name, the parent of block 0 is passed in
    (``NONE_HASH``) instead of read from a module global.
    """
    return hash_function((parent_block_hash, tuple(block_token_ids), extra_keys))


def to_external_block_hash(block_hash: bytes) -> int:
    """The 64-bit integer a vLLM ``BlockStored``/``BlockRemoved`` event carries.

    vLLM's ``maybe_convert_block_hash`` with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``
    (its default): the digest read big-endian, masked to the low 64 bits, so the
    *last* 8 bytes of the digest, unsigned.
    """
    return int.from_bytes(block_hash, "big") & 0xFFFF_FFFF_FFFF_FFFF


def to_external_block_hashes(block_hashes: Sequence[bytes]) -> list[int]:
    """:func:`to_external_block_hash` of each digest, in one C-level pass.

    The low 64 bits of a big-endian digest are its last 8 bytes. O(len(block_hashes)).
    """
    words = array("Q", b"".join([h[-8:] for h in block_hashes]))
    if sys.byteorder == "little":
        words.byteswap()
    return words.tolist()


_LORA_KINDS = ("lora", "lora_path", "lora_id")
"""Namespace kinds describing a LoRA adapter (vLLM's ``LoRARequest``); the int id is
published in events but, as in vLLM, not hashed."""


def _namespace_parts(
    extra_key: ExtraKey | None,
) -> tuple[tuple[Any, ...], tuple[tuple[str, ExtraValue], ...]]:
    """Split a prefixkv namespace into vLLM's per-block and block-0-only extra keys."""
    if not extra_key:
        return (), ()
    fields = dict(extra_key)
    every_block: tuple[Any, ...] = ()
    first_block: list[tuple[str, ExtraValue]] = []
    if "lora" in fields:
        # vLLM: ("lora", lora_request.lora_name, lora_request.lora_path) in every block.
        every_block = (("lora", fields["lora"], fields.get("lora_path", "")),)
    salt = fields.get("cache_salt")
    if salt:  # vLLM skips an empty salt ("if request.cache_salt")
        first_block.append(("cache_salt", salt))
    # No vLLM equivalent (tenant, SGLang's plain extra_key, anything else): kept in
    # block 0 like a salt, so namespaces stay isolated; vLLM never produces these.
    lora_kinds = _LORA_KINDS if "lora" in fields else ()
    for kind, value in extra_key:
        if kind != "cache_salt" and kind not in lora_kinds:
            first_block.append((kind, value))
    return every_block, tuple(first_block)


def block_extra_keys(extra_key: ExtraKey | None, block_index: int) -> tuple[Any, ...] | None:
    """vLLM's ``extra_keys`` of block ``block_index`` for a prefixkv namespace.

    The mapping (vLLM's ``generate_block_hash_extra_keys`` order: LoRA, multimodal,
    cache salt, prompt embeddings):

    ==============================  ====================================================
    prefixkv ``ExtraKey`` kind      vLLM extra key
    ==============================  ====================================================
    ``lora`` (+ ``lora_path``)      ``("lora", lora_name, lora_path)`` in every block;
                                    vLLM requires a non-empty path, so give
                                    ``("lora_path", ...)`` to reproduce its hashes;
                                    ``lora_id`` (vLLM's ``lora_int_id``) is not hashed
    ``cache_salt``                  ``("cache_salt", salt)`` in block 0 only
    ``tenant``, ``extra``, others   none in vLLM: ``(kind, value)`` after the salt in
                                    block 0, isolating the namespace in hashes no vLLM
                                    replica produces
    ==============================  ====================================================

    vLLM's multimodal ``("mm", identifier, offset)`` and prompt-embedding keys have no
    prefixkv namespace equivalent.

    Returns:
        The tuple of extra keys, or ``None`` when there are none (as in vLLM).
    """
    every_block, first_block = _namespace_parts(extra_key)
    keys = every_block + first_block if block_index == 0 else every_block
    return keys or None


def _is_unicode(text: str) -> bool:
    # CBOR and vLLM's hashes encode text as UTF-8; a lone surrogate has no encoding.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class VllmBlockHasher:
    """Chained block hashes identical to vLLM 0.33's, with ``BlockHasher``'s interface.

    Args:
        block_size: tokens per block (> 0); vLLM's ``hash_block_size``.
        algorithm: ``"sha256_cbor"`` (default; reproducible across languages),
            ``"sha256"`` (vLLM's default), ``"xxhash"`` or ``"xxhash_cbor"``.
        none_hash_seed: the string ``NONE_HASH`` is derived from; ``None`` applies
            vLLM's rule (:func:`resolve_none_hash_seed`: ``PYTHONHASHSEED``, else the
            fixed default for sha256, else random).

    Attributes:
        root: ``NONE_HASH``, the parent hash of block 0.

    Raises:
        PrefixKVError: a bad block size, algorithm or seed.
    """

    __slots__ = ("_extra_keys", "_hash", "algorithm", "block_size", "none_hash_seed", "root")

    def __init__(
        self,
        block_size: int,
        algorithm: str = "sha256_cbor",
        none_hash_seed: str | None = None,
    ) -> None:
        check_positive("block_size", block_size, MAX_BLOCK_SIZE)
        self._hash = _check_algorithm(algorithm)
        if none_hash_seed is None:
            none_hash_seed = resolve_none_hash_seed(algorithm)
        elif not isinstance(none_hash_seed, str) or not _is_unicode(none_hash_seed):
            raise PrefixKVError(
                f"none_hash_seed must be a str of valid Unicode or None, got {none_hash_seed!r:.80}"
            )
        self.algorithm = algorithm
        self.block_size = block_size
        self.none_hash_seed = none_hash_seed
        self.root = self._hash(none_hash_seed)
        self._extra_keys: dict[ExtraKey | None, tuple[Any, Any]] = {}

    def _keys_for(self, extra_key: ExtraKey | None) -> tuple[Any, Any]:
        # (block-0 extra keys, later blocks' extra keys), memoized per namespace.
        keys = self._extra_keys.get(extra_key)
        if keys is None:
            keys = (block_extra_keys(extra_key, 0), block_extra_keys(extra_key, 1))
            if len(self._extra_keys) < 4096:
                self._extra_keys[extra_key] = keys
        return keys

    def extend(self, hashes: list[bytes], tokens: array[int], extra_key: ExtraKey | None) -> None:
        """Append the hashes of the full blocks of ``tokens`` not in ``hashes`` yet.

        Args:
            hashes: the memo, hashes of blocks ``0 .. len(hashes)-1``; extended in place.
            tokens: the sequence's token ids.
            extra_key: the sequence's namespace (see :func:`block_extra_keys`).

        Complexity: O(new tokens); one serialization and one digest per new block.
        """
        bs = self.block_size
        first = len(hashes)
        last = len(tokens) // bs
        if first >= last:
            return
        first_keys, later_keys = self._keys_for(extra_key)
        fn = self._hash
        parent = hashes[-1] if hashes else self.root
        for i in range(first, last):
            block = tuple(tokens[i * bs : (i + 1) * bs])
            parent = fn((parent, block, first_keys if i == 0 else later_keys))
            hashes.append(parent)
