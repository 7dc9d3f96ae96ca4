"""Trace replay with the K-live schedule used to check hit-for-hit fidelity.

Requests are admitted in order and at most K are live; when a request arrives while
K are live, the oldest live one decodes its remaining output one token per step and
finishes. The whole prompt is prefilled in one step and its first output token is
sampled there (SPEC, "Replay used to check fidelity"). A backend is driven through
the vLLM-shaped facade (as vLLM's scheduler drives ``KVCacheManager``), the
SGLang-shaped one (as SGLang's scheduler drives ``RadixCache``), or the manager.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.storage.allocator import BlockAllocator

from ..accounting import RequestRecord
from ..manager import CacheManager
from ..sglang import SGLangRadixCache, SimpleReq
from ..vllm import SimpleRequest, VLLMKVCacheManager

__all__ = ["DRIVERS", "ReplayError", "ReplayRequest", "ReplayResult", "replay"]

Driver = Literal["vllm", "sglang", "manager"]
DRIVERS: tuple[Driver, ...] = ("vllm", "sglang", "manager")


class ReplayRequest(Protocol):
    """One trace line: an id, the prompt, and the tokens decoded after it."""

    @property
    def id(self) -> str:
        """Unique request id."""
        ...

    @property
    def tokens(self) -> Sequence[int]:
        """Prompt token ids."""
        ...

    @property
    def output(self) -> Sequence[int]:
        """Output token ids."""
        ...


class ReplayError(PrefixKVError):
    """A request could not be allocated even after evicting everything evictable."""


@dataclass
class ReplayResult:
    """What a replay produced.

    Attributes:
        hits: one ``{"id", "prompt_len", "hit_tokens"}`` per request, admission order.
        records: the manager's per-request accounting (BB-8 fields when tracked).
        request_seconds: index time per request (all its calls), admission order.
        admit_seconds: the part of ``request_seconds`` spent admitting the request
            (lookup, prefill allocation, registering the prompt), admission order.
        seconds_by_call: summed seconds per call kind.
        evicted_blocks: blocks evicted from the index.
        peak_cached_blocks: the most blocks the index held at once.
        index_memory_bytes: the index structures' size at the peak.
        wall_seconds: the replay's wall time.
    """

    hits: list[dict[str, Any]]
    records: list[RequestRecord]
    request_seconds: list[float]
    seconds_by_call: dict[str, float] = field(default_factory=dict)
    evicted_blocks: int = 0
    peak_cached_blocks: int = 0
    index_memory_bytes: int = 0
    wall_seconds: float = 0.0
    admit_seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """Totals for a result file's last line."""
        prompt = sum(h["prompt_len"] for h in self.hits)
        hit = sum(h["hit_tokens"] for h in self.hits)
        return {
            "requests": len(self.hits),
            "total_prompt_tokens": prompt,
            "total_hit_tokens": hit,
            "hit_ratio": hit / prompt if prompt else 0.0,
            "evicted_blocks": self.evicted_blocks,
            "peak_cached_blocks": self.peak_cached_blocks,
            "seconds_by_call": dict(self.seconds_by_call),
            "seconds_total_in_index": sum(self.seconds_by_call.values()),
            "wall_seconds": self.wall_seconds,
        }


class _Clock:
    """Sums perf_counter time per call kind and per request."""

    def __init__(self, num_requests: int) -> None:
        self.by_call: dict[str, float] = {}
        self.by_request = [0.0] * num_requests

    def run(self, kind: str, request: int, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args)
        self.add(kind, request, time.perf_counter() - t0)
        return out

    def add(self, kind: str, request: int, seconds: float) -> None:
        """Book time measured inline (the decode loops time each call in place, as
        the reference oracles do, so the clock itself costs no extra call)."""
        self.by_call[kind] = self.by_call.get(kind, 0.0) + seconds
        self.by_request[request] += seconds


