"""The K-live seats' decode loops when no hook runs between steps, compiled with the engine classes.

A K-live replay decodes every output token of every request in a step of its own: a
real trace's replay runs millions of them (Mooncake's conversation trace: 4.1 million).
When nothing is called between two steps (``prefixkv replay`` without KV events), a
seat (:mod:`.seats`) hands the whole loop to a function here. This module is compiled
in the compiled build (``[tool.prefixkv.mypyc]`` in ``pyproject.toml``), so each step
calls the engine class natively instead of through the interpreter; the steps and their
order are the seat's own, so the hits are the same on both builds.

Both loops stop at the first step that does not fit and say so (nothing of that step
changed, as the engine class promises); the seat times the loop as a whole.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

from prefixkv.adapters.sglang.prefix_cache import PrefixCache
from prefixkv.adapters.sglang.simulated import alloc_for_decode
from prefixkv.adapters.vllm.kv_cache_manager import KVCacheManager

__all__ = ["VllmRequest", "sglang_decode", "vllm_decode"]


class VllmRequest:
    """What vLLM's ``KVCacheManager`` reads of a request (vLLM ``Request`` fields).

    ``num_tokens`` is a plain attribute kept equal to ``len(all_token_ids)`` by
    :meth:`append`: the manager reads it every decode step. Defined here, beside the
    loop that steps it, so the compiled loop updates its fields natively.
    """

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


def vllm_decode(kv: KVCacheManager, req: VllmRequest, output: Sequence[int]) -> bool:
    """``allocate_slots(req, 1)`` for each output token after the first, the token
    appended once its step fits (vLLM's order: the slot, then the sampled token).

    Args:
        kv: the manager.
        req: the running request.
        output: the request's output tokens; the first was sampled at its prefill.

    Returns:
        ``False`` when a step's slot did not fit (the request stays running).
    """
    tokens = req.all_token_ids
    for token in list(output[1:]):  # list items: compiled code reads them unboxed
        if kv.allocate_slots(req, 1) is None:
            return False
        req.num_computed_tokens += 1
        tokens.append(token)
        req.num_tokens += 1
    return True


def sglang_decode(cache: PrefixCache, req: Any, output: Sequence[int]) -> bool:
    """``alloc_for_decode`` for each output token not yet sampled, the token appended
    once its step fits.

    Args:
        cache: the cache (simulated pools).
        req: a running request with SGLang ``Req`` fields (``output_ids`` a list).
        output: the request's output tokens.

    Returns:
        ``False`` when no page could be had for a step (the request stays running).
    """
    out_ids: list[int] = req.output_ids
    for token in list(output[len(out_ids) :]):
        if not alloc_for_decode(cache, req):
            return False
        out_ids.append(token)
    return True
