"""Small helpers shared by the test modules (plain Python, the tests' own oracles)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from prefixkv.adapters.manager import CacheManager

BACKENDS = ("none", "hash_chain", "radix")
"""The built-in index backends."""

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
"""Torch devices to run on (CUDA only where there is one)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, one token at a time (a reference, not fast)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def manager_state(m: CacheManager, *, totals: bool = True) -> tuple[Any, ...]:
    """Everything a refused call must leave as it was: the pool, the index (and vLLM's
    free queue, where it has one), every running request's block table, computed tokens
    and key, the blocks only a request holds, and the totals (last; ``totals=False``
    leaves them out, for a rejected admission, which counts as one)."""
    queue = getattr(m.index, "free_queue_block_ids", None)
    state = (
        tuple(m.allocator.free_block_ids()),
        m.index.stats(),
        tuple(queue()) if queue is not None else None,
        tuple(m.running()),
        tuple(
            (rid, tuple(m.block_table(rid)), m.num_computed_tokens(rid), tuple(m.key(rid).tokens))
            for rid in m.running()
        ),
        m.num_held_only_blocks(),
    )
    return (*state, dataclasses.astuple(m.totals)) if totals else state
