"""prefixkv's vLLM ``KVCacheManager`` beyond the hit-for-hit replays: what vLLM's scheduler
and engine core read of it, its admission gates, the engine types it answers with, and
one namespace rule that hashes LoRA and salted requests as vLLM does.

Block ids are vLLM's: block 0 is the null block. ``PREFIXKV_VLLM_PYTHON`` (a python
with vLLM) also runs the comparison with vLLM's own ``KVCacheManager``
(``tests/engines/vllm/test_vllm_namespace.py``) in that interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import ROOT, TEST_DATA
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.events import BlockStored
from prefixkv.adapters.vllm import (
    PREFIXKV_TYPES,
    EngineTypes,
    KVCacheBlock,
    KVCacheBlocks,
    KVCacheManager,
    SimpleRequest,
)
from prefixkv.indexes import HashChainIndex, PrefixKVError, RequestStateError, make_index

GOLDEN = json.loads((TEST_DATA / "events" / "vllm_block_hashes.json").read_text())


def lora(name: str, int_id: int, path: str) -> SimpleNamespace:
    """vLLM's ``LoRARequest`` fields."""
    return SimpleNamespace(lora_name=name, lora_int_id=int_id, lora_path=path)


def request(rid: str, tokens: list[int], **fields: Any) -> SimpleRequest:
    req = SimpleRequest(rid, list(tokens))
    for name, value in fields.items():
        setattr(req, name, value)
    return req


def admit(kv: KVCacheManager, req: SimpleRequest, **kwargs: Any) -> Any:
    blocks, hit, _ = kv.get_computed_blocks(req)
    new = kv.allocate_slots(req, req.num_tokens - hit, hit, blocks, **kwargs)
    if new is not None:
        req.num_computed_tokens = req.num_tokens
    return new


# ------------------------------------------------------------- one namespace rule


@pytest.mark.parametrize(
    "case",
    [c for c in GOLDEN["cases"] if c["pythonhashseed"] is not None or "sha" in c["algorithm"]],
    ids=lambda c: f"{c['algorithm']}-seed{c['pythonhashseed']}",
)
def test_lora_and_salted_requests_hash_as_vllm(case: dict[str, Any]) -> None:
    # vLLM's own block hashes of LoRA and salted requests (recorded from vLLM 0.33),
    # through the manager's namespace rule, as the KV events publish them.
    bs = GOLDEN["block_size"]
    for i, rec in enumerate(case["requests"]):
        algo, seed = case["algorithm"], case["none_hash_seed"]
        index = make_index("hash_chain", block_size=bs, hash_algorithm=algo, seed=seed)
        kv = KVCacheManager(index, 64, enable_kv_cache_events=True)
        fields: dict[str, Any] = {"cache_salt": rec.get("cache_salt")}
        if "lora" in rec:
            spec = rec["lora"]
            fields["lora_request"] = lora(spec["name"], spec["id"], spec["path"])
        admit(kv, request(f"r{i}", rec["tokens"], **fields))
        (stored,) = kv.take_events()
        assert isinstance(stored, BlockStored)
        assert stored.block_hashes == rec["external"], (i, rec.get("lora"), rec.get("cache_salt"))
        if "lora" in rec:  # published: the name and the int id (not hashed by vLLM)
            assert (stored.lora_name, stored.lora_id) == (rec["lora"]["name"], rec["lora"]["id"])


def test_an_empty_salt_is_no_salt_as_in_vllm() -> None:
    # vLLM adds ("cache_salt", salt) only `if request.cache_salt`.
    kv = KVCacheManager("hash_chain", 64, 4)
    assert admit(kv, request("a", [1, 2, 3, 4, 5], cache_salt="")) is not None
    assert kv.get_computed_blocks(request("b", [1, 2, 3, 4, 6]))[1] == 4
    assert kv.get_computed_blocks(request("c", [1, 2, 3, 4, 6], cache_salt="s"))[1] == 0


