"""What the facades read from an engine's request: vLLM's ``Request`` and SGLang's ``Req``.

The protocols name the fields each facade reads; ``SimpleRequest`` and ``SimpleReq``
are minimal requests with those fields, for drivers and tests. They live apart from
the facades so that the facades can be compiled while these stay Python: a
``@runtime_checkable`` protocol loses its ``Protocol`` base when compiled, and a
driver may set attributes of its own on a request (a compiled class takes none).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["ReqLike", "RequestLike", "SimpleReq", "SimpleRequest"]


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
class ReqLike(Protocol):
    """What the SGLang facade reads from an SGLang ``Req``.

    Optional attributes ``extra_key``, ``cache_salt``, ``lora_id`` and ``priority``
    are honoured when present.
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
    def output_ids(self) -> list[int]:
        """Sampled tokens so far."""
        ...


class SimpleReq:
    """A minimal ``ReqLike`` for drivers and tests (SGLang ``Req`` fields)."""

    def __init__(
        self,
        rid: Hashable,
        origin_input_ids: Sequence[int],
        *,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        lora_id: str | None = None,
        priority: int = 0,
    ) -> None:
        self.rid = rid
        self.origin_input_ids = list(origin_input_ids)
        self.output_ids: list[int] = []
        self.extra_key = extra_key
        self.cache_salt = cache_salt
        self.lora_id = lora_id
        self.priority = priority
