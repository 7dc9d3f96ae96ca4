"""The equal-KV property (SPEC BB-6) and saved compute, over drawn workloads.

Workloads are trees of shared prefixes (cut at unaligned positions, with repeats,
one-token and long prompts), run in one or two waves through engines that differ
only in the prefix index, with block sizes 1/2/4/16, pools from generous to barely
enough (eviction, preemption), concurrency 1..8 and chunked prefill on or off.
Every step checks the manager's integrity; every finished request's K/V, gathered
through its block table, must equal the request computed alone without a cache.

The ``ci`` profile (default) runs a bounded, derandomized sample; for a longer
search run ``HYPOTHESIS_PROFILE=dev pytest tests/adapters/test_engine_properties.py``.
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple

import pytest
import torch
from helpers import BACKENDS, DEVICES
from hypothesis import currently_in_test_context, event, given, settings
from hypothesis import strategies as st

from prefixkv.adapters.engine import Engine, EngineConfig, RequestResult
from prefixkv.adapters.engine.testing import (
    FaultKind,
    FaultyIndex,
    KVRecorder,
    WriteGuard,
    assert_no_leaks,
    check_equal_kv,
)
from prefixkv.indexes import LockStateError, PrefixIndex, PrefixKVError, make_index

VOCAB = 512


def _examples(ci: int) -> int:
    """``ci`` examples in the ``ci`` profile; other profiles keep their own count (dev: 1000)."""
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci":
        return ci
    return settings.default.max_examples


pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Workload(NamedTuple):
    """Prompts in waves (one ``generate`` call each) and their output lengths."""

    waves: list[list[list[int]]]
    max_new: list[list[int]]

    @property
    def prompts(self) -> list[list[int]]:
        return [p for wave in self.waves for p in wave]

    def peak_tokens(self) -> int:
        """The most tokens one request ever holds K/V for."""
        pairs = zip(self.prompts, [n for w in self.max_new for n in w], strict=True)
        return max(len(p) + n - 1 for p, n in pairs)


class Setup(NamedTuple):
    """Engine settings shared by every backend of one example."""

    block_size: int
    num_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool


tokens_st = st.integers(0, VOCAB - 1)


@st.composite
def workloads(draw: st.DrawFn, *, max_prompt: int = 80, shared: bool = True) -> Workload:
    """A tree of token segments; each prompt is a root path plus an optional tail."""
    if shared:
        num_nodes = draw(st.integers(1, 6))
        paths: list[list[int]] = []
        for i in range(num_nodes):
            parent = paths[draw(st.integers(0, i - 1))] if i else []
            seg = draw(st.lists(tokens_st, min_size=1, max_size=draw(st.sampled_from([3, 20]))))
            paths.append(parent + seg)
        n = draw(st.integers(1, 8))
        prompts = []
        for _ in range(n):
            path = paths[draw(st.integers(0, num_nodes - 1))]
            tail = draw(st.lists(tokens_st, max_size=4))
            prompts.append((path + tail)[:max_prompt])
    else:
        n = draw(st.integers(1, 6))
        firsts = draw(st.lists(tokens_st, min_size=n, max_size=n, unique=True))
        prompts = [[f, *draw(st.lists(tokens_st, max_size=30))] for f in firsts]
    max_new = [draw(st.integers(1, 6)) for _ in prompts]
    cut = draw(st.integers(1, len(prompts)))
    waves = [prompts[:cut], prompts[cut:]] if cut < len(prompts) else [prompts]
    lens = [max_new[:cut], max_new[cut:]] if cut < len(prompts) else [max_new]
    return Workload(waves, lens)


@st.composite
def setups(draw: st.DrawFn, workload: Workload, *, roomy: bool = False) -> Setup:
    """Block size, pool (barely enough .. generous), concurrency and step budget."""
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    need = -(-workload.peak_tokens() // bs)
    total = sum(-(-(len(p) + 8) // bs) for p in workload.prompts)
    if roomy:
        num_blocks = 2 * total + need
    else:
        num_blocks = draw(
            st.one_of(st.integers(need, need + 2), st.integers(need, max(need, total)))
        )
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([5, 16, 64])) if chunked and not roomy else 4096
    return Setup(bs, num_blocks, draw(st.integers(1, 8)), budget, chunked)


def run_checked(
    workload: Workload,
    setup: Setup,
    backend: str,
    *,
    device: str = "cpu",
    index: PrefixIndex | None = None,
) -> tuple[Engine, list[RequestResult]]:
    """Run a workload and check BB-6 on it: the property every test here relies on.

    Checks, for every step, ``check_invariants()``; for every K/V write, that it
    misses the blocks the index holds (BB-5); for every request, its K/V and
    tokens against itself computed alone with no cache (float64, atol 1e-12); at
    the end, that nothing leaked.

    Raises:
        AssertionError: the property does not hold (or a PrefixKVError from misuse
            the engine ran into).
    """
    recorder = KVRecorder()
    config = EngineConfig(
        prefix_index=backend,
        block_size=setup.block_size,
        num_blocks=setup.num_blocks,
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        enable_chunked_prefill=setup.enable_chunked_prefill,
        dtype=torch.float64,
        device=device,
        check_invariants=True,
    )
    guard = WriteGuard(make_index(backend, setup.block_size) if index is None else index)
    engine = Engine(config, index=guard, on_finish=recorder, on_step=guard.on_step)
    guard.attach(engine.kv_cache)
    results: list[RequestResult] = []
    for wave, max_new in zip(workload.waves, workload.max_new, strict=True):
        res = engine.generate(wave, max_new_tokens=max_new)
        for r, n in zip(res, max_new, strict=True):
            assert len(r.output_tokens) == n
        results += res
    check_equal_kv(
        engine.model,
        recorder,
        workload.prompts,
        [r.output_tokens for r in results],
        [r.request_id for r in results],
    )
    assert_no_leaks(engine.manager)
    assert guard.num_checked_writes == engine.stats.num_steps
    if currently_in_test_context():
        _record_coverage(engine, backend)
    return engine, results


def _record_coverage(engine: Engine, backend: str) -> None:
    # Shown by --hypothesis-show-statistics: what the drawn examples exercised.
    stats = engine.stats
    event(f"{backend}: {'preempted' if stats.num_preemptions else 'no preemption'}")
    event(f"{backend}: {'evicted' if engine.manager.totals.num_evicted_blocks else 'no eviction'}")
    event(f"{backend}: {'hits' if stats.num_hit_tokens else 'no hits'}")
    event("batched" if stats.max_batch_size > 1 else "one at a time")


# ------------------------------------------------------------------- BB-6


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=_examples(40))
@given(data=st.data())
def test_bb_06_equal_kv_across_backends(device: str, data: st.DataObject) -> None:
    """Same tokens for none / hash_chain / radix, each request's K/V equal to no-cache."""
    workload = data.draw(workloads(), label="workload")
    setup = data.draw(setups(workload), label="setup")
    outputs = {}
    for backend in BACKENDS:
        _, results = run_checked(workload, setup, backend, device=device)
        outputs[backend] = [r.output_tokens for r in results]
    assert outputs["none"] == outputs["hash_chain"] == outputs["radix"]


