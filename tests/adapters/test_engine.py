"""Scenario tests of the reference engine: config and prompt errors, the model's paged
attention against its dense reference, scheduling (batching, chunked prefill,
preemption) and the acceptance example (same tokens, fewer prefill tokens).

The randomized equal-KV property lives in ``test_engine_properties.py``.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers import BACKENDS, DEVICES

from prefixkv.adapters.accounting import BoundaryTracker
from prefixkv.adapters.engine import (
    Engine,
    EngineConfig,
    EngineConfigError,
    ModelConfig,
    RequestResult,
    SeqChunk,
    TinyTransformer,
)
from prefixkv.adapters.engine.testing import (
    FaultyIndex,
    KVRecorder,
    WriteGuard,
    assert_no_leaks,
    check_equal_kv,
)
from prefixkv.indexes import (
    IndexWrapper,
    InvalidTokenError,
    PrefixKVError,
    UnknownIndexError,
    describe_index,
    make_index,
)

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tokens(seed: int, n: int, vocab: int = 512) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def _shared_prompts() -> list[list[int]]:
    """Prompts sharing prefixes that end off block boundaries, plus a repeat."""
    base = _tokens(0, 40)
    return [
        base[:30] + [1, 2, 3],
        base[:35] + [4],
        base,
        base[:17] + [9, 9, 9, 9],
        [7, 8],
        base[:30] + [1, 2, 3],
    ]


def _run(
    backend: str, prompts: list[list[int]], max_new: int | list[int] = 8, **cfg: object
) -> tuple[Engine, list[RequestResult], KVRecorder]:
    recorder = KVRecorder()
    options: dict[str, object] = {"dtype": F64, "check_invariants": True, **cfg}
    config = EngineConfig(prefix_index=backend, **options)  # type: ignore[arg-type]
    bs = config.block_size or describe_index(backend).default_block_size
    tracker = BoundaryTracker(bs, caches=describe_index(backend).caches)
    engine = Engine(config, observers=[tracker], on_finish=recorder)
    results = engine.generate(prompts, max_new_tokens=max_new)
    outputs = [r.output_tokens for r in results]
    ids = [r.request_id for r in results]
    check_equal_kv(engine.model, recorder, prompts, outputs, ids)
    assert_no_leaks(engine.manager)
    return engine, results, recorder


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 0),
        ("block_size", 2.0),
        ("num_blocks", 0),
        ("num_blocks", -3),
        ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0),
        ("dtype", torch.float16),
        ("dtype", "int8"),
        ("device", "tpu"),
        ("device", 3),
        ("prefix_index", ""),
        ("prefix_index", 5),
        ("check_invariants", 1),
        ("enable_chunked_prefill", "yes"),
        ("index_options", {"block_size": 4}),
        ("index_options", [("seed", 1)]),
        ("model", {"num_layers": 2}),
    ],
)
def test_config_rejects_bad_values(field: str, value: object) -> None:
    with pytest.raises(EngineConfigError, match=field):
        EngineConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_layers": 0},
        {"head_dim": 7},
        {"num_heads": 4, "num_kv_heads": 3},
        {"vocab_size": -1},
        {"intermediate_size": 0},
        {"rope_theta": 0.5},
        {"seed": "x"},
    ],
)
def test_model_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(EngineConfigError):
        ModelConfig(**kwargs)  # type: ignore[arg-type]


def test_config_errors_are_prefixkv_errors() -> None:
    assert issubclass(EngineConfigError, PrefixKVError)
    assert issubclass(EngineConfigError, ValueError)


def test_config_normalizes_dtype_and_device_names() -> None:
    cfg = EngineConfig(dtype="float64", device="cpu")
    assert cfg.torch_dtype is torch.float64
    assert cfg.torch_device == torch.device("cpu")


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(UnknownIndexError, match="hash_chain"):
        Engine(EngineConfig(prefix_index="btree"))


def test_block_size_defaults_to_the_backend_default() -> None:
    assert Engine(EngineConfig(prefix_index="hash_chain", num_blocks=4)).block_size == 16
    assert Engine(EngineConfig(prefix_index="none", num_blocks=4)).block_size == 16
    assert Engine(EngineConfig(prefix_index="radix", num_blocks=4)).block_size == 1
    engine = Engine(EngineConfig(prefix_index="radix", block_size=4, num_blocks=4))
    assert engine.block_size == engine.kv_cache.block_size == engine.manager.block_size == 4


def test_given_index_must_agree_with_block_size() -> None:
    index = make_index("hash_chain", 4)
    assert Engine(EngineConfig(num_blocks=8), index=index).block_size == 4
    with pytest.raises(EngineConfigError, match="16"):
        Engine(EngineConfig(block_size=16, num_blocks=8), index=make_index("hash_chain", 4))


# ---------------------------------------------------------------------- prompts


def test_out_of_vocab_token_is_rejected_with_its_value() -> None:
    engine = Engine(EngineConfig(num_blocks=8, model=ModelConfig(vocab_size=100)))
    with pytest.raises(InvalidTokenError, match="100"):
        engine.generate([[1, 2, 100]], max_new_tokens=2)
    with pytest.raises(InvalidTokenError, match="-5"):
        engine.generate([[1, -5]], max_new_tokens=2)
    with pytest.raises(InvalidTokenError, match="True"):
        engine.generate([[1, True]], max_new_tokens=2)
    with pytest.raises(InvalidTokenError, match="'a'"):
        engine.generate([[1, "a"]], max_new_tokens=2)  # type: ignore[list-item]
    assert not engine.has_unfinished_requests()


def test_empty_prompt_is_rejected() -> None:
    engine = Engine(EngineConfig(num_blocks=8))
    with pytest.raises(InvalidTokenError, match="prompt 1 is empty"):
        engine.generate([[1, 2], []], max_new_tokens=2)
    with pytest.raises(InvalidTokenError):
        engine.generate("abc", max_new_tokens=2)  # type: ignore[arg-type]
    # Validation happens before anything is queued.
    assert not engine.has_unfinished_requests()


def test_bad_max_new_tokens_is_rejected() -> None:
    engine = Engine(EngineConfig(num_blocks=8))
    for bad in (0, -1, 2.5, None):
        with pytest.raises(EngineConfigError, match=str(bad)):
            engine.generate([[1, 2]], max_new_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(EngineConfigError, match="2 entries for 1 prompts"):
        engine.generate([[1, 2]], max_new_tokens=[3, 4])


def test_request_that_can_never_fit_is_rejected_up_front() -> None:
    engine = Engine(EngineConfig(block_size=4, num_blocks=3))
    # 10 prompt tokens + 4 new - 1 (the last token has no K/V) = 13 tokens -> 4 blocks.
    with pytest.raises(EngineConfigError, match="4 blocks"):
        engine.generate([list(range(10))], max_new_tokens=4)
    assert engine.generate([list(range(9))], max_new_tokens=4)[0].output_tokens
    unchunked = Engine(
        EngineConfig(num_blocks=8, max_num_batched_tokens=8, enable_chunked_prefill=False)
    )
    with pytest.raises(EngineConfigError, match="chunked prefill"):
        unchunked.generate([list(range(8))], max_new_tokens=2)


# ------------------------------------------------------------------------ model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_forward_equals_the_dense_reference(device: str, block_size: int) -> None:
    """Whole prefill, then two chunks, then decode steps, all through a scrambled table."""
    model = TinyTransformer(ModelConfig(num_kv_heads=2), dtype=F64, device=device)
    tokens = _tokens(1, 29)
    ref = model.reference_forward(tokens)
    nb = -(-len(tokens) // block_size)
    cache = model.make_kv_cache(2 * nb + 1, block_size)
    table = list(range(2 * nb, 0, -2))[:nb]  # non-contiguous, descending
    logits = model.forward([SeqChunk(tokens[:11], 0, table)], cache)
    torch.testing.assert_close(logits[0], ref.logits[10], rtol=0, atol=1e-12)
    logits = model.forward([SeqChunk(tokens[11:20], 11, table)], cache)
    torch.testing.assert_close(logits[0], ref.logits[19], rtol=0, atol=1e-12)
    for pos in range(20, len(tokens)):
        logits = model.forward([SeqChunk(tokens[pos : pos + 1], pos, table)], cache)
        torch.testing.assert_close(logits[0], ref.logits[pos], rtol=0, atol=1e-12)
    for layer in range(model.config.num_layers):
        k, v = cache.gather(layer, table, len(tokens))
        torch.testing.assert_close(k, ref.keys[layer], rtol=0, atol=1e-12)
        torch.testing.assert_close(v, ref.values[layer], rtol=0, atol=1e-12)


def test_batched_forward_equals_one_at_a_time() -> None:
    model = TinyTransformer(ModelConfig(), dtype=F64)
    a, b = _tokens(2, 13), _tokens(3, 5)
    cache = model.make_kv_cache(8, 4)
    logits = model.forward([SeqChunk(a, 0, [0, 1, 2, 3]), SeqChunk(b, 0, [4, 5])], cache)
    torch.testing.assert_close(logits[0], model.reference_forward(a).logits[-1], rtol=0, atol=1e-12)
    torch.testing.assert_close(logits[1], model.reference_forward(b).logits[-1], rtol=0, atol=1e-12)


def test_weights_follow_the_seed() -> None:
    one = TinyTransformer(ModelConfig(seed=1))
    assert torch.equal(one.embed, TinyTransformer(ModelConfig(seed=1)).embed)
    assert not torch.equal(one.embed, TinyTransformer(ModelConfig(seed=2)).embed)


def test_forward_rejects_empty_chunks() -> None:
    model = TinyTransformer(ModelConfig())
    with pytest.raises(PrefixKVError):
        model.forward([SeqChunk([], 0, [0])], model.make_kv_cache(2, 4))
    with pytest.raises(PrefixKVError):
        model.reference_forward([])


# ------------------------------------------------------------------- acceptance


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_bb_06_acceptance_same_tokens_fewer_prefill_tokens(block_size: int) -> None:
    """The issue's acceptance example: identical tokens, less prefill with a cache."""
    prompts = _shared_prompts()
    runs = {b: _run(b, prompts, block_size=block_size, num_blocks=512) for b in BACKENDS}
    tokens = {b: [r.output_tokens for r in res] for b, (_, res, _) in runs.items()}
    assert tokens["none"] == tokens["hash_chain"] == tokens["radix"]
    computed = {b: e.stats.num_prefill_tokens for b, (e, _, _) in runs.items()}
    assert computed["none"] == sum(map(len, prompts))
    assert computed["hash_chain"] < computed["none"]
    assert computed["radix"] < computed["none"]
    for _, res, _ in runs.values():
        for r in res:
            assert len(r.output_tokens) == 8
            assert r.computed_prefill_tokens == r.prompt_len - r.hit_tokens