class _Replayer(ABC):
    """Shared K-live state; subclasses play one scheduler."""

    def __init__(self, manager: CacheManager, num_requests: int) -> None:
        self.manager = manager
        self.clock = _Clock(num_requests)
        self.live: deque[tuple[int, Any, Sequence[int]]] = deque()
        self.hits: list[dict[str, Any]] = []
        self.peak_cached = 0
        self.peak_memory = 0

    def note_size(self) -> None:
        cached = self.manager.index.stats().num_cached_blocks
        if cached > self.peak_cached:
            self.peak_cached = cached
            measure = getattr(self.manager.index, "memory_bytes", None)
            if measure is not None and cached % 64 == 0:
                self.peak_memory = max(self.peak_memory, int(measure()))

    def fail(self, what: str) -> ReplayError:
        m = self.manager
        return ReplayError(
            f"{what} does not fit even after evicting everything evictable: "
            f"{m.allocator.num_free_blocks} free of {m.allocator.num_blocks} blocks, "
            f"{len(m.running())} requests running; raise the capacity or lower the concurrency"
        )

    @abstractmethod
    def admit(self, i: int, rec: ReplayRequest) -> None:
        """Admit and prefill request ``i``; it samples its first output token."""

    @abstractmethod
    def finish_oldest(self) -> None:
        """Decode the oldest live request to its end and release it."""


class _VLLMReplayer(_Replayer):
    def __init__(self, facade: VLLMKVCacheManager, num_requests: int) -> None:
        super().__init__(facade.manager, num_requests)
        self.facade = facade

    def admit(self, i: int, rec: ReplayRequest) -> None:
        f, clock = self.facade, self.clock
        req = SimpleRequest(str(rec.id), list(rec.tokens))
        blocks, hit = clock.run("lookup", i, f.get_computed_blocks, req)
        n = req.num_tokens
        new = clock.run("allocate_prefill", i, f.allocate_slots, req, n - hit, hit, blocks)
        if new is None:
            raise self.fail(f"prefill of request {rec.id!r} ({n} tokens, hit {hit})")
        req.num_computed_tokens = n
        self.hits.append({"id": str(rec.id), "prompt_len": n, "hit_tokens": hit})
        if rec.output:
            req.append_output_token_ids(rec.output[0])
        self.live.append((i, req, rec.output))
        self.note_size()

    def finish_oldest(self) -> None:
        i, req, output = self.live.popleft()
        f, clock = self.facade, self.clock
        perf, spent = time.perf_counter, 0.0
        for tok in output[1:]:
            t0 = perf()
            new = f.allocate_slots(req, 1)
            spent += perf() - t0
            if new is None:
                raise self.fail(f"decode step of request {req.request_id!r}")
            req.num_computed_tokens += 1
            req.append_output_token_ids(tok)
        clock.add("allocate_decode", i, spent)
        self.note_size()
        clock.run("free", i, f.free, req)


class _SGLangReplayer(_Replayer):
    # A request whose only output token is sampled at prefill finishes in that
    # step and is never live (SGLang); vLLM counts every admitted request as live.

    def __init__(self, facade: SGLangRadixCache, num_requests: int) -> None:
        super().__init__(facade.manager, num_requests)
        self.facade = facade

    def admit(self, i: int, rec: ReplayRequest) -> None:
        f, clock = self.facade, self.clock
        req = SimpleReq(str(rec.id), rec.tokens)
        sampled = list(rec.output) or [0]  # SGLang always samples one token at prefill
        hit = clock.run("alloc_for_extend", i, f.alloc_for_extend, req)
        if hit is None:
            raise self.fail(f"prefill of request {rec.id!r} ({len(rec.tokens)} tokens)")
        self.hits.append({"id": str(rec.id), "prompt_len": len(rec.tokens), "hit_tokens": hit})
        req.output_ids.append(sampled[0])
        if len(sampled) == 1:
            clock.run("cache_finished_req", i, f.cache_finished_req, req)
        else:
            clock.run("cache_unfinished_req", i, f.cache_unfinished_req, req)
            self.live.append((i, req, sampled))
        self.note_size()

    def finish_oldest(self) -> None:
        i, req, sampled = self.live.popleft()
        f, clock = self.facade, self.clock
        perf, spent = time.perf_counter, 0.0
        while len(req.output_ids) < len(sampled):
            t0 = perf()
            ok = f.alloc_for_decode(req)
            spent += perf() - t0
            if not ok:
                raise self.fail(f"decode step of request {req.rid!r}")
            req.output_ids.append(sampled[len(req.output_ids)])
        clock.add("alloc_for_decode", i, spent)
        self.note_size()
        clock.run("cache_finished_req", i, f.cache_finished_req, req)


