#!/usr/bin/env python3
"""Replay a trace through SGLang 0.5.23's own prefix cache: the fidelity oracle.

Every tree operation is SGLang's (``RadixCache``, or ``UnifiedRadixCache`` with its
Python or Rust core, or any ``BasePrefixCache`` a test passes in); this script plays
only the scheduler, through SGLang's own scheduler-side helpers on its real CPU pools:

* admission: ``Req.init_next_round_input`` (-> ``match_kv_cache`` -> ``match_prefix``,
  key capped at ``len - 1``, page-aligned by the tree), the prefill adder's pin and the
  request's own ``lock``, then ``alloc_for_extend``'s steps: ``prefix_device_indices``,
  a ``ReqToTokenPool`` row, ``alloc_token_slots`` / ``alloc_paged_token_slots_extend``
  (both evict through ``evict_for_alloc``), the row written;
* after the prefill: ``output_ids.append(first token)``, then
  ``checkpoint_kv_cache`` (``checkpoint``, 0.5.23's ``cache_unfinished_req``) or, if
  that token ends the request, ``release_kv_cache(checkpoint=True)``;
* each decode step: ``check_decode_capacity``, ``alloc_token_slots`` /
  ``alloc_paged_token_slots_decode`` for the fed token, the sampled token appended, and
  at the end ``release_kv_cache(checkpoint=True)`` (``cache_finished_req``).

Schedule: SPEC "Replay used to check fidelity" (at most K live; the oldest finishes
first). Trace and result formats are ``vllm_oracle.py``'s. Exit status 3 (no result
file): an allocation failed after evicting everything.

    PYTHON sglang_oracle.py TRACE.jsonl --capacity-tokens N --out HITS.jsonl
        [--page-size 1] [--concurrency K] [--cache radix|unified-python|unified-rust]
    PYTHON sglang_oracle.py --batch RUNS.txt   # one argument line per run, one import
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shlex
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torchvision_standin
from k_live import run_k_live

torchvision_standin.install()

CACHES = ("radix", "unified-python", "unified-rust")


class AllocationFailed(RuntimeError):
    """The pool cannot serve an allocation even after evicting everything."""


def load_trace(path: str) -> list[dict[str, Any]]:
    reqs = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                reqs.append(
                    {
                        "id": str(rec["id"]),
                        "tokens": list(rec["tokens"]),
                        "output": list(rec.get("output") or []),
                    }
                )
    return reqs


def build_pools(
    page_size: int,
    capacity_tokens: int,
    max_reqs: int,
    max_context: int,
    enable_kv_cache_events: bool = False,
) -> Any:
    """SGLang's CPU pools, as ``kv_cache_configurator`` builds them, and the cache params.

    The KV data pool is 1 layer x 1 head x 8 dims: trees and allocators handle slot
    indices only. Returns ``CacheInitParams`` (allocator, req-to-token pool, page size;
    with ``enable_kv_cache_events`` a tree built on them records KV events).
    """
    import torch
    from sglang.srt.mem_cache.allocator import (
        PagedTokenToKVPoolAllocator,
        TokenToKVPoolAllocator,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.runtime_context import get_memory
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    # A scheduler-role context with the defaults (fcfs, lru, no speculative decoding).
    set_global_server_args_for_scheduler(
        ServerArgs(model_path="dummy", page_size=page_size, device="cpu")
    )
    kv = MHATokenToKVPool(
        size=capacity_tokens,
        page_size=page_size,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    if page_size == 1:
        alloc: Any = TokenToKVPoolAllocator(
            capacity_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
        )
    else:
        alloc = PagedTokenToKVPoolAllocator(
            capacity_tokens,
            page_size=page_size,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=kv,
            need_sort=False,
        )
    rows = ReqToTokenPool(
        size=max_reqs, max_context_len=max_context, device="cpu", enable_memory_saver=False
    )
    memory = get_memory()
    return CacheInitParams(
        disable=False,
        req_to_token_pool=rows,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        eviction_policy=memory.radix_eviction_policy,
        eviction_policy_config=memory.radix_eviction_policy_config,
        enable_kv_cache_events=enable_kv_cache_events,
    )


def make_cache(kind: str, params: Any) -> Any:
    """SGLang's own trees by name."""
    if kind == "radix":
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(params)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params.tree_components = (ComponentType.FULL,)
    params.tree_core_backend = kind.removeprefix("unified-")
    return UnifiedRadixCache(params)


