"""Lookups separated from their use by arbitrary other calls: the vLLM engine class and SGLang's
prefix cache.

vLLM's scheduler calls ``get_computed_blocks`` and then ``allocate_slots``; SGLang's tree
API hands out ``match_prefix``'s node, which the caller locks later with
``inc_lock_ref``. Between the two, anything may happen here: other admissions, decode
steps, frees, ``evict_blocks`` of exactly the looked-up blocks, evictions, resets. A
model of every block's content (the tokens whose K/V it holds, per the engine's
writes) checks that no hit ever names a block holding other tokens or one another
request is writing; a stale lookup must be refused with ``StaleHandleError`` and
change nothing. Conservation is checked after every step.
"""

from __future__ import annotations

from typing import Any

from helpers import CacheMachine, EngineClassMachine, cache_state, release_a_live_request
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from prefixkv.adapters.sglang import MatchResult, PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend
from prefixkv.adapters.vllm import KVCacheBlocks, KVCacheManager, SimpleRequest
from prefixkv.indexes import StaleHandleError, make_index

TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=14)
PICKS = st.lists(st.integers(0, 10**6), max_size=3)


def ids(blocks: KVCacheBlocks) -> list[int]:
    """The block ids of a one-group block list."""
    (group,) = blocks.get_block_ids()
    return group


def state(manager: Any) -> tuple[Any, ...]:
    """What a refused call must leave as it was."""
    return (
        tuple(manager.allocator.free_block_ids()),
        manager.index.stats(),
        tuple((r, tuple(manager.block_table(r))) for r in manager.running()),
        manager.num_held_only_blocks(),
    )