def test_lora_adapters_and_paths_are_separate_namespaces() -> None:
    kv = KVCacheManager("hash_chain", 64, 4)
    sql = lora("sql", 1, "/adapters/sql")
    admit(kv, request("a", [1, 2, 3, 4, 5], lora_request=sql))
    probe = [1, 2, 3, 4, 6]
    assert kv.get_computed_blocks(request("b", probe, lora_request=sql))[1] == 4
    assert kv.get_computed_blocks(request("c", probe))[1] == 0
    assert kv.get_computed_blocks(request("d", probe, lora_request=lora("sql", 1, "/v2")))[1] == 0


# ----------------------------------------------------------- what vLLM reads of it


def test_block_zero_is_the_null_block_and_never_handed_out() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=4, block_size=2)  # 3 blocks hold KV
    assert admit(kv, request("a", [1, 2, 3, 4, 5, 6])) is not None
    assert kv.get_block_ids("a") == ([1, 2, 3],)
    assert admit(kv, request("b", [9, 9])) is None  # the null block is not free
    assert kv.usage == 1.0
    kv.check_invariants()
    with pytest.raises(PrefixKVError, match="num_blocks"):
        KVCacheManager("hash_chain", num_blocks=1)


def test_engine_core_reads_the_groups_block_size_and_spec() -> None:
    # EngineCore._initialize_effective_attention_block_size and get_kv_cache_group_metadata
    spec, config = object(), object()
    kv = KVCacheManager("radix", 8, 32, kv_cache_spec=spec, kv_cache_config=config)
    (group,) = kv.coordinator.single_type_managers
    assert (group.block_size, group.kv_cache_spec, group.kv_cache_group_id) == (32, spec, 0)
    assert kv.kv_cache_config is config and kv.num_kv_cache_groups == 1
    assert kv.coordinator.enable_partial_hash_hits is False
    assert kv.coordinator.num_reprefillable_tokens == 0
    assert kv.mamba_shared_prefix_checkpoint is False


def test_answers_with_the_injected_engine_types() -> None:
    made: list[tuple[int, bool]] = []

    class Block:
        def __init__(self, block_id: int, is_null: bool) -> None:
            made.append((block_id, is_null))
            self.block_id = block_id

    class Blocks:
        def __init__(self, blocks: tuple[list[Block], ...]) -> None:
            self.blocks = blocks

    class Stats:
        def __init__(self) -> None:
            self.calls: list[tuple[int, int, bool]] = []
            self.reset = False

        def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
            self.calls.append((num_tokens, num_hits, preempted))

    types = EngineTypes(Block, Blocks, Stats, lambda events: [type(e).__name__ for e in events])
    kv = KVCacheManager(
        "hash_chain", 8, 2, engine_types=types, log_stats=True, enable_kv_cache_events=True
    )
    assert made == [(0, True)] + [(i, False) for i in range(1, 8)]  # up front, as vLLM
    a = request("a", [1, 2, 3])
    new = admit(kv, a)
    assert type(new) is Blocks and [b.block_id for b in new.blocks[0]] == [1, 2]
    assert kv.get_blocks("a").blocks[0][0] is new.blocks[0][0]  # made once per id
    assert kv.take_events() == ["BlockStored"]
    kv.record_prefix_cache_stats(request("x", [1, 2, 3], num_preemptions=1), 2)
    stats = kv.make_prefix_cache_stats()
    assert type(stats) is Stats and stats.calls == [(3, 2, True)]
    assert type(kv.empty_kv_cache_blocks) is Blocks and kv.empty_kv_cache_blocks.blocks == ((),)
    assert PREFIXKV_TYPES.blocks is KVCacheBlocks and PREFIXKV_TYPES.block is KVCacheBlock


