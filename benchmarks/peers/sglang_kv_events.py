"""Record SGLang 0.5.23's RadixCache KV-event stream (run in an environment with SGLang).

Replays a trace through SGLang's own ``RadixCache`` built with
``enable_kv_cache_events=True``, in the K-live schedule (at most K live requests; the
oldest finishes first by decoding its remaining output one token per step; the whole
prompt is prefilled in one step, which samples the first output token; a request
whose only output token is sampled at prefill finishes there). After every step it
takes the tree's events as the scheduler's ``publish_kv_events`` does (and notes the
page hashes the tree then holds), publishes each
non-empty ``KVEventBatch`` through SGLang's ``ZmqEventPublisher`` and records the
frames its replay socket returns, then ``reset()`` (``AllBlocksCleared``). The
scheduler-side calls (match, lock, slot allocation with eviction, ``checkpoint`` /
``release_kv_cache``) are SGLang's own helpers; batch timestamps come from a virtual
clock (1 ms per step) so the recording is reproducible.

    SGLANG_PYTHON sglang_kv_events.py trace.jsonl settings.json PAGE_SIZE out.jsonl
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from array import array
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import inert_imports

inert_imports.install()


class Replayer:
    """One SGLang ``RadixCache`` with events on, stepped like SGLang's scheduler."""

    def __init__(self, settings: dict[str, Any], page_size: int) -> None:
        import torch
        from sglang.srt.mem_cache import allocation, common
        from sglang.srt.mem_cache.allocator import (
            PagedTokenToKVPoolAllocator,
            TokenToKVPoolAllocator,
        )
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.runtime_context import get_memory
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(
            ServerArgs(model_path="dummy", page_size=page_size, device="cpu")
        )
        cap = settings["capacity_tokens"]
        kv = MHATokenToKVPool(
            size=cap,
            page_size=page_size,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=8,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        if page_size == 1:
            self.allocator = TokenToKVPoolAllocator(
                cap, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False
            )
        else:
            self.allocator = PagedTokenToKVPoolAllocator(
                cap,
                page_size=page_size,
                dtype=torch.bfloat16,
                device="cpu",
                kvcache=kv,
                need_sort=False,
            )
        self.rows = ReqToTokenPool(
            size=settings["concurrency"] + 1,
            max_context_len=settings["max_model_len"],
            device="cpu",
            enable_memory_saver=False,
        )
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=self.rows,
            token_to_kv_pool_allocator=self.allocator,
            page_size=page_size,
            eviction_policy=get_memory().radix_eviction_policy,
            eviction_policy_config=get_memory().radix_eviction_policy_config,
            enable_kv_cache_events=True,
        )
        self.cache = RadixCache(params)
        self.torch, self.allocation, self.common = torch, allocation, common
        self.page_size = page_size
        self.live: deque[tuple[Any, list[int]]] = deque()
        self.step = 0
        self.batches: list[Any] = []
        self.states: list[list[list[int]]] = []

    def end_step(self) -> None:
        """The scheduler loop's ``publish_kv_events``: take the tree's events, batch them."""
        from sglang.srt.disaggregation.kv_events import KVEventBatch

        events = self.cache.take_events()
        if events:
            self.batches.append(KVEventBatch(ts=1_700_000_000.0 + self.step / 1000, events=events))
            self.states.append(self.cached())
        self.step += 1

    def cached(self) -> list[list[int]]:
        """What the tree holds now: ``[event hash, pages with it]`` of every node, sorted.

        The hashes are the ones SGLang's recorder would publish on removing each node
        (computed by a second ``KVCacheEventRecorder``), so the events' consumer can be
        compared with the tree itself.
        """
        from sglang.srt.mem_cache.events import KVCacheEventRecorder

        probe = KVCacheEventRecorder(
            enabled=True, page_size=self.page_size, lora_names=self.cache.kv_events.lora_names
        )
        stack = list(self.cache.root_node.children.values())
        while stack:
            node = stack.pop()
            probe.record_remove(node)
            stack.extend(node.children.values())
        counts: dict[int, int] = {}
        for event in probe.take():
            for h in event.block_hashes:
                counts[h] = counts.get(h, 0) + 1
        return sorted([h, n] for h, n in counts.items())

    def _longs(self, xs: list[int]) -> Any:
        return self.torch.tensor(xs, dtype=self.torch.int64)

    def _sampled_one(self, req: Any, token: int) -> None:
        """``process_batch_result_*``: append the sampled token, cache or release."""
        self.allocator.free_group_begin()
        try:
            req.output_ids.append(token)
            req.update_finish_state()
            if req.finished():
                self.common.release_kv_cache(req, self.cache, checkpoint=True)
            elif len(req.output_ids) == 1:
                self.common.checkpoint_kv_cache(req, self.cache)
        finally:
            self.allocator.free_group_end()

    def admit(self, rec: dict[str, Any]) -> None:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        torch = self.torch
        sampled = list(rec.get("output") or [0])
        sp = SamplingParams(temperature=0, max_new_tokens=len(sampled), ignore_eos=True)
        sp.normalize(None)
        req = Req(
            rid=str(rec["id"]),
            origin_input_text="",
            origin_input_ids=array("q", rec["tokens"]),
            sampling_params=sp,
            extra_key=rec.get("extra_key"),
            cache_salt=rec.get("cache_salt"),
        )
        req.init_next_round_input(self.cache)  # match_prefix, capped at len - 1
        pin = self.cache.lock(req.last_node)  # PrefillAdder's pin, then the request's lock
        req.extend_end = len(req.full_untruncated_fill_ids)
        req.lock = self.cache.lock(req.last_node)
        self.cache.unlock(pin)
        seq_len, hit = req.extend_end, req.prefix_len
        prefix = (
            self.cache.prefix_device_indices(req) if hit else torch.empty((0,), dtype=torch.int64)
        )
        if self.rows.alloc([req]) is None:
            raise SystemExit(f"request {req.rid}: no request row free")
        if self.page_size == 1:
            loc = self.allocation.alloc_token_slots(self.cache, seq_len - hit)
        else:
            last = prefix[-1:] if hit else torch.full((1,), -1, dtype=torch.int64)
            loc = self.allocation.alloc_paged_token_slots_extend(
                tree_cache=self.cache,
                prefix_lens=self._longs([hit]),
                prefix_lens_cpu=self._longs([hit]),
                seq_lens=self._longs([seq_len]),
                seq_lens_cpu=self._longs([seq_len]),
                last_loc=last,
                extend_num_tokens=seq_len - hit,
            )
        row = req.kv.req_pool_idx
        self.rows.write((row, slice(0, hit)), prefix)
        self.rows.write((row, slice(hit, seq_len)), loc)
        req.kv.kv_allocated_len = req.kv.kv_committed_len = seq_len
        self._sampled_one(req, sampled[0])
        self.end_step()
        if not req.finished():
            self.live.append((req, sampled))

    def finish_oldest(self) -> None:
        torch = self.torch
        req, sampled = self.live.popleft()
        ps = self.page_size
        while not req.finished():
            n = req.kv.kv_committed_len
            need = ps if n % ps == 0 else 0
            if not self.allocator.check_decode_capacity(num_tokens=need, tree_cache=self.cache):
                raise SystemExit(f"request {req.rid}: decode does not fit at length {n}")
            row = req.kv.req_pool_idx
            if ps == 1:
                loc = self.allocation.alloc_token_slots(self.cache, 1)
            else:
                last = self.rows.req_to_token[row, n - 1].to(torch.int64).reshape(1)
                loc = self.allocation.alloc_paged_token_slots_decode(
                    tree_cache=self.cache,
                    seq_lens=self._longs([n + 1]),
                    seq_lens_cpu=self._longs([n + 1]),
                    last_loc=last,
                )
            self.rows.write((self._longs([row]), self._longs([n])), loc.to(torch.int32))
            req.kv.kv_allocated_len += 1
            req.kv.kv_committed_len += 1
            self._sampled_one(req, sampled[len(req.output_ids)])
            self.end_step()

    def run(self, trace: list[dict[str, Any]], k: int) -> None:
        for rec in trace:
            while len(self.live) >= k:
                self.finish_oldest()
            self.admit(rec)
        while self.live:
            self.finish_oldest()
        self.cache.reset()
        self.end_step()


