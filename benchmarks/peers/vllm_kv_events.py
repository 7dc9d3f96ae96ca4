"""Record vLLM 0.33's block hashes and KV-event stream (run in an environment with vLLM).

Two subcommands, both driving vLLM's own code (nothing here reimplements a hash or an
event; this file only plays the scheduler loop and the model runner):

* ``hashes OUT``: for a few requests (plain, with ``cache_salt``, with a LoRA, both)
  the block hashes of ``vllm.v1.request.Request`` built with vLLM's
  ``get_request_block_hasher``, for each ``prefix_caching_hash_algo``, with and
  without ``PYTHONHASHSEED``; plus their wire form (``maybe_convert_block_hash``).
* ``events TRACE SETTINGS OUT``: replays TRACE through ``KVCacheManager`` with
  ``enable_kv_cache_events=True`` in the K-live schedule (at most K live requests,
  the oldest finishes first by decoding its remaining output one token per step; the
  whole prompt is prefilled in one step, which samples the first output token), takes
  the events after every step as ``Scheduler.update_from_output`` does (and notes
  which hashes the prefix cache then holds, with their multiplicity), publishes each
  non-empty batch through vLLM's ``ZmqEventPublisher`` and records the frames its
  replay socket returns (``[topic, seq, msgpack]``), then ``reset_prefix_cache``
  (``AllBlocksCleared``). Batch timestamps come from a virtual clock (1 ms per step)
  so the recording is reproducible.

Normally called by ``record_kv_event_fixtures.py``; by hand::

    VLLM_PYTHON vllm_kv_events.py hashes hashes.json
    PYTHONHASHSEED=0 VLLM_PYTHON vllm_kv_events.py events trace.jsonl settings.json out.jsonl
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections import deque
from typing import Any

ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
HASH_REQUESTS: list[dict[str, Any]] = [
    # block size 4: two full blocks and a partial one; ids exercise every pickle int opcode
    {"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]},
    {"tokens": [0, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 7]},
    {"tokens": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "cache_salt": "tenant-a"},
    {"tokens": [1, 2, 3, 4, 5, 6, 7, 8], "lora": {"name": "sql", "id": 3, "path": "/l/sql"}},
    {
        "tokens": [11, 12, 13, 14, 15, 16, 17, 18, 19],
        "lora": {"name": "chat", "id": 1, "path": "/adapters/chat"},
        "cache_salt": "s",
    },
]


def make_request(vllm: Any, rid: str, rec: dict[str, Any], hasher: Any, step: int) -> Any:
    """A vLLM ``Request`` for one trace record (LoRA and cache salt included)."""
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    lora = rec.get("lora")
    return Request(
        request_id=rid,
        prompt_token_ids=list(rec["tokens"]),
        sampling_params=SamplingParams(
            max_tokens=max(1, len(rec.get("output", []))), ignore_eos=True
        ),
        pooling_params=None,
        arrival_time=float(step),
        lora_request=LoRARequest(lora["name"], lora["id"], lora["path"]) if lora else None,
        cache_salt=rec.get("cache_salt"),
        block_hasher=hasher,
    )


def record_hashes(out: str) -> None:
    import vllm
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as kcu

    block_size = 4
    cases = []
    for algo in ALGORITHMS:
        for seed in (None, "0", "1234"):
            if seed is None and algo.startswith("xxhash"):
                continue  # random per process: nothing to record
            if seed is None:
                os.environ.pop("PYTHONHASHSEED", None)
            else:
                os.environ["PYTHONHASHSEED"] = seed
            fn = get_hash_fn_by_name(algo)
            kcu.init_none_hash(fn)
            hasher = kcu.get_request_block_hasher(block_size, fn, 0)
            reqs = []
            for i, rec in enumerate(HASH_REQUESTS):
                req = make_request(vllm, f"r{i}", rec, hasher, i)
                reqs.append(
                    {
                        **rec,
                        "block_hashes": [h.hex() for h in req.block_hashes],
                        "external": [kcu.maybe_convert_block_hash(h) for h in req.block_hashes],
                    }
                )
            cases.append(
                {
                    "algorithm": algo,
                    "pythonhashseed": seed,
                    "none_hash_seed": kcu.get_none_hash_seed(),
                    "none_hash": kcu.NONE_HASH.hex(),
                    "requests": reqs,
                }
            )
    with open(out, "w") as f:  # one request a line, so diffs stay readable
        f.write(f'{{"vllm": "{vllm.__version__}", "block_size": {block_size}, "cases": [\n')
        for i, case in enumerate(cases):
            reqs = ",\n".join("  " + json.dumps(r) for r in case.pop("requests"))
            head = json.dumps(case)[:-1]
            f.write(f'{head}, "requests": [\n{reqs}\n]}}{"," if i + 1 < len(cases) else ""}\n')
        f.write("]}\n")


class Replayer:
    """One vLLM ``KVCacheManager`` with events on, stepped like the sync ``Scheduler``."""

    def __init__(self, settings: dict[str, Any], algo: str) -> None:
        import torch
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core import kv_cache_utils as kcu
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        bs = settings["block_size"]
        self.block_size = bs
        register_all_kvcache_specs(None)
        fn = get_hash_fn_by_name(algo)
        kcu.init_none_hash(fn)
        self.none_hash_seed = kcu.get_none_hash_seed()
        self.hasher = kcu.get_request_block_hasher(bs, fn, 0)
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
        config = KVCacheConfig(
            num_blocks=settings["vllm_num_blocks"],
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
        )
        max_len = settings["max_model_len"]
        self.manager = KVCacheManager(
            kv_cache_config=config,
            max_model_len=max_len,
            max_in_flight_tokens=max_len,
            enable_caching=True,
            use_eagle=False,
            num_hash_lookahead_tokens=0,
            num_prefill_lookahead=0,
            log_stats=False,
            enable_kv_cache_events=True,
            dcp_world_size=1,
            pcp_world_size=1,
            scheduler_block_size=bs,
            hash_block_size=bs,
            metrics_collector=None,
            watermark=0.0,
            enable_mamba_shared_prefix_checkpoint=False,
        )
        self.live: deque[tuple[Any, list[int]]] = deque()
        self.step = 0
        self.batches: list[Any] = []
        self.states: list[list[list[int]]] = []

    def end_step(self) -> None:
        """``Scheduler.update_from_output``: take the events, batch them if any."""
        from vllm.distributed.kv_events import KVEventBatch

        events = self.manager.take_events()
        if events:
            self.batches.append(KVEventBatch(ts=1_700_000_000.0 + self.step / 1000, events=events))
            self.states.append(self.cached())
        self.step += 1

    def cached(self) -> list[list[int]]:
        """What the prefix cache holds now: ``[wire hash, blocks holding it]``, sorted.

        vLLM keeps duplicates (two blocks with one hash when both were computed before
        either was cached), so a hash may count more than once.
        """
        from vllm.v1.core import kv_cache_utils as kcu

        table = self.manager.block_pool.cached_block_hash_to_block._cache
        out = []
        for key, blocks in table.items():
            n = len(blocks) if isinstance(blocks, dict) else 1
            out.append([kcu.maybe_convert_block_hash(kcu.get_block_hash(key)), n])
        return sorted(out)

    def admit(self, rec: dict[str, Any]) -> None:
        import vllm
        from vllm.v1.request import RequestStatus

        req = make_request(vllm, str(rec["id"]), rec, self.hasher, self.step)
        output = list(rec.get("output", []))
        self.manager.new_step_starts()
        blocks, num_hit, boundary = self.manager.get_computed_blocks(req, None)
        req.shared_prefix_boundary = boundary
        num_new = req.num_tokens - num_hit
        new = self.manager.allocate_slots(
            req,
            num_new,
            num_new_computed_tokens=num_hit,
            new_computed_blocks=blocks,
            num_lookahead_tokens=0,
            num_external_computed_tokens=0,
            delay_cache_blocks=False,
            num_encoder_tokens=0,
            full_sequence_must_fit=True,
            reserved_blocks=0,
            has_scheduled_reqs=bool(self.live),
        )
        if new is None:
            raise SystemExit(f"request {req.request_id}: pool too small for the prefill")
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = num_hit + num_new
        if output:
            req.append_output_token_ids(output[0])
        self.end_step()
        self.live.append((req, output))

    def finish_oldest(self) -> None:
        from vllm.v1.request import RequestStatus

        req, output = self.live.popleft()
        for i in range(1, len(output)):
            self.manager.new_step_starts()
            if self.manager.allocate_slots(req, 1, num_lookahead_tokens=0) is None:
                raise SystemExit(f"request {req.request_id}: pool too small at decode {i}")
            req.num_computed_tokens += 1
            req.append_output_token_ids(output[i])
            self.end_step()
        req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        self.manager.free(req)
        self.end_step()

    def run(self, trace: list[dict[str, Any]], k: int) -> None:
        for rec in trace:
            while len(self.live) >= k:
                self.finish_oldest()
            self.admit(rec)
        while self.live:
            self.finish_oldest()
        if not self.manager.reset_prefix_cache():
            raise SystemExit("reset_prefix_cache failed: blocks still in use")
        self.end_step()


def publish_and_replay(batches: list[Any], settings: dict[str, Any]) -> list[list[bytes]]:
    """Send the batches through vLLM's ``ZmqEventPublisher``; read them back by replay."""
    import zmq
    from vllm.distributed.kv_events import ZmqEventPublisher

    name = f"prefixkv-events-{os.getpid()}"
    pub = ZmqEventPublisher(
        data_parallel_rank=settings["data_parallel_rank"],
        endpoint=f"inproc://{name}-pub",
        replay_endpoint=f"inproc://{name}-replay",
        buffer_steps=len(batches) + 1,
        topic=settings["topic"],
    )
    for batch in batches:
        pub.publish(batch)
    ctx = zmq.Context.instance()
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(pub._replay_endpoint)
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
        import time

        time.sleep(0.05)  # the publisher thread is still draining its queue
    pub.shutdown()
    dealer.close(linger=0)
    if len(frames) != len(batches):
        raise SystemExit(f"replayed {len(frames)} of {len(batches)} batches")
    return frames


