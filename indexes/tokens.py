"""Token sequences as index keys: validation, namespaces and the per-request hash memo.

``TokenKey`` plays the part of vLLM's ``Request.block_hashes`` (hashes computed once
and extended as tokens are appended) and of SGLang's ``RadixKey`` (token ids plus an
``extra_key`` namespace). Tokens live in a compact ``array('I')`` so slices compare and
hash at C speed.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Sequence
from typing import Final, Protocol, cast

from .errors import InvalidTokenError
from .validation import check_count

__all__ = [
    "TOKEN_BYTES",
    "ChainHasher",
    "ExtraKey",
    "TokenKey",
    "as_token_array",
    "common_prefix_len",
    "key_error",
    "make_extra_key",
    "normalize_extra_key",
]

TOKEN_TYPECODE: Final = "I" if array("I").itemsize == 4 else "L"  # "L": exotic platforms
"""Array typecode of stored tokens: unsigned 32-bit, so ids are 0 <= id < 2**32."""

TOKEN_BYTES: Final = array(TOKEN_TYPECODE).itemsize
_TOKEN_LIMIT: Final = 2**32

ExtraValue = str | int
ExtraKey = tuple[tuple[str, ExtraValue], ...]
"""A request's namespace: ``((kind, value), ...)``, e.g. ``(("lora", "sql"),)``.

