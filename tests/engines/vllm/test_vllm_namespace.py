"""prefixkv's ``KVCacheManager`` and vLLM's, side by side on vLLM's own ``Request`` objects.

The recorded KV-event trace (LoRA adapters, cache salts, eviction) goes through vLLM's
``KVCacheManager`` and through prefixkv's with vLLM's engine types, in the order vLLM's
scheduler calls them (``vllm_oracle.ManagerReplay``). Every step's events -- block
hashes from the one namespace rule, LoRA name and id, extra keys -- hits and KV usage
must be equal. Runs in ``make test-engines``, and from ``make test`` when
``PREFIXKV_VLLM_PYTHON`` names a python with vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import vllm_oracle

from prefixkv.adapters.vllm.kv_cache_manager import KVCacheManager
from prefixkv.adapters.vllm.scheduler import vllm_types
from prefixkv.indexes import make_index

ROOT = Path(__file__).resolve().parents[3]

DATA = ROOT / "tests" / "data" / "events"
SETTINGS: dict[str, Any] = json.loads((DATA / "settings.json").read_text())
TRACE = [json.loads(line) for line in (DATA / "trace.jsonl").read_text().splitlines()]


def replay(algo: str, ours: bool) -> tuple[list[bytes], list[dict[str, Any]], list[float]]:
    rp = vllm_oracle.ManagerReplay(
        SETTINGS["block_size"],
        SETTINGS["vllm_num_blocks"],
        algo,
        SETTINGS["max_model_len"],
        enable_kv_cache_events=True,
    )
    if ours:
        from vllm.v1.core import kv_cache_utils as kcu

        index = make_index(
            "hash_chain",
            block_size=SETTINGS["block_size"],
            hash_algorithm=algo,
            seed=kcu.get_none_hash_seed(),  # the seed vLLM's NONE_HASH was made from
        )
        rp.kv = KVCacheManager(
            index,
            SETTINGS["vllm_num_blocks"],
            max_model_len=SETTINGS["max_model_len"],
            log_stats=True,
            enable_kv_cache_events=True,
            engine_types=vllm_types(),
        )
    steps: list[bytes] = []
    usage: list[float] = []

    def end_step() -> None:
        steps.append(msgspec.msgpack.encode(rp.kv.take_events()))
        usage.append(rp.kv.usage)

    rp.end_step = end_step
    rp.run(TRACE, SETTINGS["concurrency"])
    return steps, rp.hits, usage


@pytest.mark.parametrize("algo", ["sha256_cbor", "sha256"])
def test_lora_and_salted_requests_publish_vllms_events(
    algo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", SETTINGS["pythonhashseed"])
    assert any("lora" in r for r in TRACE) and any(r.get("cache_salt") for r in TRACE)
    native_steps, native_hits, native_usage = replay(algo, ours=False)
    our_steps, our_hits, our_usage = replay(algo, ours=True)
    assert our_hits == native_hits
    assert our_usage == pytest.approx(native_usage)
    assert sum(len(s) > 1 for s in native_steps) > 10
    assert len(our_steps) == len(native_steps)
    diff = [i for i, (a, b) in enumerate(zip(our_steps, native_steps, strict=True)) if a != b]
    assert not diff, f"steps differ: {diff[:5]}"
