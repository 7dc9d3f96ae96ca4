"""Replays consume their requests as a stream: memory does not grow with the trace.

A generator of 200,000 synthetic requests is replayed without keeping per-request
results; the interpreter's allocated blocks (``sys.getallocatedblocks``: every Python
object) and the process's resident memory are sampled after 10% of the requests and at
the end (counts and RSS deltas, not times). A replay that held one Python object per
request would add 180,000 blocks; one that held memory outside the interpreter, about
12 bytes a request, would add 2 MiB of RSS.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tracemalloc
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefixkv.adapters.lab.replay import COLLECT_EVERY, replay
from prefixkv.adapters.lab.traces import ReadSettings, TraceRequest, open_trace
from prefixkv.indexes import PrefixMatch, TokenKey, make_index
from prefixkv.indexes.wrapper import IndexWrapper

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * _PAGE


def _requests(n: int) -> Iterator[TraceRequest]:
    out = array("I", [9])  # one sampled token: no decode step, the cheapest request
    for i in range(n):
        # 64 tenants' 32-token prefixes, then a token of their own: hits and evictions.
        yield TraceRequest(f"req-{i}", array("I", [i % 64 + 1] * 32 + [i % 1000 + 1]), out)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_a_long_replay_runs_in_constant_memory() -> None:
    n = 200_000
    early: dict[str, int] = {}
    done = [0]

    def progress(_tokens: int) -> None:
        done[0] += 1
        if done[0] == n // 10:
            gc.collect()
            early["blocks"], early["rss"] = sys.getallocatedblocks(), _rss()

    index = make_index("none", block_size=16)
    result = replay(
        _requests(n), index, 64, driver="manager", concurrency=4,
        keep_per_request=False, progress=progress,
    )  # fmt: skip
    gc.collect()
    blocks, rss = sys.getallocatedblocks() - early["blocks"], _rss() - early["rss"]
    assert result.num_requests == n and result.total_prompt_tokens == 33 * n
    assert not result.ids and not len(result.request_seconds)
    # 180,000 more requests: one object kept per 100 of them would add 1,800 blocks.
    assert blocks < 1_000, f"{blocks} more allocated blocks"
    assert rss < 2 * 2**20, f"grew by {rss / 2**20:.1f} MiB"


def test_a_trace_replays_in_memory_bounded_by_the_cache(tmp_path: Path) -> None:
    # The same cache over a trace 8x longer: tracemalloc peaks agree within 20%. The
    # reader's block cache is made small, so it is full in both runs.
    folder = tmp_path

    def trace(copies: int) -> Path:
        path = folder / f"t{copies}.jsonl"
        with path.open("w") as f:
            for c in range(copies):
                for k in range(50):
                    ids = [c * 1000 + k // 5, c * 1000 + 100 + k]
                    f.write(json.dumps({"input_length": 1000, "output_length": 8, "hash_ids": ids}))
                    f.write("\n")
        return path

    peaks = []
    for copies in (1, 8):
        source = open_trace(trace(copies), settings=ReadSettings(block_cache_bytes=16 * 2**10))
        tracemalloc.start()
        replay(source, make_index("hash_chain", block_size=16), 256, driver="vllm",
               concurrency=2, keep_per_request=False)  # fmt: skip
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.2 * peaks[0], peaks


class _Cycle:
    alive = 0

    def __init__(self) -> None:
        _Cycle.alive += 1
        self.me = self  # only the cyclic collector can free it

    def __del__(self) -> None:
        _Cycle.alive -= 1


class _CyclicIndex(IndexWrapper):
    """An index (a user's, say) that leaves one reference cycle per lookup."""

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        _Cycle()
        return super().match_prefix(key, max_num_tokens)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_replay_collects_cycles_between_requests_and_restores_the_collector(
    enabled: bool,
) -> None:
    # The replay runs with the cyclic collector off and collects every EVERY
    # admissions: another index's cycles stay bounded. A caller who turned the
    # collector off keeps it off (and then nothing is collected).
    n = 3 * COLLECT_EVERY + 100
    gc.collect()
    _Cycle.alive = 0
    seen: list[tuple[bool, int]] = []  # the collector's state, cycles alive
    was = gc.isenabled()
    if not enabled:
        gc.disable()
    try:
        replay(
            _requests(n), _CyclicIndex(make_index("hash_chain", block_size=16)), 64,
            driver="manager", concurrency=2, keep_per_request=False,
            progress=lambda _: seen.append((gc.isenabled(), _Cycle.alive)),
        )  # fmt: skip
        assert gc.isenabled() is enabled
        assert not any(on for on, _ in seen)
        peak = max(alive for _, alive in seen)
        assert peak <= COLLECT_EVERY + 2 if enabled else peak == n, peak
    finally:
        if was:
            gc.enable()
        gc.collect()


@pytest.mark.parametrize("enabled", [True, False])
def test_building_a_seat_sets_off_no_collection_and_restores_the_collector(
    enabled: bool,
) -> None:
    # vLLM's engine class makes a block object per pool block up front: built with the
    # collector on, 62,500 of them set off some 90 collections (one full) that free
    # nothing.
    from prefixkv.adapters.lab.replay import driver_seat

    starts: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            starts.append(info["generation"])

    indexes = {d: make_index("hash_chain", block_size=16) for d in ("vllm", "sglang")}
    was = gc.isenabled()
    if not enabled:
        gc.disable()
    gc.collect()
    gc.callbacks.append(count)
    try:
        for driver, index in indexes.items():
            driver_seat(driver, index, 62_500)  # type: ignore[arg-type]
            assert gc.isenabled() is enabled
        # at most the one young-generation pass that re-enabling sets off at once
        assert len(starts) <= len(indexes) and set(starts) <= {0}, starts
    finally:
        gc.callbacks.remove(count)
        if was:
            gc.enable()
