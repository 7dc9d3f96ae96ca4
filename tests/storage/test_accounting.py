"""SPEC BB-8: per-request granularity accounting — hit tokens, tokens matched but
recomputed at a block boundary, and the recomputed last block."""

from __future__ import annotations

import random

import pytest

from prefixkv.adapters import CacheManager
from prefixkv.adapters.accounting import BoundaryTracker
from prefixkv.indexes import describe, make_index
from prefixkv.storage import BlockAllocator

R = random.Random(0)
A = [R.randrange(1, 32000) for _ in range(80)]
B = A[:30] + [R.randrange(1, 32000) for _ in range(50)]


def records(name: str, bs: int, prompts: list[list[int]]) -> list[tuple[int, int, int, int]]:
    index = make_index(name, block_size=bs)
    tracker = BoundaryTracker(bs, caches=describe(index).caches)
    m = CacheManager(index, BlockAllocator(4096 // bs), observers=[tracker])
    out = []
    for i, p in enumerate(prompts):
        m.admit(i, p)
        m.commit(i, len(p))
        r = tracker.record(i)
        m.finish(i)
        tracker.check_invariants()
        assert r.matched_tokens is not None and r.cap_lost_tokens is not None
        assert r.boundary_lost_tokens is not None
        out.append((r.hit_tokens, r.matched_tokens, r.boundary_lost_tokens, r.cap_lost_tokens))
    return out


@pytest.mark.parametrize(
    ("name", "bs", "want"),
    [
        # (hit, matched, boundary lost, last block lost) for A, B, A again
        ("hash_chain", 16, [(0, 0, 0, 0), (16, 30, 14, 0), (64, 80, 0, 16)]),
        ("radix", 1, [(0, 0, 0, 0), (30, 30, 0, 0), (79, 80, 0, 1)]),
        ("radix", 16, [(0, 0, 0, 0), (16, 30, 14, 0), (64, 80, 0, 16)]),
        ("none", 16, [(0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0)]),
    ],
)
def test_bb_08_seed_example_accounting(name: str, bs: int, want: list[tuple[int, ...]]) -> None:
    assert records(name, bs, [A, B, A]) == want


def test_bb_08_a_partial_last_block_counts_as_boundary_loss() -> None:
    # Turn 2 extends turn 1 (20 tokens): its tokens 16..19 were computed in a partial
    # block the hash chain never keeps, and the radix tree at page size 1 does.
    turn1 = A[:20]
    turn2 = turn1 + B[40:60]
    assert records("hash_chain", 16, [turn1, turn2])[1] == (16, 20, 4, 0)
    assert records("radix", 1, [turn1, turn2])[1] == (20, 20, 0, 0)


def test_bb_08_the_null_index_has_no_boundary_losses() -> None:
    short = A[:10]
    assert records("none", 16, [short, short]) == [(0, 0, 0, 0), (0, 0, 0, 0)]
    assert records("hash_chain", 16, [short, short])[1] == (0, 10, 9, 0)


def test_bb_08_partial_tail_through_the_vllm_engine_class() -> None:
    # The engine class feeds the key lazily (when a block fills); at free it must still
    # report the decoded tokens of the partial last block.
    from types import SimpleNamespace

    from prefixkv.adapters.lab.replay import replay

    turn1 = SimpleNamespace(id="t1", tokens=A[:20], output=[7, 8])
    turn2 = SimpleNamespace(id="t2", tokens=A[:20] + [7, 8] + B[40:50], output=[1])
    chain = replay([turn1, turn2], make_index("hash_chain", block_size=16), 64,
                   driver="vllm", track_boundaries=True)  # fmt: skip
    r = chain.records[1]
    assert (r.hit_tokens, r.matched_tokens, r.boundary_lost_tokens) == (16, 21, 5)
    tree = replay([turn1, turn2], make_index("radix", block_size=1), 1024,
                  driver="sglang", track_boundaries=True)  # fmt: skip
    assert tree.hits[1]["hit_tokens"] == 21