@settings(max_examples=_examples(20))
@given(data=st.data())
def test_bb_06_equal_kv_radix_page_sizes_against_hash_chain(data: st.DataObject) -> None:
    """Radix at page size 1 (token hits) against the hash chain at a drawn block size."""
    workload = data.draw(workloads(), label="workload")
    setup = data.draw(setups(workload), label="setup")
    _, hc = run_checked(workload, setup, "hash_chain")
    tokens = setup.num_blocks * setup.block_size
    page1 = setup._replace(block_size=1, num_blocks=tokens)
    _, rx = run_checked(workload, page1, "radix")
    assert [r.output_tokens for r in hc] == [r.output_tokens for r in rx]


# ------------------------------------------------------------ saved compute


@settings(max_examples=_examples(25))
@given(data=st.data())
def test_saved_compute_radix_le_hash_chain_le_none_on_shared_prefixes(
    data: st.DataObject,
) -> None:
    """With room for everything, radix (page 1) computes <= hash chain <= no cache.

    Admission does not depend on hits when neither the pool nor the step budget
    binds, so every backend sees the same schedule and the same cached sequences;
    then a hash-chain hit of ``k`` blocks implies a radix hit of at least ``k * bs``.
    """
    workload = data.draw(workloads(), label="workload")
    setup = data.draw(setups(workload, roomy=True), label="setup")
    work = {}
    for backend, s in (
        ("none", setup),
        ("hash_chain", setup),
        ("radix", setup._replace(block_size=1, num_blocks=setup.num_blocks * setup.block_size)),
    ):
        engine, results = run_checked(workload, s, backend)
        assert engine.stats.num_preemptions == 0
        work[backend] = engine.stats.num_prefill_tokens
        assert work[backend] == sum(r.computed_prefill_tokens for r in results)
        assert work[backend] == sum(
            len(p) - r.hit_tokens for p, r in zip(workload.prompts, results, strict=True)
        )
    assert work["radix"] <= work["hash_chain"] <= work["none"]
    assert work["none"] == sum(map(len, workload.prompts))


