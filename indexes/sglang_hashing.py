"""Page hashes computed exactly as SGLang 0.5.23 computes them for its KV events.

Mirrors ``sglang/srt/mem_cache/cpp_utils/hash_binding.cpp`` (``get_hash_str``: page
``i`` hashes to ``sha256(digest_{i-1} || token ids as little-endian uint32)``, the
first page of a chain without a prior digest), ``utils.compute_node_event_hash_values``
(a namespace with a ``cache_salt`` starts its chain from
``sha256(b"sglang-cache-salt-v1\\0" || salt)``; SGLang's ``extra_key`` does not enter
the hashes) and ``utils.hash_str_to_int64`` (an event carries the digest's first 8
bytes as a signed big-endian int). The radix tree uses these for the page digests it
reports to an event sink; a router can recompute them from token ids.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

from .tokens import TOKEN_BYTES, ExtraKey

__all__ = ["SALT_SEED_TAG", "namespace_prior", "page_hashes", "to_event_hash", "to_event_hashes"]

SALT_SEED_TAG = b"sglang-cache-salt-v1\x00"
"""What SGLang hashes before a cache salt to seed the salted namespace's chain."""


def namespace_prior(extra_key: ExtraKey | None) -> bytes | None:
    """The digest a namespace's first page chains from: its cache salt's seed, or ``None``.

    Only the ``cache_salt`` part of a prefixkv namespace counts, as in SGLang (an
    empty salt is no salt: SGLang's ``cache_salt or None``).
    """
    if not extra_key:
        return None
    for kind, value in extra_key:
        if kind == "cache_salt" and value != "":
            return hashlib.sha256(SALT_SEED_TAG + str(value).encode("utf-8")).digest()
    return None


def page_hashes(tokens: array[int], prior: bytes | None, page_size: int) -> list[bytes]:
    """The chained sha256 digests of the pages of ``tokens`` (a partial last page too).

    Args:
        tokens: token ids, an ``array`` of 4-byte unsigned ints.
        prior: the digest of the page before the first one, ``None`` at a chain start.
        page_size: tokens per page (> 0).

    Complexity: O(len(tokens)), one sha256 per page.
    """
    assert TOKEN_BYTES == 4
    if sys.byteorder == "big":  # pragma: no cover - SGLang hashes little-endian words
        tokens = array(tokens.typecode, tokens)
        tokens.byteswap()
    data = tokens.tobytes()
    step = page_size * TOKEN_BYTES
    sha256 = hashlib.sha256
    out: list[bytes] = []
    for pos in range(0, len(data), step):
        page = data[pos : pos + step]
        prior = sha256(page if prior is None else prior + page).digest()
        out.append(prior)
    return out


def to_event_hash(digest: bytes) -> int:
    """The signed 64-bit int an SGLang event carries for a page digest (its first 8 bytes)."""
    return int.from_bytes(digest[:8], "big", signed=True)


def to_event_hashes(digests: Sequence[bytes]) -> list[int]:
    """:func:`to_event_hash` of each digest, in one C-level pass. O(len(digests))."""
    words = array("q", b"".join([d[:8] for d in digests]))
    if sys.byteorder == "little":
        words.byteswap()
    return words.tolist()