@pytest.mark.parametrize("device", DEVICES)
def test_acceptance_float32_default_dtype(device: str) -> None:
    """float32 (the default): same tokens, and K/V equal to no-cache within float32 noise."""
    prompts = _shared_prompts()
    outs = []
    for backend in BACKENDS:
        recorder = KVRecorder()
        config = EngineConfig(prefix_index=backend, block_size=4, num_blocks=40, device=device)
        engine = Engine(config, on_finish=recorder)
        assert engine.kv_cache.dtype is torch.float32
        res = engine.generate(prompts, max_new_tokens=8)
        outs.append([r.output_tokens for r in res])
        ids = [r.request_id for r in res]
        check_equal_kv(engine.model, recorder, prompts, outs[-1], ids, atol=1e-4)
    assert outs[0] == outs[1] == outs[2]


def test_bb_02_seed_example_through_the_engine() -> None:
    """B shares A's first 30 tokens: hash chain (16) hits 16 and loses 14, radix (1) hits 30."""
    a = _tokens(4, 80)
    b = a[:30] + _tokens(5, 50)
    hc, _, _ = _run("hash_chain", [a], block_size=16, num_blocks=32)
    hc_b = hc.generate([b], max_new_tokens=8)[0]
    assert (hc_b.hit_tokens, hc_b.matched_tokens, hc_b.boundary_lost_tokens) == (16, 30, 14)
    assert hc_b.computed_prefill_tokens == 80 - 16
    rx, _, _ = _run("radix", [a], num_blocks=512)
    rx_b = rx.generate([b], max_new_tokens=8)[0]
    assert (rx_b.hit_tokens, rx_b.boundary_lost_tokens) == (30, 0)
    assert hc_b.output_tokens == rx_b.output_tokens