@settings(max_examples=_examples(10))
@given(data=st.data())
def test_saved_compute_equal_without_sharing(data: st.DataObject) -> None:
    """Prompts with distinct first tokens share nothing: every backend computes all."""
    workload = data.draw(workloads(shared=False), label="workload")
    setup = data.draw(setups(workload, roomy=True), label="setup")
    work = set()
    for backend in BACKENDS:
        engine, results = run_checked(workload, setup, backend)
        assert all(r.hit_tokens == 0 for r in results)
        work.add(engine.stats.num_prefill_tokens)
    assert work == {sum(map(len, workload.prompts))}


# -------------------------------------------------------- the test of the test

# A long shared prefix cut off the block boundaries, a repeat, and an unrelated
# request; in the tight pool the unrelated one forces eviction while the others run.
_BASE = [(i * 37 + 11) % VOCAB for i in range(40)]
TEETH_WORKLOAD = Workload(
    waves=[[_BASE[:30] + [1, 2, 3]], [_BASE[:35] + [4], _BASE, [5, *_BASE[::-1]], _BASE[:22]]],
    max_new=[[6], [6, 6, 6, 6]],
)
# Both caching backends, two block sizes, a roomy and a tight pool.
TEETH_GRID = pytest.mark.parametrize(
    ("num_blocks_per_token", "block_size", "backend"),
    list(itertools.product([1.0, 0.5], [1, 4], ["hash_chain", "radix"])),
)


@TEETH_GRID
def test_teeth_control_real_index_passes(
    backend: str, block_size: int, num_blocks_per_token: float
) -> None:
    setup = _teeth_setup(block_size, num_blocks_per_token)
    run_checked(TEETH_WORKLOAD, setup, backend)


def _teeth_setup(block_size: int, per_token: float) -> Setup:
    need = -(-TEETH_WORKLOAD.peak_tokens() // block_size)
    total = sum(-(-(len(p) + 6) // block_size) for p in TEETH_WORKLOAD.prompts)
    num_blocks = max(need, int(total * per_token))
    return Setup(block_size, num_blocks, 2, 4096, False)


@pytest.mark.parametrize("backend", ["hash_chain", "radix"])
@pytest.mark.parametrize("block_size", [1, 4])
def test_teeth_wrong_block_on_a_hit_breaks_equal_kv(backend: str, block_size: int) -> None:
    """An index returning another block on one hit makes the K/V check fail."""
    faulty = FaultyIndex(make_index(backend, block_size), "wrong_block")
    with pytest.raises(AssertionError, match="no-cache run"):
        run_checked(TEETH_WORKLOAD, _teeth_setup(block_size, 1.0), backend, index=faulty)
    assert faulty.num_faults == 1


@TEETH_GRID
def test_teeth_skipped_ref_count_breaks_the_property(
    backend: str, block_size: int, num_blocks_per_token: float
) -> None:
    """A hit whose lock is skipped makes the run fail: its blocks can be evicted
    and overwritten while in use (K/V mismatch), and its release is unbalanced."""
    faulty = FaultyIndex(make_index(backend, block_size), "skip_ref")
    with pytest.raises((AssertionError, LockStateError)):
        run_checked(
            TEETH_WORKLOAD, _teeth_setup(block_size, num_blocks_per_token), backend, index=faulty
        )
    assert faulty.num_faults == 1


@pytest.mark.parametrize("backend", ["hash_chain", "radix"])
@pytest.mark.parametrize("fault", ["wrong_block", "skip_ref"])
@settings(max_examples=_examples(12))
@given(data=st.data())
def test_teeth_drawn_workloads_catch_faults(
    backend: str, fault: FaultKind, data: st.DataObject
) -> None:
    """On drawn workloads: whenever the fault fired, the property check failed.

    The pool is roomy, so every faulty match is admitted and never preempted:
    a swapped block stays in the table (its K/V sit at the wrong positions) and
    a skipped lock leaves an unbalanced unlock. (In a tight pool a fault can
    vanish unobserved: a match that is not admitted, or a request preempted and
    recomputed before anything read the wrong K/V.)
    """
    workload = data.draw(workloads(), label="workload")
    setup = data.draw(setups(workload, roomy=True), label="setup")
    faulty = FaultyIndex(make_index(backend, setup.block_size), fault, max_faults=None)
    try:
        run_checked(workload, setup, backend, index=faulty)
    except (AssertionError, PrefixKVError) as exc:
        event(f"fault caught by {type(exc).__name__}")
        assert faulty.num_faults > 0
    else:
        event("no chance to inject the fault")
        assert faulty.num_faults == 0, f"{faulty.num_faults} faults went unnoticed"