def publish_and_replay(batches: list[Any], settings: dict[str, Any]) -> list[list[bytes]]:
    """Send the batches through SGLang's ``ZmqEventPublisher``; read them back by replay."""
    import zmq
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    name = f"prefixkv-events-{os.getpid()}"
    pub = ZmqEventPublisher(
        attn_dp_rank=settings["data_parallel_rank"],
        endpoint=f"inproc://{name}-pub",
        replay_endpoint=f"inproc://{name}-replay",
        buffer_steps=len(batches) + 1,
        topic=settings["topic"],
    )
    for batch in batches:
        pub.publish(batch)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.connect(f"inproc://{name}-replay")
    frames: list[list[bytes]] = []
    for _attempt in range(200):
        frames = []
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            if not dealer.poll(5000):
                raise SystemExit("no replay answer from the publisher")
            _, topic, seq, payload = dealer.recv_multipart()
            if seq == ZmqEventPublisher.END_SEQ:
                break
            frames.append([topic, seq, payload])
        if len(frames) == len(batches):
            break
        time.sleep(0.05)  # the publisher thread is still draining its queue
    pub.shutdown()
    dealer.close(linger=0)
    if len(frames) != len(batches):
        raise SystemExit(f"replayed {len(frames)} of {len(batches)} batches")
    return frames


def main(argv: list[str] | None = None) -> int:
    import msgspec
    import sglang

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("settings")
    ap.add_argument("page_size", type=int)
    ap.add_argument("out")
    args = ap.parse_args(argv)
    with open(args.settings) as f:
        settings = json.load(f)
    with open(args.trace) as f:
        trace = [json.loads(line) for line in f if line.strip()]
    rp = Replayer(settings, args.page_size)
    rp.run(trace, settings["concurrency"])
    frames = publish_and_replay(rp.batches, settings)
    with open(args.out, "w") as f:
        head = {"sglang": sglang.__version__, "page_size": args.page_size, "batches": len(frames)}
        f.write(json.dumps({"header": head}) + "\n")
        for (topic, seq, payload), batch, state in zip(frames, rp.batches, rp.states, strict=True):
            line = {
                "topic": topic.decode(),
                "seq": int.from_bytes(seq, "big"),
                "msgpack": base64.b64encode(payload).decode(),
                "json": msgspec.json.encode(batch).decode(),
                "cached": state,
            }
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