def test_block_objects_of_a_huge_pool_are_made_as_their_ids_are_handed_out() -> None:
    made: list[int] = []

    def block(block_id: int, is_null: bool) -> KVCacheBlock:
        made.append(block_id)
        return KVCacheBlock(block_id, is_null)

    types = PREFIXKV_TYPES._replace(block=block)
    kv = KVCacheManager("hash_chain", num_blocks=1 << 20, block_size=1, engine_types=types)
    assert len(made) == 1 << 16
    new = admit(kv, request("a", list(range(1, 70_001))))
    assert new.get_block_ids()[0][-1] == 70_000 and made[-1] >= 70_000
    assert len(made) < 1 << 18  # doubling, not the whole pool
    assert kv.get_blocks("a").blocks[0][-1] is new.blocks[0][-1]


def test_usage_counts_evictable_blocks_as_free_like_vllms_block_pool() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=9, block_size=4)  # 8 blocks hold KV
    a = request("a", [1, 2, 3, 4, 5])
    admit(kv, a)
    assert kv.usage == pytest.approx(2 / 8)
    kv.free(a)  # its full block stays cached, evictable: free in vLLM's terms
    assert kv.usage == 0.0


# -------------------------------------------------------------- admission gates


def test_watermark_is_kept_free_for_admissions_while_others_run() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=11, block_size=4, watermark=0.2)  # 2 blocks
    assert kv.watermark_blocks == 2
    a = request("a", list(range(1, 25)))  # 6 blocks
    assert admit(kv, a, has_scheduled_reqs=False) is not None  # no one else: no watermark
    b = request("b", list(range(100, 112)))  # 3 blocks; 4 free, 2 kept
    assert admit(kv, b) is None
    assert kv.manager.totals.num_rejected == 1 and kv.manager.running() == ["a"]
    assert admit(kv, request("c", list(range(200, 208)))) is not None  # 2 + 2 kept fits
    kv.check_invariants()


def test_full_sequence_must_fit_and_reserved_blocks() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=5, block_size=4)  # 4 blocks hold KV
    long = request("long", list(range(1, 21)))  # 5 blocks: never fits whole
    blocks, hit, _ = kv.get_computed_blocks(long)
    assert kv.allocate_slots(long, 8, hit, blocks, full_sequence_must_fit=True) is None
    assert kv.allocate_slots(long, 8, hit, blocks) is not None  # one chunk of 8 fits
    long.num_computed_tokens = 8
    assert kv.allocate_slots(long, 4, reserved_blocks=2) is None  # 2 free, 2 reserved
    assert kv.allocate_slots(long, 4, reserved_blocks=1) is not None
    assert not kv.manager.index.stats().num_evictable_blocks
    kv.check_invariants()