def record_events(trace_path: str, settings_path: str, algo: str, out: str) -> None:
    import msgspec
    import vllm

    with open(settings_path) as f:
        settings = json.load(f)
    with open(trace_path) as f:
        trace = [json.loads(line) for line in f if line.strip()]
    rp = Replayer(settings, algo)
    rp.run(trace, settings["concurrency"])
    frames = publish_and_replay(rp.batches, settings)
    with open(out, "w") as f:
        head = {
            "vllm": vllm.__version__,
            "hash": algo,
            "none_hash_seed": rp.none_hash_seed,
            "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
            "batches": len(frames),
        }
        f.write(json.dumps({"header": head}) + "\n")
        for (topic, seq, payload), batch, state in zip(frames, rp.batches, rp.states, strict=True):
            # The JSON form is vLLM's own struct through msgspec's JSON encoder (with the
            # rank the publisher stamped), the line a file sink must write.
            line = {
                "topic": topic.decode(),
                "seq": int.from_bytes(seq, "big"),
                "msgpack": base64.b64encode(payload).decode(),
                "json": msgspec.json.encode(batch).decode(),
                "cached": state,
            }
            f.write(json.dumps(line) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hashes")
    h.add_argument("out")
    e = sub.add_parser("events")
    e.add_argument("trace")
    e.add_argument("settings")
    e.add_argument("out")
    e.add_argument("--hash", default="sha256_cbor", choices=ALGORITHMS)
    args = ap.parse_args(argv)
    if args.cmd == "hashes":
        record_hashes(args.out)
    else:
        record_events(args.trace, args.settings, args.hash, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
