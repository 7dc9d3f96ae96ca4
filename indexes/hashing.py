"""Chained block hashes in the style of vLLM's ``hash_block_tokens``, and the choice of hasher.

prefixkv's own chain: ``H_0 = D(root || namespace || bytes(block_0))`` and
``H_i = D(H_{i-1} || bytes(block_i))``, where ``D`` is xxh3-128 (fast, the default) or
sha256 (``sha256_raw``, collision resistant). Unlike vLLM, nothing is pickled: each
full block's token bytes are sliced from the key's array and hashed with one C call
(SPEC HC-2, HC-12). :func:`make_block_hasher` picks this chain or vLLM's exact one
(:mod:`.vllm_hashing`) by name.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from array import array
from collections.abc import Callable
from typing import Any, cast

import xxhash

from .errors import PrefixKVError
from .tokens import TOKEN_BYTES, ChainHasher, ExtraKey, normalize_extra_key
from .validation import MAX_BLOCK_SIZE, check_positive
from .vllm_hashing import VLLM_HASH_FUNCTIONS, VllmBlockHasher

__all__ = [
    "BLOCK_HASH_ALGORITHMS",
    "HASH_ALGORITHMS",
    "BlockHasher",
    "encode_extra_key",
    "make_block_hasher",
]

Digest = Callable[[bytes], bytes]

_RECENT = 32
"""Recently hashed sequences a new one may start from (``BlockHasher._reuse``). With 16,
a conversation's next turn or a document's next question often came after 16 others
(head_to_head's multi-turn and long-document replays hashed 25 and 27 blocks a request;
with 32, 19 and 14), each scanned entry costing far less than a block's hash."""


_Recent = tuple[bytes, bytes, bytes, list[bytes], "ExtraKey | None", "array[int]", int]
"""A recently hashed sequence (``BlockHasher._recent``): its full blocks' bytes, block 0's,
the last block's, its hash memo, namespace, tokens and the blocks it shared on arrival."""


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


HASH_ALGORITHMS: dict[str, Digest] = {
    "xxh3_128": xxhash.xxh3_128_digest,
    "sha256_raw": _sha256,
}
"""prefixkv's own chain's digests by name: ``xxh3_128`` (default) and ``sha256_raw``."""

BLOCK_HASH_ALGORITHMS: tuple[str, ...] = (*HASH_ALGORITHMS, *VLLM_HASH_FUNCTIONS)
"""Every name :func:`make_block_hasher` takes: prefixkv's chains, then vLLM's exact ones
(``sha256``, ``sha256_cbor``, ``xxhash``, ``xxhash_cbor``)."""


def encode_extra_key(extra_key: ExtraKey | None) -> bytes:
    """Unambiguous bytes of a namespace, entering block 0's hash.

    Every field is length-prefixed and every value carries a type tag, so no two
    different namespaces encode alike (a LoRA ``"x"`` is not a salt ``"x"``).
    """
    if extra_key is not None and type(extra_key) is not tuple:  # a str, or no namespace
        extra_key = normalize_extra_key(extra_key)
    if not extra_key:
        return b"\x00\x00\x00\x00"
    out = [struct.pack("<I", len(extra_key))]
    for kind, value in extra_key:
        k = kind.encode()
        if isinstance(value, str):
            tag, v = b"s", value.encode()
        else:
            tag, v = b"i", str(value).encode()
        out += [struct.pack("<I", len(k)), k, tag, struct.pack("<I", len(v)), v]
    return b"".join(out)


def _seed_bytes(seed: object) -> bytes:
    # A type tag first, so 0, "\x00" and b"\x00" are three different seeds.
    if seed is None:
        return b"r" + os.urandom(16)
    if isinstance(seed, bytes):
        return b"b" + seed
    if isinstance(seed, str):
        return b"s" + seed.encode("utf-8", "surrogatepass")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return b"i" + str(seed).encode()
    raise PrefixKVError(f"hash seed must be None, an int, a str or bytes, got {seed!r:.80}")