@given(
    warm=st.lists(st.lists(st.integers(1, 2), min_size=1, max_size=24), max_size=6),
    held=st.integers(0, 10),
    probe=st.lists(st.integers(1, 2), min_size=1, max_size=44),
    chunk=st.integers(1, 44),
    reserve=st.integers(0, 3),
    full=st.booleans(),
)
def test_an_admission_fits_exactly_when_free_plus_evictable_blocks_suffice(
    warm: list[list[int]], held: int, probe: list[int], chunk: int, reserve: int, full: bool
) -> None:
    # vLLM's gate: the blocks an admission needs (the whole sequence with
    # full_sequence_must_fit, this chunk plus reserved_blocks) against the free blocks
    # plus the evictable ones, less the hit's own evictable blocks (locking takes them).
    kv = KVCacheManager("hash_chain", num_blocks=12, block_size=4)  # 11 blocks hold KV
    for i, tokens in enumerate(warm):  # cached, then evictable once freed
        req = request(f"w{i}", tokens)
        if admit(kv, req) is not None:
            kv.free(req)
    if held:  # a running request holding blocks, so free blocks run short
        admit(kv, request("held", [9] * (4 * held)))
    req = request("probe", probe)
    blocks, hit, _ = kv.get_computed_blocks(req)
    index = kv.manager.index
    assert isinstance(index, HashChainIndex)
    hit_ids = blocks.get_block_ids()[0]
    available = (
        kv.manager.allocator.num_free_blocks
        + index.stats().num_evictable_blocks
        - sum(index.ref_cnt(b) == 0 for b in hit_ids)
    )
    num_new = min(chunk, len(probe) - hit)
    whole = -(-len(probe) // 4) - len(hit_ids)
    step = -(-(hit + num_new) // 4) - len(hit_ids) + reserve
    fits = (not full or whole <= available) and step <= available
    new = kv.allocate_slots(
        req, num_new, hit, blocks, full_sequence_must_fit=full, reserved_blocks=reserve
    )
    assert (new is not None) == fits, (available, whole, step)
    kv.check_invariants()


def test_slots_stop_at_max_model_len_and_lookahead_slots_are_given() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=32, block_size=4, max_model_len=10)
    a = request("a", [1, 2, 3, 4, 5, 6])
    blocks, hit, _ = kv.get_computed_blocks(a)
    new = kv.allocate_slots(a, 6, hit, blocks, num_lookahead_tokens=3)  # 9 slots
    assert len(new.get_block_ids()[0]) == 3
    a.num_computed_tokens = 6
    a.append_output_token_ids(7)
    assert kv.allocate_slots(a, 1, num_lookahead_tokens=8) is kv.empty_kv_cache_blocks  # 10 max
    assert len(kv.get_block_ids("a")[0]) == 3
    kv.free(a)
    kv.check_invariants()


def test_lookups_off_without_caching_and_for_requests_that_skip_the_cache() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=16, block_size=4)
    admit(kv, request("a", [1, 2, 3, 4, 5]))
    assert kv.get_computed_blocks(request("b", [1, 2, 3, 4, 5]))[1] == 4
    skipping = request("c", [1, 2, 3, 4, 5], skip_reading_prefix_cache=True)
    assert kv.get_computed_blocks(skipping) == (kv.empty_kv_cache_blocks, 0, 0)
    off = KVCacheManager("hash_chain", num_blocks=16, block_size=4, enable_caching=False)
    admit(off, request("a", [1, 2, 3, 4, 5]))
    assert off.get_computed_blocks(request("b", [1, 2, 3, 4, 5]))[1] == 0
    with pytest.raises(PrefixKVError, match="enable_caching=False"):
        KVCacheManager(HashChainIndex(4), 16, enable_caching=False)


# ------------------------------------------------------- async scheduling, free


def test_async_steps_register_at_cache_blocks_and_a_preempted_request_registers_nothing() -> None:
    # AsyncScheduler schedules a token before it is sampled: allocate_slots runs ahead of
    # num_tokens (registration stops there), cache_blocks registers once it is known,
    # and a request preempted meanwhile leaves no block vLLM would not have cached.
    kv = KVCacheManager("hash_chain", num_blocks=32, block_size=4)
    index = kv.manager.index
    a = request("a", [1, 2, 3, 4, 5, 6])
    admit(kv, a)
    a.append_output_token_ids(7)  # 7 tokens, 6 computed
    kv.allocate_slots(a, 2)  # token 7 and a placeholder: 8 slots
    a.num_computed_tokens = 8
    assert index.stats().num_cached_blocks == 1
    kv.free(a)  # preempted before token 8 is known: block 2 (tokens 5..8) never cached
    assert index.stats().num_cached_blocks == 1
    b = request("b", [1, 2, 3, 4, 5, 6])
    admit(kv, b)
    b.append_output_token_ids(7)
    kv.allocate_slots(b, 2)
    b.num_computed_tokens = 8
    b.append_output_token_ids(8)  # sampled: now cache_blocks registers tokens 5..8
    kv.cache_blocks(b, 8)
    assert index.stats().num_cached_blocks == 2
    assert kv.estimate_cached_tokens(b) == 8
    kv.free(b)
    kv.check_invariants()


