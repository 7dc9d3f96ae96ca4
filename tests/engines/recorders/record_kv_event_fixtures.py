"""Record the KV-event golden fixtures in tests/data/events/ from the real engines.

Writes a small trace (shared prefixes, exact repeats, cache salts, LoRA requests) and
its replay settings, then runs, each in its own side environment:

* ``vllm_kv_events.py hashes`` -> ``vllm_block_hashes.json`` (block hashes of a few
  requests for every vLLM hash algorithm, with and without ``PYTHONHASHSEED``);
* ``vllm_kv_events.py events`` with ``sha256_cbor`` and ``sha256`` under
  ``PYTHONHASHSEED=0`` -> ``vllm_<hash>.jsonl`` (vLLM's ``KVCacheManager`` events
  through its ``ZmqEventPublisher``);
* ``sglang_kv_events.py`` with page sizes 1 and 4 -> ``sglang_page<P>.jsonl`` (SGLang's
  ``RadixCache`` events through its ``ZmqEventPublisher``).

Each events file starts with a header line; every further line is one published
batch: ``topic``, ``seq``, the msgpack payload (base64), the batch as msgspec's JSON
encoder writes the engine's own struct, and ``cached``: the ``[hash, count]`` pairs the
engine's cache held right after that batch. Standard library only::

    python tests/engines/recorders/record_kv_event_fixtures.py \\
        --vllm-python VLLM_VENV/bin/python --sglang-python SGLANG_VENV/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parents[1] / "data" / "events"

SETTINGS: dict[str, Any] = {
    "schedule": "K-live: at most `concurrency` requests live, the oldest finishes first "
    "(decodes its remaining output one token per step); the whole prompt is prefilled in "
    "one step, which samples output[0]; after the trace the rest finish oldest first, "
    "then the prefix cache is reset. One batch per step that produced events.",
    "steps": "vLLM: a prefill, each decode token, and the free of a finished request are "
    "steps (a request is live until it finishes, even with one output token). SGLang: a "
    "request whose only output token is sampled at prefill finishes in that step and is "
    "never live; an empty output is one throw-away token.",
    "vllm_num_blocks_note": "KVCacheConfig.num_blocks; block 0 is vLLM's null block",
    "concurrency": 2,
    "block_size": 4,
    "vllm_num_blocks": 24,
    "capacity_tokens": 88,
    "capacity_tokens_note": "SGLang's KV pool size in tokens",
    "max_model_len": 64,
    "topic": "kv@prefixkv-test",
    "data_parallel_rank": 0,
    "pythonhashseed": "0",
    "vllm_hashes": ["sha256_cbor", "sha256"],
    "sglang_page_sizes": [1, 4],
    "ts": "virtual clock: 1700000000.0 + step / 1000",
    "trace_fields": "id, tokens, output; vLLM reads lora {name, id, path} and cache_salt; "
    "SGLang reads extra_key and cache_salt",
}


def make_trace(seed: int = 14, num_requests: int = 30) -> list[dict[str, Any]]:
    """Requests over three shared system prompts; some repeat an earlier one exactly."""
    rng = random.Random(seed)
    systems = [[rng.randrange(1, 50) for _ in range(n)] for n in (9, 12, 6)]
    lora = {"name": "sql", "id": 1, "path": "/adapters/sql"}
    trace: list[dict[str, Any]] = []
    for i in range(num_requests):
        if trace and rng.random() < 0.2:
            rec = dict(rng.choice(trace))  # same prompt, namespace and output: duplicates
        else:
            prompt = rng.choice(systems) + [rng.randrange(1, 50) for _ in range(rng.randint(1, 7))]
            rec = {
                "tokens": prompt,
                "output": [rng.randrange(1, 50) for _ in range(rng.randint(0, 6))],
            }
            kind = rng.random()
            if kind < 0.15:
                rec["cache_salt"] = rng.choice(["tenant-a", "tenant-b"])
            elif kind < 0.3:
                rec["lora"] = lora
                rec["extra_key"] = "lora-sql"
        rec["id"] = f"r{i}"
        trace.append({"id": rec["id"], **{k: v for k, v in rec.items() if k != "id"}})
    return trace


def run(cmd: list[str], env: dict[str, str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", required=True, help="python of an environment with vLLM")
    ap.add_argument("--sglang-python", help="python of an environment with SGLang (optional)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    trace_path, settings_path = out / "trace.jsonl", out / "settings.json"
    with open(trace_path, "w") as f:
        for rec in make_trace():
            f.write(json.dumps(rec, separators=(",", ":")) + "\n")
    settings_path.write_text(json.dumps(SETTINGS, indent=1) + "\n")

    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    seeded = {**env, "PYTHONHASHSEED": SETTINGS["pythonhashseed"]}
    vllm = [args.vllm_python, str(HERE / "vllm_kv_events.py")]
    run([*vllm, "hashes", str(out / "vllm_block_hashes.json")], env)
    for algo in SETTINGS["vllm_hashes"]:
        dest = out / f"vllm_{algo}.jsonl"
        run(
            [*vllm, "events", str(trace_path), str(settings_path), str(dest), "--hash", algo],
            seeded,
        )
    if args.sglang_python:
        for ps in SETTINGS["sglang_page_sizes"]:
            dest = out / f"sglang_page{ps}.jsonl"
            run(
                [
                    args.sglang_python,
                    str(HERE / "sglang_kv_events.py"),
                    str(trace_path),
                    str(settings_path),
                    str(ps),
                    str(dest),
                ],
                seeded,
            )


if __name__ == "__main__":
    main()
