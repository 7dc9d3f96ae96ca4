"""Fuzz the vLLM engine class and SGLang's prefix cache, over every backend: long random runs
of valid and invalid calls.

Each step is a valid call in the engines' order (admit, decode, finish) or a misuse
(an unknown or finished request, a bad token, a wrong count, a double free); a misuse
must raise a named error (a ``PrefixKVError``) and change nothing. After every step
the pool is conserved and the index is consistent. Run longer with
``HYPOTHESIS_PROFILE=dev``.
"""

from __future__ import annotations

import dataclasses
import os

from helpers import CacheMachine, EngineClassMachine, cache_state, release_a_live_request
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import PrefixKVError, make_index

BACKENDS = st.sampled_from([("hash_chain", 1), ("hash_chain", 4), ("radix", 1), ("radix", 4)])
TOKENS = st.lists(st.integers(1, 4), min_size=1, max_size=14)
BAD_TOKENS = st.sampled_from([[-1], [True], [1.5], [2**32], []])


def snapshot(manager: object, *, exact: bool = True) -> tuple[object, ...]:
    """Pool, index and request state. ``exact=False`` leaves out the tree's node count:
    a lookup that does not fit still splits a node where its match ends, as SGLang's
    does (the admission check follows the match), which allocates nothing."""
    m = manager  # a CacheManager
    stats = m.index.stats()  # type: ignore[attr-defined]
    return (
        tuple(m.allocator.free_block_ids()),  # type: ignore[attr-defined]
        stats if exact else stats._replace(num_entries=0),
        tuple((r, tuple(m.block_table(r))) for r in m.running()),  # type: ignore[attr-defined]
    )


class VLLMEngineClassFuzz(EngineClassMachine):
    """vLLM's call order: get_computed_blocks + allocate_slots, allocate_slots(1), free."""

    @initialize(backend=BACKENDS, blocks=st.integers(6, 40))
    def setup(self, backend: tuple[str, int], blocks: int) -> None:
        name, bs = backend
        self.kv = KVCacheManager(make_index(name, block_size=bs), num_blocks=blocks + 1)
        self.manager = self.kv.manager
        self.live = {}
        self.done: list[SimpleRequest] = []
        self.n = 0

    def release(self, req: SimpleRequest) -> None:
        self.kv.free(req)

    free = release_a_live_request

    @rule(prompt=TOKENS)
    def admit(self, prompt: list[int]) -> None:
        self.n += 1
        req = SimpleRequest(f"r{self.n}", prompt)
        blocks, hit, _ = self.kv.get_computed_blocks(req)
        before = snapshot(self.kv.manager, exact=False)
        new = self.kv.allocate_slots(req, req.num_tokens - hit, hit, blocks)
        if new is None:
            assert snapshot(self.kv.manager, exact=False) == before
            return
        req.num_computed_tokens = req.num_tokens
        req.append_output_token_ids(1)
        self.live[req.request_id] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        req = self.draw_live(data)
        if self.kv.allocate_slots(req, 1) is not None:
            req.num_computed_tokens += 1
            req.append_output_token_ids(data.draw(st.integers(1, 4)))

    @rule(kind=st.sampled_from(["unknown", "negative", "connector", "computed"]),
          bad=BAD_TOKENS)  # fmt: skip
    def misuse(self, kind: str, bad: list[object]) -> None:
        before = snapshot(self.kv.manager)
        req = SimpleRequest("ghost", [1, 2, 3])
        try:
            if kind == "unknown":
                self.kv.allocate_slots(req, 1, 5)  # 5 computed tokens it never looked up
            elif kind == "negative":
                self.kv.allocate_slots(req, -1)
            elif kind == "connector":  # KV-connector tokens: refused, not modelled
                self.kv.allocate_slots(req, 1, num_external_computed_tokens=2)
            else:
                self.kv.get_computed_blocks(SimpleRequest("bad", bad))  # type: ignore[arg-type]
        except PrefixKVError:
            pass
        else:
            raise AssertionError(f"misuse {kind} was accepted")
        assert snapshot(self.kv.manager) == before


