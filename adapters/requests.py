"""What the engine APIs read from an engine's request: vLLM's ``Request`` and SGLang's ``Req``.

The protocols name the fields each reads (SGLang's prefix cache also keeps its per-request
state on the request, as SGLang does); ``SimpleRequest`` and ``SimpleReq`` are minimal
requests with those fields, for drivers and tests. They live apart from the compiled
classes so that those can be compiled while these stay Python: a
``@runtime_checkable`` protocol loses its ``Protocol`` base when compiled, and a
driver may set attributes of its own on a request (a compiled class takes none).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["ReqKvInfo", "ReqKvLike", "ReqLike", "RequestLike", "SimpleReq", "SimpleRequest"]


@runtime_checkable
class RequestLike(Protocol):
    """What prefixkv's vLLM ``KVCacheManager`` reads from a vLLM ``Request``.

    Optional attributes, read when present as vLLM's ``Request`` has them:
    ``cache_salt`` (str) and ``lora_request`` (``lora_name``, ``lora_path``,
    ``lora_int_id``) select the namespace, as in vLLM's block hashes;
    ``skip_reading_prefix_cache``, ``num_preemptions`` and ``status`` steer lookups,
    stats and the watermark.
    """

    @property
    def request_id(self) -> Hashable:
        """The request's id (a str in vLLM)."""
        ...

    @property
    def all_token_ids(self) -> Sequence[int]:
        """Prompt then output tokens."""
        ...

    @property
    def num_tokens(self) -> int:
        """``len(all_token_ids)``."""
        ...

    num_computed_tokens: int


@dataclass
class SimpleRequest:
    """A minimal ``RequestLike`` for drivers and tests (vLLM ``Request`` fields)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    cache_salt: str | None = None
    all_token_ids: list[int] = field(init=False)

    def __post_init__(self) -> None:
        # Kept up to date like vLLM's Request._all_token_ids, not rebuilt per read.
        self.all_token_ids = self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus output length."""
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_id: int) -> None:
        """Record a sampled token (its KV is computed next step)."""
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)


@runtime_checkable
class ReqKvLike(Protocol):
    """A request's cache state, SGLang's ``ReqKvInfo`` fields (``req.kv``).

    The scheduler sets the row and the lengths at admission and each step; the cache
    moves ``cache_protected_len`` (the tokens of the row the cache owns) at each
    checkpoint.
    """

    req_pool_idx: int | None
    """The request's row in the row store; ``None`` when it holds none."""
    cache_protected_len: int
    cache_inserted_len: int
    kv_committed_len: int
    kv_allocated_len: int


@runtime_checkable
class ReqLike(Protocol):
    """What the SGLang prefix cache reads and writes of an SGLang ``Req``.

    ``extra_key``, ``cache_salt`` and ``lora_id`` are the namespace, each a field of
    its own (SGLang's ``Req`` also appends its LoRA id to ``extra_key``); ``kv``,
    ``last_node`` and ``lock`` are the request's cache state, kept on the request as
    SGLang keeps it.
    """

    @property
    def rid(self) -> Hashable:
        """Request id."""
        ...

    @property
    def origin_input_ids(self) -> Sequence[int]:
        """Prompt token ids."""
        ...

    @property
    def output_ids(self) -> Sequence[int]:
        """Sampled tokens so far (a list, or SGLang's ``array``)."""
        ...

    @property
    def extra_key(self) -> object:
        """SGLang's namespace string (``None``: the shared one); checked by the cache."""
        ...

    @property
    def cache_salt(self) -> object:
        """A salt (a str) that isolates the request's cache entries; checked by the cache."""
        ...

    @property
    def lora_id(self) -> object:
        """The LoRA adapter's id (a str) or ``None``; checked by the cache."""
        ...

    @property
    def priority(self) -> object:
        """Eviction hint (an int or ``None``) for the radix tree's ``priority`` policy."""
        ...

    @property
    def kv(self) -> ReqKvLike:
        """The request's cache state."""
        ...

    prefix_len: int
    last_node: object
    lock: object


@dataclass(slots=True)
class ReqKvInfo:
    """A minimal ``ReqKvLike`` (SGLang's ``ReqKvInfo``)."""

    req_pool_idx: int | None = None
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0


class SimpleReq:
    """A minimal ``ReqLike`` for drivers and tests (SGLang ``Req`` fields).

    As SGLang's ``Req`` does, a ``lora_id`` is appended to ``extra_key`` (and kept as
    ``lora_id``, which the cache keys apart). The prompt is kept as given (a list,
    tuple or array), not copied.
    """

    def __init__(
        self,
        rid: Hashable,
        origin_input_ids: Sequence[int],
        *,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        lora_id: str | None = None,
        priority: int | None = 0,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = origin_input_ids
        self.output_ids: list[int] = []
        if lora_id is not None:
            extra_key = (extra_key or "") + lora_id  # SGLang's Req does the same
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.lora_id = lora_id
        self.priority = priority
        self.kv = ReqKvInfo()
        self.prefix_len = 0
        self.last_node: object = None
        self.lock: object = None

    def __repr__(self) -> str:
        return f"SimpleReq({self.rid!r}, {len(self.origin_input_ids)} prompt tokens)"
