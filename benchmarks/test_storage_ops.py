"""The paged KV tensor: write through a slot mapping, gather through block tables.

16-token blocks, a Llama-8B-like layer (8 KV heads x 128 dims), bf16 on CUDA and
fp32 on CPU. Reports bytes moved per second in ``extra_info``; on a GPU compare it
with the device's memory bandwidth (benchmarks/README.md, "Storage": the GPU figures come
from ``benchmarks/gpu_storage.py``, which prints the fraction of peak).
"""

from __future__ import annotations

import pytest
import torch
from conftest import SCALE, per_second
from pytest_benchmark.fixture import BenchmarkFixture

from prefixkv.storage.paged_kv import PagedKVCache

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
NUM_TOKENS = {"smoke": [256], "medium": [256, 4096], "full": [256, 4096, 32768]}[SCALE]


def cache(device: str, num_tokens: int) -> PagedKVCache:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    blocks = 2 * num_tokens // 16 + 16
    return PagedKVCache(1, 8, 128, blocks, 16, dtype=dtype, device=device)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("num_tokens", NUM_TOKENS)
@pytest.mark.parametrize("device", DEVICES)
def test_write(benchmark: BenchmarkFixture, device: str, num_tokens: int) -> None:
    kv = cache(device, num_tokens)
    table = torch.randperm(kv.num_blocks, device=device)[: num_tokens // 16]
    slots = kv.slots_for(table, num_tokens)
    k = torch.randn(num_tokens, 8, 128, dtype=kv.dtype, device=device)

    def run() -> None:
        kv.write(0, k, k, slots)
        sync(device)

    benchmark(run)
    moved = 2 * 2 * k.numel() * k.element_size()  # read k, v; write k, v
    per_second(benchmark, moved / 1e9, "GB")


@pytest.mark.parametrize("num_tokens", NUM_TOKENS)
@pytest.mark.parametrize("device", DEVICES)
def test_gather(benchmark: BenchmarkFixture, device: str, num_tokens: int) -> None:
    kv = cache(device, num_tokens)
    table = torch.randperm(kv.num_blocks, device=device)[: num_tokens // 16]

    def run() -> None:
        kv.gather(0, table, num_tokens)
        sync(device)

    benchmark(run)
    moved = 2 * 2 * num_tokens * 8 * 128 * kv.kv.element_size()
    per_second(benchmark, moved / 1e9, "GB")