def test_bb_03_repeat_hits_capped_at_len_minus_one() -> None:
    a = _tokens(6, 80)
    hc, _, _ = _run("hash_chain", [a], block_size=16, num_blocks=32)
    assert hc.generate([a], max_new_tokens=2)[0].hit_tokens == 64
    rx, _, _ = _run("radix", [a], num_blocks=512)
    assert rx.generate([a], max_new_tokens=2)[0].hit_tokens == 79


@pytest.mark.parametrize(
    ("backend", "block_size", "hit"), [("radix", 1, 15), ("radix", 4, 12), ("hash_chain", 4, 12)]
)
def test_bb_05_repeated_prompt_never_writes_into_a_cached_block(
    backend: str, block_size: int, hit: int
) -> None:
    """A repeat recomputes its capped last block, which is cached already: its K/V
    must go to a private copy, not into the index's block (the radix tree would
    otherwise swap the copy for the cached block before the forward pass)."""
    guard = WriteGuard(make_index(backend, block_size))
    config = EngineConfig(num_blocks=64, dtype=F64, check_invariants=True)
    engine = Engine(config, index=guard, on_step=guard.on_step)
    guard.attach(engine.kv_cache)
    prompt = list(range(1, 17))
    first = engine.generate([prompt], max_new_tokens=3)[0]
    again = engine.generate([prompt, prompt], max_new_tokens=3)
    assert [r.hit_tokens for r in again] == [hit, hit]
    assert again[0].output_tokens == again[1].output_tokens == first.output_tokens
    assert guard.num_checked_writes == engine.stats.num_steps
    assert_no_leaks(engine.manager)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bb_05_repeat_fits_a_barely_enough_pool(backend: str) -> None:
    """The recomputed last token of a repeat needs no block beyond the request's peak:
    a duplicate of a cached block must not stay pinned next to it (found by the
    dev profile: 3 + 2 - 1 tokens in a 4-block pool)."""
    engine, res, _ = _run(backend, [[0, 0, 0]], max_new=1, block_size=1, num_blocks=4)
    again = engine.generate([[0, 0, 0]], max_new_tokens=2)[0]
    assert again.output_tokens[:1] == res[0].output_tokens
    assert again.hit_tokens == (0 if backend == "none" else 2)