class Content:
    """Which tokens each block holds: the engine writes a block when its tokens get KV."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.of: dict[int, tuple[int, ...]] = {}

    def overwrite(self, block_ids: Any) -> None:
        for b in block_ids:
            self.of.pop(b, None)  # handed out anew: its old content is gone

    def write(self, table: list[int], tokens: list[int], num_computed: int) -> None:
        for j in range(num_computed // self.bs):
            self.of[table[j]] = tuple(tokens[: (j + 1) * self.bs])

    def check_hit(self, block_ids: Any, tokens: list[int], writing: set[int]) -> None:
        for j, b in enumerate(block_ids):
            want = tuple(tokens[: (j + 1) * self.bs])
            got = self.of.get(b)
            assert got == want, f"wrong hit: block {b} at {j} holds {got}, want {want}"
            assert b not in writing, f"hit on block {b} that another request is writing"


class VLLMLookups(EngineClassMachine):
    """get_computed_blocks ... anything ... allocate_slots, through the vLLM KVCacheManager."""

    @initialize(
        backend=st.sampled_from([("hash_chain", 1), ("hash_chain", 2), ("radix", 2)]),
        blocks=st.integers(6, 16),
    )
    def setup(self, backend: tuple[str, int], blocks: int) -> None:
        name, bs = backend
        self.kv = KVCacheManager(make_index(name, block_size=bs), num_blocks=blocks + 1)
        self.manager = self.kv.manager
        self.content = Content(bs)
        self.live = {}
        self.pending: list[tuple[SimpleRequest, KVCacheBlocks, int]] = []
        self.history: list[list[int]] = [[1, 2, 3, 1, 2, 3, 1, 2]]
        self.n = 0

    def release(self, req: SimpleRequest) -> None:
        self.kv.free(req)

    free = release_a_live_request

    def prompt(self, base: int, suffix: list[int]) -> list[int]:
        old = self.history[base % len(self.history)]
        return (old[: base % (len(old) + 1)] + suffix)[:14]

    def writing(self, but: str) -> set[int]:
        """Blocks live requests hold beyond what they have computed in whole blocks."""
        bs = self.content.bs
        out: set[int] = set()
        for rid, req in self.live.items():
            if rid != but:
                out.update(self.kv.get_block_ids(rid)[0][req.num_computed_tokens // bs :])
        return out

    def admit(self, req: SimpleRequest, blocks: KVCacheBlocks, hit: int) -> None:
        m = self.kv.manager
        before = state(m)
        try:
            new = self.kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)
        except StaleHandleError:
            event("vllm: stale lookup refused")
            assert state(m) == before, "a stale lookup changed the state"
            return
        if new is None:
            event("vllm: does not fit")
            return
        event("vllm: admitted with a hit" if hit else "vllm: admitted")
        table = self.kv.get_block_ids(req.request_id)[0]
        assert table[: len(ids(blocks))] == ids(blocks)
        self.content.check_hit(ids(blocks), req.all_token_ids, self.writing(req.request_id))
        self.content.overwrite(ids(new))
        req.num_computed_tokens = req.num_tokens
        self.content.write(table, req.all_token_ids, req.num_computed_tokens)
        req.append_output_token_ids(1)
        self.live[req.request_id] = req
        self.history.append(list(req.all_token_ids))

    def new_request(self, base: int, suffix: list[int]) -> SimpleRequest:
        self.n += 1
        return SimpleRequest(f"r{self.n}", self.prompt(base, suffix))

    @rule(base=st.integers(0, 10**6), suffix=TOKENS)
    def admit_now(self, base: int, suffix: list[int]) -> None:
        req = self.new_request(base, suffix)
        blocks, hit, _ = self.kv.get_computed_blocks(req)
        self.admit(req, blocks, hit)

    @rule(base=st.integers(0, 10**6), suffix=TOKENS)
    def lookup(self, base: int, suffix: list[int]) -> None:
        req = self.new_request(base, suffix)
        blocks, hit, _ = self.kv.get_computed_blocks(req)
        self.pending = [*self.pending[-3:], (req, blocks, hit)]

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 100))
    def allocate_looked_up(self, i: int) -> None:
        self.admit(*self.pending.pop(i % len(self.pending)))

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 100))
    def evict_blocks_of_a_lookup(self, i: int) -> None:
        if isinstance(self.kv.manager.index, type(make_index("hash_chain"))):
            self.kv.evict_blocks(ids(self.pending[i % len(self.pending)][1]))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        req = self.draw_live(data)
        new = self.kv.allocate_slots(req, 1)
        if new is not None:
            self.content.overwrite(ids(new))
            req.num_computed_tokens += 1
            table = self.kv.get_block_ids(req.request_id)[0]
            self.content.write(table, req.all_token_ids, req.num_computed_tokens)
            req.append_output_token_ids(data.draw(st.integers(1, 3)))

    @rule()
    def reset(self) -> None:
        self.kv.reset_prefix_cache()  # refused (False) while requests run


class SGLangLookups(CacheMachine):
    """match_prefix ... anything ... inc_lock_ref, on SGLang's prefix cache."""

    @initialize(
        backend=st.sampled_from([("radix", 1), ("radix", 2), ("hash_chain", 2)]),
        tokens=st.integers(8, 32),
    )
    def setup(self, backend: tuple[str, int], tokens: int) -> None:
        name, ps = backend
        self.cache = PrefixCache.create_simulated(make_index(name, block_size=ps), tokens)
        self.content = Content(ps)
        self.live = {}
        self.pending: list[tuple[list[int], MatchResult]] = []
        self.locked: list[MatchResult] = []
        self.history: list[list[int]] = [[1, 2, 3, 1, 2, 3, 1, 2]]
        self.n = 0

    finish = release_a_live_request

    def table(self, req: SimpleReq) -> list[int]:
        kv = req.kv
        assert kv.req_pool_idx is not None
        return self.cache.rows.read(kv.req_pool_idx, 0, -(-kv.kv_allocated_len // self.content.bs))

    def writing(self) -> set[int]:
        ps = self.content.bs
        out: set[int] = set()
        for req in self.live.values():
            out.update(self.table(req)[req.kv.kv_committed_len // ps :])
        return out

    @rule(base=st.integers(0, 10**6), suffix=TOKENS)
    def admit(self, base: int, suffix: list[int]) -> None:
        old = self.history[base % len(self.history)]
        self.n += 1
        req = SimpleReq(f"r{self.n}", (old[: base % (len(old) + 1)] + suffix)[:14])
        hit = alloc_for_extend(self.cache, req)
        if hit is None:
            return
        table = self.table(req)
        ps = self.content.bs
        prompt = list(req.origin_input_ids)
        self.content.check_hit(table[: hit // ps], prompt, self.writing())
        self.content.overwrite(table[hit // ps :])
        req.output_ids.append(1)
        self.cache.cache_unfinished_req(req)
        self.content.write(self.table(req), prompt, len(prompt))
        self.live[req.rid] = req
        self.history.append(prompt)

    @rule(base=st.integers(0, 10**6), suffix=TOKENS)
    def lookup(self, base: int, suffix: list[int]) -> None:
        old = self.history[base % len(self.history)]
        tokens = (old[: base % (len(old) + 1)] + suffix)[:14]
        self.pending = [*self.pending[-3:], (tokens, self.cache.match_prefix(tokens))]

    @precondition(lambda self: self.pending)
    @rule(i=st.integers(0, 100))
    def lock_looked_up(self, i: int) -> None:
        tokens, match = self.pending.pop(i % len(self.pending))
        before = cache_state(self.cache, self.running())
        try:
            self.cache.inc_lock_ref(match.last_node)
        except StaleHandleError:
            event("sglang: stale node refused")
            assert cache_state(self.cache, self.running()) == before, "a stale node changed it"
            return
        event("sglang: locked a looked-up node")
        self.content.check_hit(match.device_indices, tokens, self.writing())
        self.locked.append(match)

    @precondition(lambda self: self.locked)
    @rule(i=st.integers(0, 100))
    def unlock(self, i: int) -> None:
        self.cache.dec_lock_ref(self.locked.pop(i % len(self.locked)).last_node)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        req = self.draw_live(data)
        before = len(self.table(req))
        if alloc_for_decode(self.cache, req):
            self.content.overwrite(self.table(req)[before:])
            fed = list(req.origin_input_ids) + req.output_ids
            self.content.write(self.table(req), fed, req.kv.kv_committed_len)
            req.output_ids.append(data.draw(st.integers(1, 3)))

    @rule(n=st.integers(0, 8))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @precondition(lambda self: not self.live and not self.locked)
    @rule()
    def reset(self) -> None:
        self.cache.reset()

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            for match in self.locked:
                self.cache.dec_lock_ref(match.last_node)
        super().teardown()


STEPS = settings(settings.default, stateful_step_count=60)
TestVLLMLookups = VLLMLookups.TestCase
TestVLLMLookups.settings = STEPS
TestSGLangLookups = SGLangLookups.TestCase
TestSGLangLookups.settings = STEPS