def _checked_digest(digest: Digest, data: bytes) -> bytes:
    # A digest callable must map bytes to bytes: tried once, on the root, so a wrong
    # one is named at construction rather than failing at some later lookup.
    try:
        out = digest(data)
    except (TypeError, ValueError, AttributeError) as e:
        raise PrefixKVError(f"the digest callable {digest!r:.80} failed on bytes: {e}") from None
    if type(out) is not bytes or not out:
        raise PrefixKVError(f"the digest callable {digest!r:.80} returned {out!r:.40}, not bytes")
    return out


class BlockHasher:
    """Computes the chained hashes of full blocks for one index.

    Args:
        block_size: tokens per block (> 0).
        algorithm: ``"xxh3_128"``, ``"sha256"``, or a callable ``bytes -> bytes``
            (tests use a deliberately colliding one).
        seed: the root seed. ``None`` draws 16 random bytes per hasher, so block
            hashes cannot be predicted (and collisions cannot be searched for
            offline, vLLM #12621); give a seed to make hashes reproducible across
            processes, as vLLM does with ``PYTHONHASHSEED``.

    Raises:
        PrefixKVError: a bad block size, algorithm or seed.
    """

    __slots__ = ("_digest", "_namespace_roots", "_recent", "algorithm", "block_size", "root")

    def __init__(
        self,
        block_size: int,
        algorithm: str | Digest = "xxh3_128",
        seed: int | str | bytes | None = None,
    ) -> None:
        size = check_positive("block_size", block_size, MAX_BLOCK_SIZE)
        if isinstance(algorithm, str) and algorithm in HASH_ALGORITHMS:
            self._digest: Digest = HASH_ALGORITHMS[algorithm]
            self.algorithm: str = algorithm
        elif callable(algorithm) and not isinstance(algorithm, type):
            self._digest = cast(Any, algorithm)
            self.algorithm = str(getattr(algorithm, "__name__", "custom"))
        else:
            names = ", ".join(sorted(HASH_ALGORITHMS))
            raise PrefixKVError(
                f"unknown hash algorithm {algorithm!r:.80}; known: {names}, or a digest "
                "callable bytes -> bytes"
            )
        self.block_size = size
        self.root = _checked_digest(self._digest, b"prefixkv-root\x00" + _seed_bytes(seed))
        self._namespace_roots: dict[ExtraKey | None, bytes] = {}
        # The last few sequences hashed from block 0, newest first: the bytes of their
        # full blocks then, of block 0 and of the last of them, their hash memo, namespace,
        # tokens, and the blocks they shared with an earlier one. A key's memo and tokens
        # grow only by appending, so memo[i] stays the hash of block i; see _reuse.
        self._recent: list[_Recent] = []

    def _parent_of_block_zero(self, extra_key: ExtraKey | None) -> bytes:
        # root || namespace acts as the "parent hash" of block 0; cached per namespace.
        parent = self._namespace_roots.get(extra_key)
        if parent is None:
            parent = self.root + encode_extra_key(extra_key)
            if len(self._namespace_roots) < 4096:
                self._namespace_roots[extra_key] = parent
        return parent

    def extend(self, hashes: list[bytes], tokens: array[int], extra_key: ExtraKey | None) -> None:
        """Append the hashes of the full blocks of ``tokens`` not in ``hashes`` yet.

        Args:
            hashes: the memo, hashes of blocks ``0 .. len(hashes)-1``; extended in place.
            tokens: the sequence's token ids.
            extra_key: the sequence's namespace (enters block 0 only; the chain
                carries it into every later hash).

        Complexity: O(new blocks), one digest call each; only the new tokens are copied.
        """
        bs = self.block_size
        first = len(hashes)
        last = len(tokens) // bs
        if first >= last:
            return
        data = tokens[first * bs : last * bs].tobytes()
        step = bs * TOKEN_BYTES
        pos = 0
        if first == 0:  # a new sequence: start from a recent one's hashes where it can
            pos = self._reuse(hashes, data, tokens, extra_key) * step
        digest = self._digest
        parent = hashes[-1] if hashes else self._parent_of_block_zero(extra_key)
        if pos == 0 and len(data) == step:  # one block (a decode step filled it): no slice
            hashes.append(digest(parent + data))
            return
        while pos < len(data):  # compiled, range() with a variable step is a Python call
            parent = digest(parent + data[pos : pos + step])
            hashes.append(parent)
            pos += step

    def memory_bytes(self) -> int:
        """Bytes the hasher keeps alive: the recent sequences it may start a new one
        from (their token bytes, token arrays and hash lists; a finished request's stay
        alive here until _RECENT newer ones push them out) and the namespaces' roots."""
        total = sys.getsizeof(self._recent) + sys.getsizeof(self._namespace_roots)
        for seen, head, tail, memo, _, tokens, _ in self._recent:
            total += sys.getsizeof(seen) + sys.getsizeof(head) + sys.getsizeof(tail)
            total += sys.getsizeof(tokens)
            total += sys.getsizeof(memo) + sum(sys.getsizeof(h) for h in memo)
        return total + sum(sys.getsizeof(r) for r in self._namespace_roots.values())

    def _reuse(
        self, hashes: list[bytes], data: bytes, tokens: array[int], extra_key: ExtraKey | None
    ) -> int:
        """Fill an empty memo with the hashes of the leading blocks ``data`` (the token
        bytes of a new sequence's full blocks) shares with a recently hashed sequence of
        the same namespace; the blocks filled.

        Hashes chain from block 0, so equal tokens up to a block (and one namespace, one
        hasher) mean equal hashes up to it: the bytes are compared, never the hashes
        trusted. Requests share prefixes with the ones just before them (a system prompt,
        a conversation's previous turn, a document). A sequence whose whole first hashing
        starts ``data`` is taken (with its decoded blocks, where ``data`` goes on with
        them), else the common prefix of the newest one with the same block 0 (the
        prefix that one shared with its own predecessor tried first, then a binary
        search of memcmps; another document's request shares nothing). The sequence
        then joins the recent ones, sharing block 0's bytes object with those it
        matched. O(len(data)) in C, O(_RECENT) in Python.
        """
        bs = self.block_size
        step = bs * TOKEN_BYTES
        last = len(data) // step
        best: list[bytes] | None = None
        best_n = 0
        best_tokens = tokens
        newest: tuple[bytes, list[bytes], int] | None = None
        # Sequences that share block 0 share its bytes object (see the insert below), so
        # once one is found equal, the others with it are known equal without a compare.
        head0: bytes | None = None
        for seen, head, tail, memo, ns, seen_tokens, shared in self._recent:
            if ns is not extra_key and ns != extra_key:
                continue  # another namespace: nothing shared
            if head is not head0:
                if not data.startswith(head):
                    continue  # block 0 differs: nothing shared
                head0 = head
            if newest is None:
                newest = (seen, memo, shared)
            n = len(seen) // step
            if best_n < n <= last and _starts_with(data, seen, tail, n * step):
                best, best_n, best_tokens = memo, n, seen_tokens
        if best is not None:
            k = min(len(best), last)  # its blocks decoded since, where data goes on
            if k > best_n and data[best_n * step : k * step] == (
                best_tokens[best_n * bs : k * bs].tobytes()
            ):
                best_n = k
        elif newest is not None:
            best = newest[1]
            best_n = _common_blocks(data, newest[0], step, newest[2])
        if best is not None:
            best_n = min(best_n, len(best))
            if best_n:
                hashes += best[:best_n]
        recent = self._recent
        head = data[:step] if head0 is None else head0  # equal bytes: data starts with it
        recent.insert(0, (data, head, data[-step:], hashes, extra_key, tokens, best_n))
        if len(recent) > _RECENT:
            recent.pop()
        return best_n