The kind is part of the key, so a LoRA named ``"x"`` and a cache salt ``"x"`` are
different namespaces; a value's type is part of it too (``1`` is not ``"1"``).
"""


class ChainHasher(Protocol):
    """What ``TokenKey.block_hashes`` needs of a block hasher: a block size and a way
    to extend a memo of chained block digests (``hashing.BlockHasher``,
    ``vllm_hashing.VllmBlockHasher``)."""

    block_size: int
    """Tokens per hashed block."""

    def extend(self, hashes: list[bytes], tokens: array[int], extra_key: ExtraKey | None) -> None:
        """Append the digests of the full blocks of ``tokens`` not in ``hashes`` yet."""
        ...


def make_extra_key(
    *,
    lora: str | int | None = None,
    cache_salt: str | int | None = None,
    tenant: str | int | None = None,
    extra: str | int | None = None,
    lora_path: str | None = None,
    lora_id: int | None = None,
) -> ExtraKey | None:
    """Build a typed namespace from vLLM/SGLang-style request fields.

    This is the one rule by which the manager and both engine classes combine request
    fields into a namespace: each field becomes one ``(kind, value)`` pair, so
    fields never collide with each other (SGLang concatenates ``extra_key`` and the
    LoRA id into one string; here they stay apart).

    Args:
        lora: the LoRA adapter name or id (vLLM ``lora_request.lora_name``, SGLang
            ``lora_id``).
        cache_salt: vLLM's and SGLang's ``cache_salt``.
        tenant: a tenant id for multi-tenant isolation.
        extra: SGLang's ``extra_key`` (caller-defined request classification); a
            plain string given as a namespace anywhere means the same.
        lora_path: the LoRA adapter's path (vLLM ``lora_request.lora_path``): part
            of vLLM's block hashes, so needed to reproduce them; only with ``lora``.
        lora_id: the LoRA adapter's int id (vLLM ``lora_request.lora_int_id``):
            published in vLLM's events, never hashed by vLLM; only with ``lora``.

        ``lora``, ``cache_salt``, ``tenant`` and ``extra`` are each a str or an int
        (not a bool), or ``None``.

    Returns:
        The namespace, or ``None`` when every field is ``None`` (the shared default).

    Raises:
        InvalidTokenError: a field of the wrong type, or ``lora_path``/``lora_id``
            without ``lora``.
    """
    parts: list[tuple[str, object]] = []
    if lora is None and (lora_path is not None or lora_id is not None):
        raise InvalidTokenError("lora_path and lora_id describe a LoRA: give lora too")
    if lora is not None:
        parts.append(("lora", lora))
        if lora_path is not None:
            if not isinstance(lora_path, str):
                raise InvalidTokenError(f"lora_path must be a str, got {lora_path!r}")
            parts.append(("lora_path", lora_path))
        if lora_id is not None:
            if type(lora_id) is not int:
                raise InvalidTokenError(f"lora_id must be an int, got {lora_id!r}")
            parts.append(("lora_id", lora_id))
    if cache_salt is not None:
        parts.append(("cache_salt", cache_salt))
    if tenant is not None:
        parts.append(("tenant", tenant))
    if extra is not None:
        parts.append(("extra", extra))
    return normalize_extra_key(tuple(parts)) if parts else None


def normalize_extra_key(extra_key: object) -> ExtraKey | None:
    """Check and canonicalize a namespace given as ``None``, a str or pairs.

    A plain string ``s`` means ``(("extra", s),)`` (SGLang's ``extra_key``). The
    pairs are sorted, and an empty ``cache_salt`` or ``lora_path`` is left out: both
    engines treat an empty salt as none (vLLM's ``if request.cache_salt``, SGLang's
    ``cache_salt or None``) and vLLM hashes a missing LoRA path as ``""``, so a
    namespace equals another exactly when every block hasher keys them alike.

    Raises:
        InvalidTokenError: the value is not ``None``, a str or ``(kind, value)`` pairs
            with str kinds and str/int values; a kind given twice; or a str that is
            not valid Unicode (a lone surrogate, which no hash can encode).
    """
    if extra_key is None:
        return None
    if isinstance(extra_key, str):
        _check_text(extra_key, extra_key)
        return (("extra", extra_key),)
    if not isinstance(extra_key, tuple):
        raise InvalidTokenError(
            f"extra_key must be None, a str or a tuple of (kind, value) pairs, got {extra_key!r}"
        )
    kinds: set[str] = set()
    pairs: list[tuple[str, ExtraValue]] = []
    for item in extra_key:
        ok = (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], (str, int))
            and not isinstance(item[1], bool)
        )
        if not ok:
            raise InvalidTokenError(
                f"extra_key entries must be (str kind, str|int value), got {item!r} "
                f"in {extra_key!r}"
            )
        kind, value = item
        if kind in kinds:
            # One value per kind: hashers that read a field by its kind would see
            # only one of two, and two namespaces would share blocks.
            raise InvalidTokenError(f"extra_key gives the kind {kind!r} twice in {extra_key!r}")
        kinds.add(kind)
        _check_text(kind, extra_key)
        if isinstance(value, str):
            _check_text(value, extra_key)
            if value == "" and kind in _EMPTY_MEANS_NONE:
                continue
        pairs.append((kind, value))
    if not pairs:
        return None
    return tuple(sorted(pairs, key=lambda kv: kv[0]))  # kinds are unique


_EMPTY_MEANS_NONE: Final = frozenset({"cache_salt", "lora_path"})


def _check_text(text: str, extra_key: object) -> None:
    # Hashers encode namespaces as UTF-8; a lone surrogate has no encoding.
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidTokenError(
                f"extra_key strings must be valid Unicode (no lone surrogates), got "
                f"{text!r:.80} in {extra_key!r:.120}"
            ) from None


def _find_bad_token(tokens: Iterable[object], offset: int) -> tuple[int, object] | None:
    """Slow path: position (``offset`` for the first) and value of the first token that
    is not a valid id."""
    for i, t in enumerate(tokens, offset):
        if type(t) is bool or not isinstance(t, int) or not 0 <= t < 2**32:
            if type(t) is not bool and hasattr(t, "__index__"):
                v = t.__index__()  # numpy / torch integer scalars
                if 0 <= v < 2**32:
                    continue
            return i, t
    return None


_LOW_BYTE: Final = 0 if sys.byteorder == "little" else TOKEN_BYTES - 1


def _contains_bool(tokens: Sequence[object], values: array[int]) -> bool:
    """Whether a list or tuple held True/False (``values`` is its converted array).

    Bools convert to 1 and 0, so only positions whose low byte is 0 or 1 can hold
    one: a strided copy of the low bytes and ``find`` locate those few in C.
    """
    with memoryview(values) as view, view.cast("B") as raw:
        low = raw[_LOW_BYTE::TOKEN_BYTES].tobytes()
    for byte in (b"\x00", b"\x01"):
        pos = low.find(byte)
        while pos != -1:
            t = tokens[pos]
            if t is True or t is False:
                return True
            pos = low.find(byte, pos + 1)
    return False


def _small_valid(tokens: object) -> bool:
    # Decode steps append one token (vLLM's engine class: a block of 16 when one fills):
    # checking up to 32 in a Python loop beats the C passes (array, memoryview, find),
    # in CPython by about 2x at 16 tokens, and more where this module is compiled.
    if type(tokens) is not list or len(tokens) > 32:
        return False
    for t in tokens:  # noqa: SIM110 - a plain loop is faster than all() over a genexpr
        if type(t) is not int or not 0 <= t < _TOKEN_LIMIT:
            return False
    return True


def checked_tokens(tokens: Iterable[int], offset: int = 0) -> Sequence[int]:
    """Validated token ids: a short list of valid ids as it is, anything else copied.

    For a decode step's one token, the check without the copy; the caller must not
    keep the result past the caller's own mutation of ``tokens``.

    Raises:
        InvalidTokenError: as :func:`as_token_array`.
    """
    if _small_valid(tokens):
        return cast("list[int]", tokens)
    return as_token_array(tokens, offset)


def as_token_array(tokens: Iterable[int], offset: int = 0) -> array[int]:
    """Validate token ids and copy them into a fresh ``array('I')``.

    Accepts lists, tuples, ``array`` objects and other iterables of ints (numpy and
    torch integer scalars too). Runs at C speed for lists, tuples and arrays.

    Args:
        tokens: the ids.
        offset: where ``tokens`` starts in the sequence the caller was given (a
            tail past what a key already holds), so a message counts positions in
            that sequence, as its caller does, from its start.

    Raises:
        InvalidTokenError: an id is a bool, not an int, negative or >= 2**32; the
            message gives its position and value.
    """
    if isinstance(tokens, array) and tokens.typecode == TOKEN_TYPECODE:
        return tokens[:]  # a plain array('I') copy, one memcpy (the constructor parses)
    if _small_valid(tokens):
        return array(TOKEN_TYPECODE, tokens)
    if isinstance(tokens, (list, tuple)):
        seq: Sequence[object] = tokens
    else:
        try:
            seq = list(tokens)
        except TypeError:
            raise InvalidTokenError(
                f"tokens must be a sequence of int token ids, got {tokens!r}"
            ) from None
    try:
        out: array[int] = array(TOKEN_TYPECODE, cast("Sequence[int]", seq))
        if _contains_bool(seq, out):
            raise TypeError("bool token")
        return out
    except (TypeError, OverflowError, ValueError):
        bad = _find_bad_token(seq, offset)
        if bad is None:  # pragma: no cover - array rejected something we accept
            raise
        pos, value = bad
        raise InvalidTokenError(
            f"token ids must be ints with 0 <= id < 2**32; position {pos} holds {value!r}"
        ) from None


def common_prefix_len(a: array[int], a_start: int, b: array[int], b_start: int, n: int) -> int:
    """Length of the common prefix of ``a[a_start:a_start+n]`` and ``b[b_start:b_start+n]``.

    No per-token Python loop: one C compare when the runs agree (the common case in
    a radix walk), else a binary search over byte-string compares (memcmp).
    Both arrays must have the same typecode and hold at least ``n`` items there.

    Complexity: O(n) in C, O(log n) Python steps.
    """
    if n <= 0:
        return 0
    if a_start == 0 and n == len(a):
        if a == b[b_start : b_start + n]:  # a whole segment: compare without copying it
            return n
    elif a[a_start : a_start + n] == b[b_start : b_start + n]:
        return n
    w = TOKEN_BYTES
    x = a[a_start : a_start + n].tobytes()
    y = b[b_start : b_start + n].tobytes()
    lo, hi = 0, n  # x and y agree on [0, lo) tokens and differ somewhere in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if x[lo * w : mid * w] == y[lo * w : mid * w]:
            lo = mid
        else:
            hi = mid
    return lo


class TokenKey:
    """The token ids of one sequence, its namespace, and its memoized block hashes.

    A key belongs to one request: the manager appends decode tokens to it, and the
    hash chain extends the memoized hashes from ``len(hashes) * block_size`` instead
    of recomputing them (SPEC HC-3). A new request with the same prompt gets a new
    key, whose memo starts empty.

    Args:
        tokens: token ids (validated, copied).
        extra_key: the namespace: ``None`` (shared), a str, or ``(kind, value)`` pairs
            (see :func:`make_extra_key`).
        priority: an int, the eviction priority hint for the radix tree's
            ``priority`` policy (SGLang ``Req.priority``); higher survives longer.

    Raises:
        InvalidTokenError: a bad token id or namespace.
    """

    __slots__ = (
        "_extra_key",
        "_hash_block_size",
        "_hash_memo",
        "_hash_owner",
        "_index_memo",
        "_index_owner",
        "priority",
        "tokens",
    )

    def __init__(
        self,
        tokens: Iterable[int],
        extra_key: str | ExtraKey | None = None,
        priority: int = 0,
    ) -> None:
        if type(priority) is not int:
            raise InvalidTokenError(f"priority must be an int, got {priority!r}")
        self.tokens: array[int] = as_token_array(tokens)
        """The token ids, an ``array('I')``: read it, never assign or mutate it."""
        self._extra_key = normalize_extra_key(extra_key)
        self.priority = priority
        self._hash_owner: ChainHasher | None = None
        self._hash_memo: list[bytes] = []
        self._hash_block_size = 1  # the owner's block size
        self._index_owner: object = None
        self._index_memo: object = None

    @property
    def extra_key(self) -> ExtraKey | None:
        """The namespace; keys in different namespaces never share cache entries."""
        return self._extra_key

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        head = ", ".join(map(str, self.tokens[:8]))
        more = ", ..." if len(self.tokens) > 8 else ""
        return f"TokenKey([{head}{more}] ({len(self)} tokens), extra_key={self._extra_key!r})"

    def append(self, tokens: Iterable[int], offset: int = 0) -> None:
        """Append decoded tokens (validated). Memoized hashes stay valid.

        Args:
            tokens: the new ids.
            offset: where ``tokens`` starts in the caller's sequence (e.g. the key's
                length, for a request's token list past it), for error positions.

        Raises:
            InvalidTokenError: a bad token id or offset; the key is unchanged.
        """
        if type(offset) is not int:
            offset = check_count("offset", offset, error=InvalidTokenError)
        if _small_valid(tokens):
            self.tokens.fromlist(cast("list[int]", tokens))  # extend() would iterate
        elif type(tokens) is array and tokens.typecode == TOKEN_TYPECODE:  # only ids
            self.tokens.extend(tokens)
        else:
            self.tokens.extend(as_token_array(tokens, offset))

    def index_memo(self, owner: object) -> object:
        """What an index keeps about this key (the radix tree: the tokens it inserted
        and the node it ended at), or ``None`` when another index wrote it last.
        """
        return self._index_memo if self._index_owner is owner else None

    def set_index_memo(self, owner: object, value: object) -> None:
        """Store ``value`` for ``owner`` (see ``index_memo``)."""
        self._index_owner = owner
        self._index_memo = value

    def block_hashes(self, hasher: ChainHasher) -> list[bytes]:
        """Hashes of every full block, computing only those not memoized yet.

        The returned list is the memo itself: read it, do not mutate it. A key
        used with a different hasher (another index) starts a fresh memo.

        Complexity: O(new full blocks); one C hash call per new block.
        """
        if self._hash_owner is not hasher:
            self._hash_owner = hasher
            self._hash_memo = []
            self._hash_block_size = hasher.block_size  # read once: a protocol attribute
        memo = self._hash_memo
        if len(memo) < len(self.tokens) // self._hash_block_size:
            hasher.extend(memo, self.tokens, self._extra_key)
        return memo


def key_error(name: str, value: object) -> InvalidTokenError:
    """The error for ``value`` given as ``name``, a key, that is not a :class:`TokenKey`.

    An entry point that takes a key raises it itself, ``if not isinstance(key,
    TokenKey): raise key_error("key", key)``: the parameter is narrowed without being
    reassigned (compiled, an argument that is reassigned is held as a reference of the
    function's own), and the message is written once.
    """
    return InvalidTokenError(f"{name} must be a TokenKey, got {value!r:.80}")