def test_queries_on_a_request() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=16, block_size=4)
    a = request("a", list(range(1, 11)))
    admit(kv, a)
    assert kv.get_blocks("a").get_block_ids() == ([1, 2, 3],)
    assert kv.get_block_ids_for_computed_tokens("a", 5) == ([1, 2],)
    assert kv.estimate_cached_tokens(a) == 8
    blocks, hit, _ = kv.get_computed_blocks(request("b", list(range(1, 11)) + [0]))
    assert hit == 8 and kv.truncate_computed_blocks(blocks, 4).get_block_ids() == ([1],)
    assert kv.get_blocks("nobody") is kv.empty_kv_cache_blocks
    assert kv.get_block_ids("nobody") == ([],)
    assert kv.take_new_block_ids() == [] and kv.take_kv_cache_block_copies() == ([], [])


# ------------------------------------------------------------ with the real vLLM

VLLM_PYTHON = os.environ.get("PREFIXKV_VLLM_PYTHON")


@pytest.mark.skipif(not VLLM_PYTHON, reason="set PREFIXKV_VLLM_PYTHON to a python with vLLM")
def test_events_equal_vllms_own_manager_for_lora_and_salted_requests(tmp_path: Path) -> None:
    # This checkout's prefixkv, imported in vLLM's interpreter, whatever is installed there.
    site = tmp_path / "site" / "prefixkv"
    site.mkdir(parents=True)
    for part in ("indexes", "storage", "adapters"):
        (site / part).symlink_to(ROOT / part)
    assert VLLM_PYTHON is not None
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "PYTHONDONTWRITEBYTECODE": "1"}
    test = ROOT / "tests" / "engines" / "vllm" / "test_vllm_namespace.py"
    out = subprocess.run(
        [VLLM_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
         "--confcutdir", str(test.parent), str(test)],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert " passed" in out.stdout
    where = subprocess.run(
        [VLLM_PYTHON, "-c", "import prefixkv.adapters.vllm as m; print(m.__file__)"],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert where.startswith(str(tmp_path)), where


# ------------------------------------------------------------- the in-place decode step


def _state(kv: KVCacheManager, rids: list[str]) -> tuple[Any, ...]:
    index = kv.manager.index
    assert isinstance(index, HashChainIndex)
    return (
        [kv.get_block_ids(r) for r in rids],
        [kv.manager.num_computed_tokens(r) if r in kv.manager else None for r in rids],
        index.stats(),
        sorted(index.cached_block_hashes()),
        index.free_queue_block_ids(),
        kv.manager.allocator.free_block_ids(),
    )


@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    steps=st.lists(st.integers(0, 3), max_size=80),
    shared=st.integers(0, 24),
)
def test_a_decode_step_matches_advance_whether_or_not_it_adds_a_block(
    prompts: list[int], steps: list[int], shared: int
) -> None:
    """``allocate_slots(req, 1)`` takes ``step_in_place`` first; the state after every
    step equals the one ``CacheManager.advance`` alone leaves (the step it replaced),
    on a pool small enough to evict."""
    seed_tokens = list(range(100, 100 + shared))
    kvs = [KVCacheManager(make_index("hash_chain", block_size=4, seed=1), 40) for _ in range(2)]
    reqs: list[list[SimpleRequest]] = [[], []]
    for n, length in enumerate(prompts):
        for kv, mine in zip(kvs, reqs, strict=True):
            req = request(f"r{n}", (seed_tokens + [1000 * (n + 1) + i for i in range(length)]))
            if admit(kv, req) is not None:
                req.append_output_token_ids(7)
                mine.append(req)
    rids = [r.request_id for r in reqs[0]]
    assert rids == [r.request_id for r in reqs[1]]
    for k, pick in enumerate(steps):
        if not rids:
            break
        r = pick % len(rids)
        fast, slow = kvs[0], kvs[1]
        a, b = reqs[0][r], reqs[1][r]
        new_a = fast.allocate_slots(a, 1)
        total = b.num_computed_tokens + 1
        grown = slow.manager.advance(
            b.request_id, total, total, tokens=b.all_token_ids, swap_duplicates=False
        )
        assert (new_a is None) == (grown is None)
        if new_a is not None and grown is not None:
            assert new_a.get_block_ids() == (grown,)
            for req in (a, b):
                req.num_computed_tokens += 1
                req.append_output_token_ids(10 + k)
        assert _state(fast, rids) == _state(slow, rids)


def test_step_in_place_refuses_a_step_that_adds_or_registers_a_block() -> None:
    kv = KVCacheManager(make_index("hash_chain", block_size=4, seed=1), 16)
    req = request("r", [1, 2, 3, 4, 5, 6])
    admit(kv, req)
    mgr = kv.manager
    before = (mgr.num_computed_tokens("r"), mgr.block_table("r"), mgr.index.stats())
    assert not mgr.step_in_place("r", 9)  # a third block: not in place
    assert not mgr.step_in_place("r", 8)  # fills and registers block 1: not in place
    assert (mgr.num_computed_tokens("r"), mgr.block_table("r"), mgr.index.stats()) == before
    req.append_output_token_ids(7)
    assert mgr.step_in_place("r", 7)  # inside block 1, nothing to register
    # as advance: capped at the tokens the key holds (it learns them when a block fills)
    assert mgr.num_computed_tokens("r") == len(mgr.key("r")) == 6
    assert (mgr.block_table("r"), mgr.index.stats()) == before[1:]
    with pytest.raises(RequestStateError):
        mgr.step_in_place("nobody", 1)


def test_step_if_running_is_step_in_place_for_a_running_request_and_none_otherwise() -> None:
    """One lookup for the decode step: the running request's answer is
    ``step_in_place``'s; an unknown or unhashable id is ``None``, nothing changed."""
    kv = KVCacheManager(make_index("hash_chain", block_size=4, seed=1), 16)
    req = request("r", [1, 2, 3, 4, 5, 6])
    admit(kv, req)
    mgr = kv.manager
    before = (mgr.num_computed_tokens("r"), mgr.block_table("r"), mgr.index.stats())
    assert mgr.step_if_running("r", 9) is False  # a third block: not in place
    assert mgr.step_if_running("r", 8) is False  # fills and registers block 1
    for rid in ("nobody", ["unhashable"]):
        assert mgr.step_if_running(rid, 7) is None
    assert (mgr.num_computed_tokens("r"), mgr.block_table("r"), mgr.index.stats()) == before
    req.append_output_token_ids(7)
    assert mgr.step_if_running("r", 7) is True
    assert mgr.num_computed_tokens("r") == 6
    # a request the class does not run yet takes the checked path: admitted
    assert kv.allocate_slots(request("waiting", [1, 2, 3]), 3) is not None
    assert "waiting" in mgr
    kv.check_invariants()


@pytest.mark.parametrize(
    "count", ["num_new_computed_tokens", "num_lookahead_tokens", "reserved_blocks"]
)
@pytest.mark.parametrize("value", [False, 0.0])
def test_a_running_requests_step_checks_its_zero_counts(count: str, value: object) -> None:
    """A decode step's counts other than the new tokens take the O(1) path only as the
    int 0; an equal bool or float gets the named error, the state unchanged."""
    kv = KVCacheManager(make_index("hash_chain", block_size=4, seed=1), 16)
    req = request("r", [1, 2, 3, 4, 5, 6])
    assert admit(kv, req) is not None
    req.append_output_token_ids(7)
    before = _state(kv, ["r"])
    with pytest.raises(PrefixKVError, match=count):
        kv.allocate_slots(req, 1, **{count: value})
    assert _state(kv, ["r"]) == before