class SGLangCacheFuzz(CacheMachine):
    """SGLang's call order on its prefix cache: admission, checkpoint, decode, release."""

    @initialize(backend=BACKENDS, tokens=st.integers(8, 80))
    def setup(self, backend: tuple[str, int], tokens: int) -> None:
        name, bs = backend
        self.cache = PrefixCache.create_simulated(make_index(name, block_size=bs), tokens)
        self.live = {}
        self.n = 0

    finish = release_a_live_request

    def state(self, *, exact: bool = True) -> tuple[object, ...]:
        """``exact=False`` leaves out the tree's node count: a lookup that does not fit
        still splits a node where its match ends, as SGLang's does."""
        free, stats, rows, totals = cache_state(self.cache, self.running())
        return (free, stats if exact else stats._replace(num_entries=0), rows, totals)

    @rule(prompt=TOKENS)
    def admit(self, prompt: list[int]) -> None:
        self.n += 1
        req = SimpleReq(f"r{self.n}", prompt)
        before = self.state(exact=False)[:3]  # a refusal counts in the totals
        if alloc_for_extend(self.cache, req) is None:
            assert self.state(exact=False)[:3] == before
            return
        req.output_ids.append(1)
        self.cache.cache_unfinished_req(req)
        self.live[req.rid] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        req = self.draw_live(data)
        before = self.state()
        if alloc_for_decode(self.cache, req):
            req.output_ids.append(data.draw(st.integers(1, 4)))
            if data.draw(st.booleans()):
                self.cache.cache_unfinished_req(req)
        else:
            assert self.state() == before

    @rule(kind=st.sampled_from(["unknown", "twice", "no_token", "bad_tokens", "evict",
                                "checkpoint", "same_id"]),
          bad=BAD_TOKENS)  # fmt: skip
    def misuse(self, kind: str, bad: list[object]) -> None:
        before = self.state()
        live = next(iter(self.live.values()), None)
        try:
            if kind == "unknown":
                self.cache.cache_finished_req(SimpleReq("ghost", [1, 2]))
            elif kind == "twice" and live is not None:
                alloc_for_extend(self.cache, live)
            elif kind == "no_token" and live is not None:
                fake = SimpleReq(live.rid, live.origin_input_ids)  # its row, no token to feed
                fake.kv = dataclasses.replace(live.kv)
                alloc_for_decode(self.cache, fake)
            elif kind == "checkpoint" and live is not None:
                self.cache.checkpoint(live, up_to=live.kv.kv_allocated_len + 1)
            elif kind == "same_id" and live is not None:
                other = SimpleReq(live.rid, live.origin_input_ids)  # another request, same id
                other.kv = dataclasses.replace(live.kv)
                other.output_ids = list(live.output_ids)
                self.cache.cache_unfinished_req(other)
            elif kind == "evict":
                self.cache.evict(-1)
            else:
                alloc_for_extend(self.cache, SimpleReq("bad", bad))  # type: ignore[arg-type]
        except PrefixKVError:
            pass
        else:
            if kind in ("twice", "no_token", "checkpoint", "same_id") and live is None:
                return
            raise AssertionError(f"misuse {kind} was accepted")
        assert self.state() == before


# Bounded in the ci profile; the dev profile's own example count applies otherwise.
RUN = (
    settings(max_examples=40, stateful_step_count=40)
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci"
    else settings(stateful_step_count=80)
)
TestVLLMEngineClassFuzz = VLLMEngineClassFuzz.TestCase
TestVLLMEngineClassFuzz.settings = RUN
TestSGLangCacheFuzz = SGLangCacheFuzz.TestCase
TestSGLangCacheFuzz.settings = RUN