def _starts_with(data: bytes, seen: bytes, tail: bytes, end: int) -> bool:
    """``data.startswith(seen)``, ``tail`` (``seen``'s last block, ``end`` its length)
    compared first: sequences that share a system prompt or a document part right after
    it, and one block decides that for less than the whole compare costs."""
    return data[end - len(tail) : end] == tail and data.startswith(seen)


def _common_blocks(a: bytes, b: bytes, step: int, guess: int) -> int:
    """How many leading ``step``-byte blocks ``a`` and ``b`` share: ``guess`` blocks
    tried first (what ``b`` shared with the sequence before it: requests that share a
    system prompt or a document share it with each other alike), then a binary search of
    compares (memcmp) of equal pieces. Compiled, a slice and a compare are native calls,
    where ``startswith`` at an offset was a Python method call."""
    lo, hi = 0, min(len(a), len(b)) // step
    if a.startswith(b[: hi * step]):
        return hi
    if 0 < guess < hi:  # two compares settle it when the guess is right
        g = guess * step
        if not a.startswith(b[:g]):
            hi = guess
        elif a[g : g + step] != b[g : g + step]:
            return guess
        else:
            lo = guess + 1
    while hi - lo > 1:  # a, b agree on lo blocks and differ within the first hi
        mid = (lo + hi) // 2
        if a[lo * step : mid * step] == b[lo * step : mid * step]:
            lo = mid
        else:
            hi = mid
    return lo


