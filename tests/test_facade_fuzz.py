"""Fuzz both facades, over every backend: long random runs of valid and invalid calls.

Each step is a valid call in the engines' order (admit, decode, finish) or a misuse
(an unknown or finished request, a bad token, a wrong count, a double free); a misuse
must raise a named error (a ``PrefixKVError``) and change nothing. After every step
the pool is conserved and the index is consistent. Run longer with
``HYPOTHESIS_PROFILE=dev``.
"""

from __future__ import annotations

import os

from helpers import FacadeMachine, release_a_live_request
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule

from prefixkv.adapters.sglang import SGLangRadixCache, SimpleReq
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


class VLLMFacadeFuzz(FacadeMachine):
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


class SGLangFacadeFuzz(FacadeMachine):
    """SGLang's call order: alloc_for_extend, cache_unfinished_req, decode, finish."""

    @initialize(backend=BACKENDS, tokens=st.integers(8, 80))
    def setup(self, backend: tuple[str, int], tokens: int) -> None:
        name, bs = backend
        self.cache = SGLangRadixCache(make_index(name, block_size=bs), capacity_tokens=tokens)
        self.manager = self.cache.manager
        self.live = {}
        self.n = 0

    def release(self, req: SimpleReq) -> None:
        self.cache.cache_finished_req(req)

    finish = release_a_live_request

    @rule(prompt=TOKENS)
    def admit(self, prompt: list[int]) -> None:
        self.n += 1
        req = SimpleReq(f"r{self.n}", prompt)
        before = snapshot(self.cache.manager, exact=False)
        if self.cache.alloc_for_extend(req) is None:
            assert snapshot(self.cache.manager, exact=False) == before
            return
        req.output_ids.append(1)
        self.cache.cache_unfinished_req(req)
        self.live[req.rid] = req

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        req = self.draw_live(data)
        if self.cache.alloc_for_decode(req):
            req.output_ids.append(data.draw(st.integers(1, 4)))

    @rule(kind=st.sampled_from(["unknown", "twice", "no_token", "bad_tokens", "evict"]),
          bad=BAD_TOKENS)  # fmt: skip
    def misuse(self, kind: str, bad: list[object]) -> None:
        before = snapshot(self.cache.manager)
        try:
            if kind == "unknown":
                self.cache.cache_finished_req(SimpleReq("ghost", [1, 2]))
            elif kind == "twice" and self.live:
                self.cache.alloc_for_extend(next(iter(self.live.values())))
            elif kind == "no_token" and self.live:
                req = next(iter(self.live.values()))
                fake = SimpleReq(req.rid, req.origin_input_ids)  # no sampled token to feed
                self.cache.alloc_for_decode(fake)
            elif kind == "evict":
                self.cache.evict(-1)
            else:
                self.cache.alloc_for_extend(SimpleReq("bad", bad))  # type: ignore[arg-type]
        except PrefixKVError:
            pass
        else:
            if kind in ("twice", "no_token") and not self.live:
                return
            raise AssertionError(f"misuse {kind} was accepted")
        assert snapshot(self.cache.manager) == before


# Bounded in the ci profile; the dev profile's own example count applies otherwise.
RUN = (
    settings(max_examples=40, stateful_step_count=40)
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci"
    else settings(stateful_step_count=80)
)
TestVLLMFacadeFuzz = VLLMFacadeFuzz.TestCase
TestVLLMFacadeFuzz.settings = RUN
TestSGLangFacadeFuzz = SGLangFacadeFuzz.TestCase
TestSGLangFacadeFuzz.settings = RUN