def test_write_guard_catches_a_write_into_a_cached_block() -> None:
    guard = WriteGuard(make_index("hash_chain", 4))
    engine = Engine(EngineConfig(num_blocks=8, dtype=F64), index=guard, on_step=guard.on_step)
    guard.attach(engine.kv_cache)
    engine.generate([list(range(9))], max_new_tokens=1)  # 9 tokens with K/V: 2 full blocks
    cached = [b for b in range(8) if not engine.manager.allocator.is_free(b)]
    assert len(cached) == engine.manager.index.stats().num_cached_blocks == 2
    c = engine.model.config
    kv = torch.zeros(1, c.num_kv_heads, c.head_dim, dtype=F64)
    with pytest.raises(AssertionError, match=f"blocks \\[{cached[1]}\\] that the index holds"):
        engine.kv_cache.write(0, kv, kv, [cached[1] * 4 + 2])


def test_requests_in_one_step_share_a_prefill() -> None:
    """Blocks of a prefill are registered before the forward, like vLLM's allocate_slots."""
    base = _tokens(7, 24)
    engine, res, _ = _run(
        "hash_chain", [base + [1], base + [2]], max_new=2, block_size=4, num_blocks=32
    )
    assert engine.stats.max_batch_size == 2
    assert [r.hit_tokens for r in res] == [0, 24]


def test_no_sharing_means_equal_work() -> None:
    prompts = [[i, *_tokens(i, 10 + i)] for i in range(6)]
    work = {b: _run(b, prompts, block_size=2, num_blocks=128)[0].stats for b in BACKENDS}
    assert len({s.num_prefill_tokens for s in work.values()}) == 1
    assert all(s.num_hit_tokens == 0 for s in work.values())