class Timed:
    """perf_counter sums around a cache's methods; nested calls count in the outer one."""

    LABELS = (
        "match_prefix",
        "checkpoint",
        "insert",
        "evict_for_alloc",
        "evict",
        "lock",
        "unlock",
        "inc_lock_ref",
        "dec_lock_ref",
        "free_kv_row",
        "prefix_device_indices",
    )

    def __init__(self, cache: Any) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()
        self.evicted_tokens = 0
        self._depth = 0
        for name in self.LABELS:
            if hasattr(cache, name):
                setattr(cache, name, self._wrap(cache, name, getattr(cache, name)))
        # Allocation failures print the whole tree first; keep stdout readable.
        cache.pretty_print = lambda *a, **k: None

    def _wrap(self, cache: Any, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            label = name
            if name == "checkpoint":
                label = "cache_finished_req" if args[0].finished() else "cache_unfinished_req"
            self._depth += 1
            t0 = time.perf_counter()
            try:
                result = method(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.seconds[label] += time.perf_counter() - t0
                    self.calls[label] += 1
            if name in ("evict", "evict_for_alloc") and self._depth == 0:
                self.evicted_tokens += getattr(result, "num_tokens_evicted", 0) or 0
            return result

        return call


class SGLangReplay:
    """The K-live schedule over one SGLang prefix cache and its pools.

    A record is ``{"id", "tokens", "output"}``, optionally with SGLang's namespaces
    ``extra_key`` and ``cache_salt``.

    Args:
        cache: a ``BasePrefixCache`` built on ``params`` (SGLang's or a plug-in).
        params: the ``CacheInitParams`` from ``build_pools``.
        after_step: called with the replay after every scheduler step (tests check
            conservation there).
    """

    def __init__(
        self, cache: Any, params: Any, after_step: Callable[[SGLangReplay], None] | None = None
    ) -> None:
        import torch
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.mem_cache import allocation, common
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.torch, self.Req, self.SamplingParams = torch, Req, SamplingParams
        self.allocation, self.common = allocation, common
        self.cache = cache
        self.allocator = params.token_to_kv_pool_allocator
        self.rows = params.req_to_token_pool
        self.page_size = params.page_size
        self.after_step = after_step
        self.live: collections.deque[tuple[Any, list[int]]] = collections.deque()
        self.prefilling: list[Any] = []  # started, not yet checkpointed
        self.hits: list[dict[str, Any]] = []

    def _ints(self, xs: list[int]) -> Any:
        return self.torch.tensor(xs, dtype=self.torch.int64)

    def _state(self) -> str:
        return (
            f"free {self.allocator.available_size()}, evictable "
            f"{self.cache.evictable_size()}, locked {self.cache.protected_size()} tokens"
        )

    def _stepped(self) -> None:
        if self.after_step is not None:
            self.after_step(self)

    def admit(self, rec: dict[str, Any]) -> None:
        """One prefill: match, lock, allocate the extend, first token, checkpoint."""
        self.end_prefill(*self.start_prefill(rec))

    def start_prefill(self, rec: dict[str, Any]) -> tuple[Any, list[int]]:
        """Match, lock and allocate (a batch admits several before any checkpoint)."""
        torch, cache = self.torch, self.cache
        sampled = list(rec.get("output") or [0])  # an empty output is one throw-away token
        params = self.SamplingParams(temperature=0, max_new_tokens=len(sampled), ignore_eos=True)
        params.normalize(None)
        req = self.Req(
            rid=str(rec["id"]),
            origin_input_text="",
            origin_input_ids=array("q", rec["tokens"]),
            sampling_params=params,
            extra_key=rec.get("extra_key"),
            cache_salt=rec.get("cache_salt"),
        )
        if cache.supports_fast_match_prefix():  # SchedulePolicy.calc_priority
            self.common.match_kv_cache(req, cache)
        req.init_next_round_input(cache)
        prefix = req.prefix_len
        self.hits.append({"id": rec["id"], "prompt_len": len(rec["tokens"]), "hit_tokens": prefix})
        pin = cache.lock(req.last_node)  # PrefillAdder.add_one_req
        req.extend_end = len(req.full_untruncated_fill_ids)
        req.lock = cache.lock(req.last_node)  # _commit_prefill_admission
        cache.unlock(pin)
        seq = req.extend_end
        indices = (
            cache.prefix_device_indices(req) if prefix else torch.empty((0,), dtype=torch.int64)
        )
        if self.rows.alloc([req]) is None:
            raise AllocationFailed(f"request {req.rid}: no req_to_token row left")
        try:
            if self.page_size == 1:
                slots = self.allocation.alloc_token_slots(cache, seq - prefix)
            else:
                last = indices[-1:] if prefix else torch.full((1,), -1, dtype=torch.int64)
                slots = self.allocation.alloc_paged_token_slots_extend(
                    tree_cache=cache,
                    prefix_lens=self._ints([prefix]),
                    prefix_lens_cpu=self._ints([prefix]),
                    seq_lens=self._ints([seq]),
                    seq_lens_cpu=self._ints([seq]),
                    last_loc=last,
                    extend_num_tokens=seq - prefix,
                )
        except RuntimeError as e:
            raise AllocationFailed(
                f"request {req.rid}: prefill of {seq - prefix} tokens ({self._state()})"
            ) from e
        row = req.kv.req_pool_idx
        self.rows.write((row, slice(0, prefix)), indices)
        self.rows.write((row, slice(prefix, seq)), slots)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = seq
        self.prefilling.append(req)
        return req, sampled

    def end_prefill(self, req: Any, sampled: list[int]) -> None:
        """The prefill's result: first token, then checkpoint (or release)."""
        self.prefilling.remove(req)
        self._sampled(req, sampled, prefill=True)
        if not req.finished():
            self.live.append((req, sampled))
        self._stepped()

    def _sampled(self, req: Any, sampled: list[int], prefill: bool) -> None:
        # process_batch_result_{prefill,decode}: append the token, then insert.
        self.allocator.free_group_begin()
        try:
            req.output_ids.append(sampled[len(req.output_ids)])
            req.update_finish_state()
            if req.finished():
                self.common.release_kv_cache(req, self.cache, checkpoint=True)
            elif prefill:
                self.common.checkpoint_kv_cache(req, self.cache)
        finally:
            self.allocator.free_group_end()

    def finish_oldest(self) -> None:
        """Decode the oldest live request one token a step until it finishes."""
        torch, ps = self.torch, self.page_size
        req, sampled = self.live[0]  # live until it finishes (a step check counts it)
        while not req.finished():
            seq = req.kv.kv_committed_len
            need = ps if seq % ps == 0 else 0  # ScheduleBatch.check_decode_mem
            if not self.allocator.check_decode_capacity(num_tokens=need, tree_cache=self.cache):
                raise AllocationFailed(f"request {req.rid}: decode at {seq} ({self._state()})")
            row = req.kv.req_pool_idx
            try:
                if ps == 1:
                    slot = self.allocation.alloc_token_slots(self.cache, 1)
                else:
                    last = self.rows.req_to_token[row, seq - 1].to(torch.int64).reshape(1)
                    slot = self.allocation.alloc_paged_token_slots_decode(
                        tree_cache=self.cache,
                        seq_lens=self._ints([seq + 1]),
                        seq_lens_cpu=self._ints([seq + 1]),
                        last_loc=last,
                    )
            except RuntimeError as e:
                raise AllocationFailed(f"request {req.rid}: decode at {seq}") from e
            self.rows.write((self._ints([row]), self._ints([seq])), slot.to(torch.int32))
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            self._sampled(req, sampled, prefill=False)
            if req.finished():
                self.live.popleft()
            self._stepped()

    def run(self, reqs: list[dict[str, Any]], k: int) -> None:
        run_k_live(self, reqs, k)


def run_one(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True)
    ap.add_argument("--capacity-tokens", type=int, required=True, help="KV pool size, tokens")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--concurrency", "-k", type=int, default=1, help="K live requests")
    ap.add_argument("--cache", choices=CACHES, default="radix")
    ap.add_argument(
        "--no-warmup",
        action="store_true",
        help="skip the untimed warm-up replay (first calls of torch ops are slow)",
    )
    args = ap.parse_args(argv)
    if args.concurrency < 1 or args.page_size < 1 or args.capacity_tokens < args.page_size:
        ap.error("need --concurrency >= 1, --page-size >= 1, a capacity of a page or more")
    reqs = load_trace(args.trace)
    context = max(len(r["tokens"]) + len(r["output"]) + 2 for r in reqs)
    if not args.no_warmup:
        # The first requests again on a throwaway tree of the same kind, untimed.
        head = reqs[:50]
        roomy = 2 * sum(len(r["tokens"]) + len(r["output"]) + args.page_size for r in head)
        warm = build_pools(args.page_size, roomy, args.concurrency + 1, context)
        SGLangReplay(make_cache(args.cache, warm), warm).run(head, args.concurrency)
    params = build_pools(args.page_size, args.capacity_tokens, args.concurrency + 1, context)
    cache = make_cache(args.cache, params)
    timed = Timed(cache)
    rp = SGLangReplay(cache, params)
    t0 = time.perf_counter()
    try:
        rp.run(reqs, args.concurrency)
    except AllocationFailed as e:
        print(f"sglang_oracle: allocation failed: {e}; raise --capacity-tokens", file=sys.stderr)
        if os.path.exists(args.out):
            os.remove(args.out)  # never leave a stale result next to a failure
        return 3
    wall = time.perf_counter() - t0
    import sglang
    import torch

    prompt = sum(h["prompt_len"] for h in rp.hits)
    hit = sum(h["hit_tokens"] for h in rp.hits)
    summary = {
        "cache": type(cache).__name__,
        "requests": len(rp.hits),
        "total_prompt_tokens": prompt,
        "total_hit_tokens": hit,
        "hit_ratio": hit / prompt if prompt else 0.0,
        "evicted_tokens": timed.evicted_tokens,
        "protected_tokens_at_end": cache.protected_size(),
        "seconds_by_call": dict(sorted(timed.seconds.items())),
        "calls_by_call": dict(sorted(timed.calls.items())),
        "replay_seconds": wall,
        "config": {
            "page_size": args.page_size,
            "capacity_tokens": args.capacity_tokens,
            "k": args.concurrency,
            "sglang": sglang.__version__,
            "torch": torch.__version__,
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        for h in rp.hits:
            f.write(json.dumps(h, separators=(",", ":")) + "\n")
        f.write(json.dumps({"summary": summary}, separators=(",", ":")) + "\n")
    os.replace(tmp, args.out)
    print(
        f"sglang_oracle: {os.path.basename(args.trace)} page {args.page_size} "
        f"K {args.concurrency} capacity {args.capacity_tokens}: hit {hit}/{prompt}"
    )
    return 0


def run_batch(path: str) -> int:
    """One run per line of ``path``, in this process (the ~10 s import is paid once)."""
    worst = 0
    with open(path) as f:
        lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
    for line in lines:
        worst = max(worst, run_one(shlex.split(line)))
    return worst


def main(argv: list[str] | None = None) -> int:
    import logging
    import warnings

    argv = sys.argv[1:] if argv is None else argv
    warnings.filterwarnings("ignore")
    logging.getLogger("sglang").setLevel(logging.CRITICAL)  # failures are reported here
    if argv[:1] == ["--batch"] and len(argv) == 2:
        return run_batch(argv[1])
    return run_one(argv)


if __name__ == "__main__":
    sys.exit(main())
