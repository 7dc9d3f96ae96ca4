"""Record vLLM 0.33's block hashes and KV-event stream (run in an environment with vLLM).

Two subcommands, both driving vLLM's own code (nothing here reimplements a hash or an
event; this file only plays the scheduler loop and the model runner):

* ``hashes OUT``: for a few requests (plain, with ``cache_salt``, with a LoRA, both)
  the block hashes of ``vllm.v1.request.Request`` built with vLLM's
  ``get_request_block_hasher``, for each ``prefix_caching_hash_algo``, with and
  without ``PYTHONHASHSEED``; plus their wire form (``maybe_convert_block_hash``).
* ``events TRACE SETTINGS OUT``: replays TRACE through ``KVCacheManager`` with
  ``enable_kv_cache_events=True`` (stepped by the fidelity oracle's
  ``vllm_oracle.ManagerReplay``) in the K-live schedule (at most K live requests,
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
import json
import os
import sys
from typing import Any

from event_recording import StepBatches, publish_and_replay, read_inputs, write_recording
from vllm_oracle import ManagerReplay, RequestMaker

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
            hasher = kcu.get_request_block_hasher(block_size, fn)
            make_request = RequestMaker(hasher)
            reqs = []
            for i, rec in enumerate(HASH_REQUESTS):
                req = make_request({**rec, "id": f"r{i}"}, float(i))
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
    """The oracle's ``ManagerReplay`` with events on, each step's events batched."""

    def __init__(self, settings: dict[str, Any], algo: str) -> None:
        from vllm.distributed.kv_events import KVEventBatch
        from vllm.v1.core import kv_cache_utils as kcu

        self.replay = ManagerReplay(
            settings["block_size"],
            settings["vllm_num_blocks"],
            algo,
            settings["max_model_len"],
            log_stats=False,
            enable_kv_cache_events=True,
        )
        self.manager = self.replay.kv
        self.none_hash_seed = kcu.get_none_hash_seed()
        # Scheduler.update_from_output: take the events, batch them if any.
        self.steps = StepBatches(self.manager.take_events, KVEventBatch, self.cached)
        self.replay.end_step = self.steps.end_step

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

    def run(self, trace: list[dict[str, Any]], k: int) -> None:
        self.replay.run(trace, k)
        if not self.manager.reset_prefix_cache():
            raise SystemExit("reset_prefix_cache failed: blocks still in use")
        self.steps.end_step()


def record_events(trace_path: str, settings_path: str, algo: str, out: str) -> None:
    import vllm
    from vllm.distributed.kv_events import ZmqEventPublisher

    trace, settings = read_inputs(trace_path, settings_path)
    rp = Replayer(settings, algo)
    rp.run(trace, settings["concurrency"])
    frames = publish_and_replay(ZmqEventPublisher, "data_parallel_rank", rp.steps.batches, settings)
    head = {
        "vllm": vllm.__version__,
        "hash": algo,
        "none_hash_seed": rp.none_hash_seed,
        "pythonhashseed": os.environ.get("PYTHONHASHSEED"),
        "batches": len(frames),
    }
    write_recording(out, head, frames, rp.steps)


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
