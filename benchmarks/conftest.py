"""Shared fixtures and sizes for the pytest-benchmark suites.

``PREFIXKV_BENCH=full`` runs the sizes the README's tables come from (prompts up to
128K tokens, caches up to 1M blocks; minutes and a few GB of RAM); the default is a
medium run; ``PREFIXKV_BENCH=smoke`` is the tiny run the test suite uses to make
sure the benchmarks still work.
"""

from __future__ import annotations

import os
import random

import pytest

SCALE = os.environ.get("PREFIXKV_BENCH", "medium")
if SCALE not in ("smoke", "medium", "full"):
    raise SystemExit(f"PREFIXKV_BENCH must be smoke, medium or full, not {SCALE!r}")

PROMPT_LENS = {
    "smoke": [16, 256],
    "medium": [16, 256, 1024, 4096, 32768],
    "full": [16, 256, 1024, 4096, 32768, 131072],
}[SCALE]
CACHE_BLOCKS = {
    "smoke": [0, 256],
    "medium": [0, 1_000, 100_000],
    "full": [0, 1_000, 100_000, 1_000_000],
}[SCALE]


def tokens(n: int, seed: int) -> list[int]:
    """``n`` pseudo-random token ids, the same for the same seed."""
    rng = random.Random(seed)
    return [rng.randrange(1, 32000) for _ in range(n)]


def per_second(benchmark: object, amount: float, unit: str) -> None:
    """Record ``amount`` per second of the measured call in the benchmark's extra info
    (nothing when benchmarks are disabled, as in the test suite's smoke run)."""
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        benchmark.extra_info[f"{unit}_per_second"] = amount / stats["mean"]  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the ``cuda``-marked benchmarks without a GPU (as the test suite does)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