# -------------------------------------------------------------------- scheduling


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_gives_the_same_tokens(backend: str) -> None:
    prompts = _shared_prompts()
    _, whole, _ = _run(backend, prompts, block_size=4, num_blocks=256)
    engine, chunked, _ = _run(
        backend, prompts, block_size=4, num_blocks=256, max_num_batched_tokens=7
    )
    assert [r.output_tokens for r in whole] == [r.output_tokens for r in chunked]
    assert engine.stats.num_steps > max(len(p) for p in prompts) // 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_preemption_recomputes_and_keeps_outputs(backend: str) -> None:
    prompts = _shared_prompts()
    _, roomy, _ = _run(backend, prompts, max_new=12, block_size=2, num_blocks=512)
    # 40 + 12 - 1 tokens need 26 blocks: a pool of 30 holds one long request at a time.
    engine, tight, _ = _run(backend, prompts, max_new=12, block_size=2, num_blocks=30)
    assert [r.output_tokens for r in roomy] == [r.output_tokens for r in tight]
    assert engine.stats.num_preemptions > 0
    assert sum(r.num_preemptions for r in tight) == engine.stats.num_preemptions
    assert engine.stats.num_recomputed_tokens == sum(r.recomputed_tokens for r in tight)
    assert all(r.recomputed_tokens == 0 for r in tight if not r.num_preemptions)


def test_max_num_seqs_bounds_the_batch() -> None:
    seen: list[int] = []
    engine = Engine(
        EngineConfig(num_blocks=64, block_size=4, max_num_seqs=3),
        on_step=lambda e: seen.append(len(e.scheduler.running)),
    )
    engine.generate([[i, i + 1] for i in range(7)], max_new_tokens=3)
    assert max(seen) == 3
    assert engine.stats.max_batch_size == 3
    assert len(seen) == engine.stats.num_steps


def test_per_request_max_new_tokens_and_results_in_order() -> None:
    engine = Engine(EngineConfig(num_blocks=64, block_size=4, max_num_seqs=2))
    res = engine.generate([[1, 2, 3], [4], [5, 6]], max_new_tokens=[1, 5, 2])
    assert [len(r.output_tokens) for r in res] == [1, 5, 2]
    assert [r.prompt_len for r in res] == [3, 1, 2]
    assert len({r.request_id for r in res}) == 3
    st = engine.stats
    assert st.num_finished == st.num_requests == 3
    # Each output token but the last of a request needs a decode step.
    assert st.num_decode_tokens == (1 - 1) + (5 - 1) + (2 - 1)


def test_cache_persists_across_generate_calls() -> None:
    prompt = _tokens(8, 20)
    engine = Engine(EngineConfig(prefix_index="radix", num_blocks=256, dtype=F64))
    first = engine.generate([prompt], max_new_tokens=4)[0]
    again = engine.generate([prompt], max_new_tokens=4)[0]
    assert (first.hit_tokens, again.hit_tokens) == (0, 19)
    assert first.output_tokens == again.output_tokens


def test_add_request_and_step_api() -> None:
    engine = Engine(EngineConfig(num_blocks=64, block_size=4))
    assert engine.step() == []
    rid = engine.add_request([1, 2, 3], max_new_tokens=2)
    finished: list[int] = []
    while engine.has_unfinished_requests():
        finished += engine.step()
    assert finished == [rid]
    assert len(engine.result(rid).output_tokens) == 2
    with pytest.raises(PrefixKVError, match="99"):
        engine.result(99)


# ---------------------------------------------------------- the test of the test


def test_faulty_index_rejects_unknown_faults() -> None:
    with pytest.raises(PrefixKVError, match="bogus"):
        FaultyIndex(make_index("hash_chain", 4), "bogus")  # type: ignore[arg-type]


def test_check_invariants_runs_after_every_step() -> None:
    # The manager's check runs the index's: a spy on the index counts it (a compiled
    # manager cannot be patched).
    calls: list[int] = []

    class Spy(IndexWrapper):
        def check_invariants(self) -> None:
            calls.append(engine.stats.num_steps)
            super().check_invariants()

    config = EngineConfig(num_blocks=32, block_size=4, check_invariants=True)
    engine = Engine(config, index=Spy(make_index("hash_chain", 4)))
    engine.generate(_shared_prompts(), max_new_tokens=3)
    assert calls == list(range(1, engine.stats.num_steps + 1))
