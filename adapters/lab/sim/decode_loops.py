"""The K-live seats' decode loops, compiled in the compiled build so each step calls the
engine class natively; a step hook, when given, runs after each step but a release.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Any

from prefixkv.adapters.sglang.prefix_cache import PrefixCache
from prefixkv.adapters.sglang.simulated import alloc_for_decode
from prefixkv.adapters.vllm.kv_cache_manager import KVCacheManager

__all__ = ["DecodeStep", "VllmRequest", "sglang_decode", "vllm_decode"]

DecodeStep = Callable[[], object]
"""A hook called at the end of each scheduler step of a decode loop."""


class VllmRequest:
    """What vLLM's ``KVCacheManager`` reads of a request (vLLM ``Request`` fields);
    ``num_tokens`` is kept equal to ``len(all_token_ids)``."""

    __slots__ = ("all_token_ids", "num_computed_tokens", "num_tokens", "request_id")

    def __init__(self, request_id: str, prompt: Any) -> None:
        self.request_id = request_id
        self.all_token_ids: array[int] = array("I", prompt)
        self.num_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0

    def append(self, token: int) -> None:
        """Record a sampled token (vLLM's ``append_output_token_ids``)."""
        self.all_token_ids.append(token)
        self.num_tokens += 1


def vllm_decode(
    kv: KVCacheManager, req: VllmRequest, output: Sequence[int], step: DecodeStep | None = None
) -> bool:
    """``allocate_slots(req, 1)`` for each output token after the first, the token
    appended once its step fits; ``False`` when a slot did not (the request stays)."""
    tokens = req.all_token_ids
    for token in list(output[1:]):  # list items: compiled code reads them unboxed
        if kv.allocate_slots(req, 1) is None:
            return False
        req.num_computed_tokens += 1
        tokens.append(token)
        req.num_tokens += 1
        if step is not None:
            step()
    return True


def sglang_decode(
    cache: PrefixCache, req: Any, output: Sequence[int], step: DecodeStep | None = None
) -> bool:
    """``alloc_for_decode`` for each output token not yet sampled (``req`` has SGLang
    ``Req`` fields), the token appended once its step fits; ``False`` when no page."""
    out_ids: list[int] = req.output_ids
    for token in list(output[len(out_ids) :]):
        if not alloc_for_decode(cache, req):
            return False
        out_ids.append(token)
        if step is not None and len(out_ids) < len(output):
            step()
    return True