def make_block_hasher(
    block_size: int,
    algorithm: str | Digest = "xxh3_128",
    seed: int | str | bytes | None = None,
) -> ChainHasher:
    """The block hasher named ``algorithm``.

    ==================  ==============================================  ====================
    ``algorithm``       digest of block ``i``                           same hashes as
    ==================  ==============================================  ====================
    ``xxh3_128``        xxh3-128 of ``H_{i-1} || token bytes``          prefixkv, same seed
    ``sha256_raw``      sha256 of ``H_{i-1} || token bytes``            prefixkv, same seed
    ``sha256``          vLLM's: sha256 of pickled                       vLLM 0.33, same
                        ``(H_{i-1}, tokens, extra_keys)``               ``PYTHONHASHSEED``
    ``sha256_cbor``     vLLM's: sha256 of canonical CBOR of the same    vLLM 0.33, any
                                                                        language
    ``xxhash``          vLLM's: xxh3-128 of the pickle                  vLLM 0.33, same
                                                                        ``PYTHONHASHSEED``
    ``xxhash_cbor``     vLLM's: xxh3-128 of the CBOR                    vLLM 0.33, same
                                                                        ``PYTHONHASHSEED``
    ==================  ==============================================  ====================

    Args:
        block_size: tokens per block (> 0).
        algorithm: a name above, or a digest callable ``bytes -> bytes`` for
            prefixkv's chain.
        seed: prefixkv's chains: the root seed (``None``: random per hasher). vLLM's:
            plays ``PYTHONHASHSEED`` (an int or str; ``None`` reads the environment
            and falls back as vLLM does: a fixed seed for the sha256 variants, a
            random one for the xxhash variants).

    Raises:
        PrefixKVError: an unknown name or an algorithm of another type, a bad block
            size, or a seed vLLM cannot take (bytes, or a str that is not valid
            Unicode) for a vLLM algorithm.
    """
    if isinstance(algorithm, str) and algorithm in VLLM_HASH_FUNCTIONS:
        if seed is not None and (type(seed) is bool or not isinstance(seed, (int, str))):
            raise PrefixKVError(
                f"hash {algorithm!r} takes vLLM's PYTHONHASHSEED as seed (an int or str), "
                f"got {seed!r:.80}"
            )
        size = check_positive("block_size", block_size, MAX_BLOCK_SIZE)
        return VllmBlockHasher(size, algorithm, None if seed is None else str(seed))
    if isinstance(algorithm, str) and algorithm not in HASH_ALGORITHMS:
        raise PrefixKVError(
            f"unknown hash algorithm {algorithm!r:.80}; known: "
            f"{', '.join(BLOCK_HASH_ALGORITHMS)}, or a digest callable bytes -> bytes"
        )
    return BlockHasher(block_size, algorithm, seed)