class _ManagerReplayer(_Replayer):
    def admit(self, i: int, rec: ReplayRequest) -> None:
        m, clock = self.manager, self.clock
        rid = str(rec.id)
        adm = clock.run("admit", i, m.admit, rid, rec.tokens)
        if adm is None:
            raise self.fail(f"prefill of request {rid!r} ({len(rec.tokens)} tokens)")
        n = len(rec.tokens)
        clock.run("commit", i, m.commit, rid, n)
        self.hits.append({"id": rid, "prompt_len": n, "hit_tokens": adm.num_cached_tokens})
        self.live.append((i, rid, rec.output))
        self.note_size()

    def finish_oldest(self) -> None:
        i, rid, output = self.live.popleft()
        m, clock = self.manager, self.clock
        for tok in output[:-1]:  # the last sampled token never gets KV
            if not clock.run("append", i, m.append, rid, [tok]):
                raise self.fail(f"decode step of request {rid!r}")
            n = len(m.key(rid))
            clock.run("commit", i, m.commit, rid, n)
        self.note_size()
        clock.run("finish", i, m.finish, rid)


def replay(
    requests: Iterable[ReplayRequest],
    index: PrefixIndex,
    num_blocks: int,
    *,
    driver: Driver = "manager",
    concurrency: int = 1,
    track_boundaries: bool = False,
    on_request: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay ``requests`` through ``index`` with at most ``concurrency`` live.

    Args:
        requests: trace requests (``id``, ``tokens``, ``output``).
        index: the backend (fresh; the replay fills it).
        num_blocks: pool size in blocks of ``index.block_size`` tokens.
        driver: ``"vllm"`` (vLLM scheduler order), ``"sglang"`` (SGLang scheduler
            order) or ``"manager"`` (the generic lifecycle).
        concurrency: K, the most live requests.
        track_boundaries: fill the BB-8 fields of the records.
        on_request: called with the count of requests admitted so far (progress).

    Raises:
        ReplayError: an allocation failed even after evicting everything.
        PrefixKVError: bad arguments.
    """
    reqs = list(requests)
    if type(concurrency) is not int or concurrency < 1:
        raise PrefixKVError(f"concurrency must be a positive int, got {concurrency!r}")
    rp: _Replayer
    if driver == "vllm":
        facade = VLLMKVCacheManager(
            index, num_blocks, track_boundaries=track_boundaries, keep_records=True
        )
        rp = _VLLMReplayer(facade, len(reqs))
    elif driver == "sglang":
        sg = SGLangRadixCache(
            index,
            num_blocks * index.block_size,
            track_boundaries=track_boundaries,
            keep_records=True,
        )
        rp = _SGLangReplayer(sg, len(reqs))
    elif driver == "manager":
        mgr = CacheManager(
            index, BlockAllocator(num_blocks), track_boundaries=track_boundaries, keep_records=True
        )
        rp = _ManagerReplayer(mgr, len(reqs))
    else:
        raise PrefixKVError(f"unknown replay driver {driver!r}; known: {', '.join(DRIVERS)}")
    admit_seconds: list[float] = []
    t0 = time.perf_counter()
    for i, rec in enumerate(reqs):
        while len(rp.live) >= concurrency:
            rp.finish_oldest()
        rp.admit(i, rec)
        admit_seconds.append(rp.clock.by_request[i])  # nothing else has run for request i
        if on_request is not None:
            on_request(i + 1)
    while rp.live:
        rp.finish_oldest()
    wall = time.perf_counter() - t0
    return ReplayResult(
        hits=rp.hits,
        records=list(rp.manager.records),
        request_seconds=rp.clock.by_request,
        seconds_by_call=rp.clock.by_call,
        evicted_blocks=rp.manager.totals.num_evicted_blocks,
        peak_cached_blocks=rp.peak_cached,
        index_memory_bytes=rp.peak_memory,
        wall_seconds=wall,
        admit_seconds=admit_seconds,
    )
