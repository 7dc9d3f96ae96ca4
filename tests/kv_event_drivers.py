"""K-live drivers of the two engine classes, stepping like the engines' schedulers.

The schedule of the recorded KV-event fixtures (``tests/data/events/settings.json``;
``run_k_live`` is the recorders' own, ``tests/engines/recorders/k_live.py``):
at most K requests live, the oldest finishes first by decoding its remaining output
one token per step; the whole prompt is prefilled in one step, which samples the first
output token. ``end_step`` is called where the engine takes its events. vLLM: a
prefill, each decode token and the free of a finished request are steps. SGLang: a
request whose only output token is sampled at prefill finishes in that step; the
step that samples the last token releases the request.

Requests are the fixture trace's records: ``id``, ``tokens``, ``output``, and
optionally ``cache_salt``, ``lora`` ``{name, id, path}`` (vLLM) and ``extra_key``
(SGLang). A request that does not fit is not admitted (``admit`` returns False); one
whose decode does not fit is aborted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

# The recorders' own loop, so the engine classes run the very schedule the fixtures were made in.
from k_live import run_k_live as run_k_live

from prefixkv.adapters.events import KVEventBatch
from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend, retract
from prefixkv.adapters.vllm import KVCacheManager

Record = dict[str, Any]
F = TypeVar("F")
R = TypeVar("R")


class EngineClassEvents:
    """An engine class's events, taken as vLLM's engine core takes them once per step
    (the engine class must be built with ``enable_kv_cache_events=True``)."""

    def __init__(self, cache: KVCacheManager | PrefixCache) -> None:
        self.cache = cache

    def take_events(self) -> list[Any]:
        return self.cache.take_events()

    def take_batch(self, ts: float, data_parallel_rank: int | None = None) -> KVEventBatch | None:
        events = self.take_events()
        return KVEventBatch(ts, events, data_parallel_rank) if events else None


def attach_recorder(cache: KVCacheManager | PrefixCache) -> EngineClassEvents:
    """The engine class's own event stream (``enable_kv_cache_events`` + ``take_events``)."""
    return EngineClassEvents(cache)


class LoRARequest:
    """vLLM's ``LoRARequest`` fields."""

    def __init__(self, name: str, int_id: int, path: str) -> None:
        self.lora_name, self.lora_int_id, self.lora_path = name, int_id, path


class VllmRequest:
    """vLLM ``Request`` fields the engine class reads."""

    def __init__(self, rec: Record) -> None:
        self.request_id = str(rec["id"])
        self.all_token_ids: list[int] = list(rec["tokens"])
        self.num_computed_tokens = 0
        self.cache_salt: str | None = rec.get("cache_salt")
        lora = rec.get("lora")
        self.lora_request = None if lora is None else LoRARequest(**_lora(lora))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)


def _lora(lora: dict[str, Any]) -> dict[str, Any]:
    return {"name": lora["name"], "int_id": lora["id"], "path": lora["path"]}


class _Driver(Generic[F, R]):
    """An engine class, where the engine takes its events (``end_step``) and the live requests
    with their outputs, oldest first."""

    def __init__(self, cache: F, end_step: Callable[[], None]) -> None:
        self.cache = cache
        self.end_step = end_step
        self.live: deque[tuple[R, list[int]]] = deque()


class VllmDriver(_Driver[KVCacheManager, VllmRequest]):
    """vLLM's scheduler order through :class:`KVCacheManager`."""

    def admit(self, rec: Record) -> bool:
        f, req = self.cache, VllmRequest(rec)
        output = list(rec.get("output", []))
        blocks, hit, _ = f.get_computed_blocks(req)
        n = req.num_tokens
        if f.allocate_slots(req, n - hit, hit, blocks) is None:
            f.free(req)
            self.end_step()
            return False
        req.num_computed_tokens = n
        if output:
            req.all_token_ids.append(output[0])
        self.end_step()
        self.live.append((req, output))
        return True

    def finish_oldest(self) -> None:
        req, output = self.live.popleft()
        for i in range(1, len(output)):
            if self.cache.allocate_slots(req, 1) is None:
                break  # preempted for good: aborted
            req.num_computed_tokens += 1
            req.all_token_ids.append(output[i])
            self.end_step()
        self.cache.free(req)
        self.end_step()

    def reset(self) -> bool:
        ok = self.cache.reset_prefix_cache()
        self.end_step()
        return ok


class SGLangDriver(_Driver[PrefixCache, SimpleReq]):
    """SGLang's scheduler order through :class:`PrefixCache` and SGLang's scheduler-side
    steps (``prefixkv.adapters.sglang.simulated``)."""

    def admit(self, rec: Record) -> bool:
        f = self.cache
        req = SimpleReq(
            str(rec["id"]),
            rec["tokens"],
            extra_key=rec.get("extra_key"),
            cache_salt=rec.get("cache_salt"),
        )
        sampled = list(rec.get("output") or [0])  # SGLang always samples one token
        if alloc_for_extend(f, req) is None:
            self.end_step()
            return False
        req.output_ids.append(sampled[0])
        if len(sampled) == 1:
            f.cache_finished_req(req)
        else:
            f.cache_unfinished_req(req)
            self.live.append((req, sampled))
        self.end_step()
        return True

    def finish_oldest(self) -> None:
        f = self.cache
        req, sampled = self.live.popleft()
        while len(req.output_ids) < len(sampled):
            if not alloc_for_decode(f, req):
                retract(f, req)  # for good
                self.end_step()
                return
            req.output_ids.append(sampled[len(req.output_ids)])
            if len(req.output_ids) == len(sampled):
                f.cache_finished_req(req)
            self.end_step()

    def reset(self) -> bool:
        if self.live:
            return False
        self.cache.reset()
        self.end_step()
        return True


Driver = VllmDriver | SGLangDriver
