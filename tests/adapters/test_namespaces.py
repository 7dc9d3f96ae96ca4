"""No request is ever served KV another namespace or another request computed.

State machines drive the vLLM ``KVCacheManager`` and SGLang's ``PrefixCache`` with random
namespaces: cache salts, LoRA adapters, SGLang ``extra_key`` values chosen so that they
concatenate to each other (``"a"`` + LoRA ``"b"`` is ``"ab"``; ``""`` + ``"x"`` is
``"x"``), and request ids that come back, as other requests, after a refusal (no room,
or an argument refused by name), a finish or an abort. A content model records what
every block holds (the namespace as the engine defines it, and the tokens up to the
block's end) as requests compute it; every hit must name blocks holding exactly the
looking-up request's own namespace and tokens. Bad namespaces (lone surrogates) and bad
tokens on a reused id must raise a named error and change nothing.

Run longer with ``HYPOTHESIS_PROFILE=dev``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import cache_state, manager_state
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import PrefixCache, SimpleReq
from prefixkv.adapters.sglang.simulated import alloc_for_decode, alloc_for_extend, retract
from prefixkv.adapters.vllm import KVCacheManager, SimpleRequest
from prefixkv.indexes import (
    HashChainIndex,
    InvalidTokenError,
    PrefixKVError,
    RadixIndex,
    TokenKey,
    make_index,
)
from prefixkv.indexes.tokens import make_extra_key
from prefixkv.storage import BlockAllocator

SURROGATE = "\ud800"
IDS = ("r0", "r1", "r2")  # few ids, so they come back often
ALPHABET = st.integers(1, 3)
BASES = ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 1, 1, 3, 3, 2, 2, 1, 3, 1, 2])
# Prefixes of two fixed prompts, extended a little: requests in different namespaces
# share tokens most of the time, so a namespace that leaks is a hit, and wrong.
PROMPTS = st.builds(
    lambda base, cut, suffix: (base[:cut] + suffix) or [1],
    st.sampled_from(BASES),
    st.integers(0, 12),
    st.lists(ALPHABET, max_size=3),
)
BAD_TOKENS = st.sampled_from([[-1], [True], [1.5], [2**32], [None]])
HASH_CHAINS = ("xxh3_128", "sha256_raw", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

Content = tuple[Any, tuple[int, ...]]  # (the engine's namespace, every token to the block's end)


class Contents:
    """What each block (page) holds: written by the request that computes it."""

    def __init__(self, bs: int) -> None:
        self.bs = bs
        self.by_block: dict[int, Content] = {}

    def overwrite(self, block_ids: list[int]) -> None:
        """These blocks were handed out: their old content is gone."""
        for b in block_ids:
            self.by_block.pop(b, None)

    def write(self, label: Any, tokens: list[int], table: list[int], num_computed: int) -> None:
        """The full blocks of the first ``num_computed`` tokens hold the request's KV."""
        for j in range(num_computed // self.bs):
            self.by_block[table[j]] = (label, tuple(tokens[: (j + 1) * self.bs]))

    def check_hit(self, label: Any, tokens: list[int], hit_blocks: list[int]) -> None:
        """Every hit block holds the request's own namespace and tokens."""
        for j, b in enumerate(hit_blocks):
            want = (label, tuple(tokens[: (j + 1) * self.bs]))
            got = self.by_block.get(b)
            assert got == want, f"wrong hit: block {b} at {j} holds {got}, the request {want}"
        event("hit" if hit_blocks else "miss")


# ------------------------------------------------------------------------ vLLM


@dataclass(frozen=True)
class LoRA:
    """vLLM's ``LoRARequest`` fields that select a namespace."""

    lora_name: str
    lora_path: str
    lora_int_id: int


SALTS = st.sampled_from([None, "", "a", "b", "ab"])
LORAS = st.sampled_from(
    [None, None, LoRA("a", "/a", 1), LoRA("a", "/a", 2), LoRA("b", "/b", 3), LoRA("ab", "/a", 4)]
)


def vllm_request(rid: str, prompt: list[Any], salt: Any, lora: LoRA | None) -> SimpleRequest:
    req = SimpleRequest(rid, list(prompt), cache_salt=salt)
    req.lora_request = lora  # type: ignore[attr-defined]
    return req


def vllm_label(req: SimpleRequest) -> Any:
    # vLLM's rule: an empty salt is none; a LoRA is its name and path (the int id is
    # not hashed, so vLLM shares across it; prefixkv may be stricter, never looser).
    lora = getattr(req, "lora_request", None)
    return (req.cache_salt or None, None if lora is None else (lora.lora_name, lora.lora_path))


VLLM_INDEXES = st.sampled_from(
    [
        *(("hash_chain", 2, algo) for algo in HASH_CHAINS),
        ("hash_chain", 1, None),
        ("radix", 2, None),
    ]
)


class VllmIdentityMachine(RuleBasedStateMachine):
    """vLLM's scheduler calls on a tiny pool: lookups, admissions that do not fit or are
    refused by name, decode steps, finishes and aborts, with ids that come back."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, SimpleRequest] = {}
        self.waiting: dict[str, SimpleRequest] = {}

    @initialize(index=VLLM_INDEXES, blocks=st.integers(4, 16))
    def setup(self, index: tuple[str, int, str | None], blocks: int) -> None:
        name, bs, algo = index
        options = {} if algo is None else {"hash_algorithm": algo, "seed": 1}
        self.kv = KVCacheManager(make_index(name, block_size=bs, **options), num_blocks=blocks)
        self.contents = Contents(bs)

    def state(self) -> tuple[Any, ...]:
        return manager_state(self.kv.manager)

    def try_admit(self, req: SimpleRequest) -> None:
        kv, rid = self.kv, req.request_id
        blocks, hit, _ = kv.get_computed_blocks(req)
        (hit_ids,) = blocks.get_block_ids()
        self.contents.check_hit(vllm_label(req), req.all_token_ids, hit_ids)
        if kv.allocate_slots(req, req.num_tokens - hit, hit, blocks) is None:
            event("vllm: no room")
            self.waiting[rid] = req
            return
        self.waiting.pop(rid, None)
        (table,) = kv.get_block_ids(rid)
        self.contents.overwrite(table[len(hit_ids) :])
        req.num_computed_tokens = req.num_tokens
        self.contents.write(vllm_label(req), req.all_token_ids, table, req.num_tokens)
        req.append_output_token_ids(1)
        self.live[rid] = req

    @rule(i=st.integers(0, 2), prompt=PROMPTS, salt=SALTS, lora=LORAS)
    def arrive(self, i: int, prompt: list[int], salt: Any, lora: LoRA | None) -> None:
        """A new request, perhaps under the id of a waiting, finished or aborted one."""
        rid = IDS[i]
        if rid in self.live:
            return
        if rid in self.waiting:
            event("vllm: id of a waiting request comes back")
        self.try_admit(vllm_request(rid, prompt, salt, lora))

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 2))
    def retry(self, i: int) -> None:
        """A waiting request (the same one) is scheduled again."""
        self.try_admit(self.waiting[sorted(self.waiting)[i % len(self.waiting)]])

    @rule(i=st.integers(0, 2), prompt=PROMPTS, salt=SALTS, lora=LORAS)
    def refused_by_name(self, i: int, prompt: list[int], salt: Any, lora: LoRA | None) -> None:
        """A lookup, then an allocation refused with a named error: the request waits."""
        rid = IDS[i]
        if rid in self.live:
            return
        req = vllm_request(rid, prompt, salt, lora)
        blocks, hit, _ = self.kv.get_computed_blocks(req)
        self.contents.check_hit(vllm_label(req), req.all_token_ids, blocks.get_block_ids()[0])
        before = self.state()
        with pytest.raises(PrefixKVError):
            self.kv.allocate_slots(req, -1, hit, blocks)
        assert self.state() == before
        self.waiting[rid] = req

    @rule(i=st.integers(0, 2), prompt=PROMPTS, bad=BAD_TOKENS, salt=st.sampled_from([None, "x"]))
    def bad_tokens_under_a_used_id(
        self, i: int, prompt: list[int], bad: list[Any], salt: Any
    ) -> None:
        """Another request under a waiting or finished id, with a bad token: refused."""
        rid = IDS[i]
        if rid in self.live:
            return
        before = self.state()
        with pytest.raises(InvalidTokenError):
            self.kv.get_computed_blocks(vllm_request(rid, prompt + bad, salt, None))
        assert self.state() == before

    @rule(i=st.integers(0, 2), prompt=PROMPTS, field=st.sampled_from(["salt", "lora"]))
    def surrogate_namespace(self, i: int, prompt: list[int], field: str) -> None:
        rid = IDS[i]
        if rid in self.live:
            return
        if field == "salt":
            req = vllm_request(rid, prompt, SURROGATE, None)
        else:
            req = vllm_request(rid, prompt, None, LoRA(SURROGATE, "/s", 9))
        before = self.state()
        with pytest.raises(InvalidTokenError, match="surrogate"):
            self.kv.get_computed_blocks(req)
        assert self.state() == before

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 2), token=ALPHABET)
    def decode(self, i: int, token: int) -> None:
        req = self.live[sorted(self.live)[i % len(self.live)]]
        new = self.kv.allocate_slots(req, 1)
        if new is None:
            return
        self.contents.overwrite(new.get_block_ids()[0])
        req.num_computed_tokens += 1
        (table,) = self.kv.get_block_ids(req.request_id)
        self.contents.write(vllm_label(req), req.all_token_ids, table, req.num_computed_tokens)
        req.append_output_token_ids(token)

    @precondition(lambda self: self.live or self.waiting)
    @rule(i=st.integers(0, 5))
    def finish_or_abort(self, i: int) -> None:
        """A running request finishes or is preempted, or a waiting one is aborted."""
        reqs = [*self.live.values(), *self.waiting.values()]
        req = reqs[i % len(reqs)]
        self.kv.free(req)
        self.live.pop(req.request_id, None)
        self.waiting.pop(req.request_id, None)

    @invariant()
    def conserved(self) -> None:
        if hasattr(self, "kv"):
            self.kv.check_invariants()

    def teardown(self) -> None:
        if hasattr(self, "kv"):
            for req in [*self.live.values(), *self.waiting.values()]:
                self.kv.free(req)
            self.kv.check_invariants()
            assert self.kv.manager.index.stats().num_locked_blocks == 0


# ---------------------------------------------------------------------- SGLang

# (extra_key, lora_id) pairs whose SGLang concatenations coincide: "ab" four ways, "x"
# two ways, "" and None apart.
SG_NAMESPACES = st.sampled_from(
    [(None, None), ("", None), ("ab", None), ("a", "b"), ("", "ab"), (None, "ab"),
     ("x", None), (None, "x"), ("a", None)]
)  # fmt: skip


def sglang_label(extra_key: Any, lora_id: Any, salt: Any) -> Any:
    # The namespace as a typed triple: SGLang's (extra_key or "") + lora_id shares
    # between no extra key and "" under a LoRA; an empty salt is none.
    return (extra_key if lora_id is None else extra_key or "", lora_id, salt or None)


class SglangIdentityMachine(RuleBasedStateMachine):
    """SGLang's scheduler steps on a tiny pool: admissions (refused when the pool is
    short), checkpoints, decode steps, finishes and retractions, ids coming back."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[str, SimpleReq] = {}
        self.waiting: dict[str, SimpleReq] = {}
        self.labels: dict[int, Any] = {}  # id(req) -> its namespace label

    @initialize(index=st.sampled_from([("radix", 1), ("radix", 2), ("hash_chain", 2)]),
                tokens=st.integers(6, 30))  # fmt: skip
    def setup(self, index: tuple[str, int], tokens: int) -> None:
        name, ps = index
        self.cache = PrefixCache.create_simulated(make_index(name, block_size=ps), tokens)
        self.contents = Contents(ps)

    def tokens(self, req: SimpleReq) -> list[int]:
        return [*req.origin_input_ids, *req.output_ids]

    def pages(self, req: SimpleReq, n: int) -> list[int]:
        row = req.kv.req_pool_idx
        assert row is not None
        return self.cache.rows.read(row, 0, n)

    def try_admit(self, req: SimpleReq) -> None:
        ps = self.cache.page_size
        pool = self.cache.pool
        assert isinstance(pool, BlockAllocator)
        free_before = set(pool.free_block_ids())
        hit = alloc_for_extend(self.cache, req)
        if hit is None:
            event("sglang: no room")
            self.waiting[req.rid] = req
            return
        self.waiting.pop(req.rid, None)
        label = self.labels[id(req)]
        n = len(req.origin_input_ids)
        table = self.pages(req, -(-n // ps))
        self.contents.check_hit(label, self.tokens(req), table[: hit // ps])
        self.contents.overwrite([p for p in table if p in free_before])
        self.contents.overwrite(self.evicted_since(free_before))
        self.contents.write(label, self.tokens(req), table, n)
        req.output_ids.append(1)
        self.cache.cache_unfinished_req(req)
        self.live[req.rid] = req

    def evicted_since(self, free_before: set[int]) -> list[int]:
        # Pages evicted to the pool and not handed out: no longer anyone's content.
        pool = self.cache.pool
        assert isinstance(pool, BlockAllocator)
        return [p for p in pool.free_block_ids() if p not in free_before]

    @rule(
        i=st.integers(0, 2), prompt=PROMPTS, ns=SG_NAMESPACES, salt=st.sampled_from([None, "", "x"])
    )
    def arrive(self, i: int, prompt: list[int], ns: tuple[Any, Any], salt: Any) -> None:
        extra, lora = ns
        rid = IDS[i]
        if rid in self.live:
            return
        req = SimpleReq(rid, prompt, extra_key=extra, lora_id=lora, cache_salt=salt)
        self.labels[id(req)] = sglang_label(extra, lora, salt)
        self.try_admit(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 2))
    def retry(self, i: int) -> None:
        self.try_admit(self.waiting[sorted(self.waiting)[i % len(self.waiting)]])

    @rule(i=st.integers(0, 2), prompt=PROMPTS, bad=BAD_TOKENS)
    def bad_tokens_under_a_used_id(self, i: int, prompt: list[int], bad: list[Any]) -> None:
        rid = IDS[i]
        if rid in self.live:
            return
        before = cache_state(self.cache, list(self.live.values()))
        with pytest.raises(InvalidTokenError):
            alloc_for_extend(self.cache, SimpleReq(rid, prompt + bad))
        assert cache_state(self.cache, list(self.live.values())) == before

    @rule(prompt=PROMPTS, field=st.sampled_from(["extra_key", "lora_id", "cache_salt"]))
    def surrogate_namespace(self, prompt: list[int], field: str) -> None:
        before = cache_state(self.cache, list(self.live.values()))
        with pytest.raises(InvalidTokenError, match="surrogate"):
            alloc_for_extend(self.cache, SimpleReq("s", prompt, **{field: SURROGATE}))
        assert cache_state(self.cache, list(self.live.values())) == before

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 2), token=ALPHABET, checkpoint=st.booleans())
    def decode(self, i: int, token: int, checkpoint: bool) -> None:
        req = self.live[sorted(self.live)[i % len(self.live)]]
        ps = self.cache.page_size
        pool = self.cache.pool
        assert isinstance(pool, BlockAllocator)
        free_before = set(pool.free_block_ids())
        if not alloc_for_decode(self.cache, req):
            return
        n = req.kv.kv_committed_len
        table = self.pages(req, -(-n // ps))
        self.contents.overwrite([p for p in table if p in free_before])
        self.contents.overwrite(self.evicted_since(free_before))
        self.contents.write(self.labels[id(req)], self.tokens(req), table, n)
        req.output_ids.append(token)
        if checkpoint:
            self.cache.cache_unfinished_req(req)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 2), insert=st.booleans())
    def finish_or_retract(self, i: int, insert: bool) -> None:
        req = self.live.pop(sorted(self.live)[i % len(self.live)])
        pool = self.cache.pool
        assert isinstance(pool, BlockAllocator)
        free_before = set(pool.free_block_ids())
        if insert:
            self.cache.cache_finished_req(req)
        else:
            retract(self.cache, req)
        self.contents.overwrite(self.evicted_since(free_before))

    @invariant()
    def conserved(self) -> None:
        if hasattr(self, "cache"):
            self.cache.check_invariants(list(self.live.values()))

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            for req in list(self.live.values()):
                self.cache.cache_finished_req(req)
            self.cache.check_invariants([])
            assert self.cache.protected_size() == 0


RUN = (
    settings(max_examples=60, stateful_step_count=40)
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci"
    else settings(stateful_step_count=80)
)
TestVllmIdentity = VllmIdentityMachine.TestCase
TestVllmIdentity.settings = RUN
TestSglangIdentity = SglangIdentityMachine.TestCase
TestSglangIdentity.settings = RUN


# ------------------------------------------------------ the cases, one by one


def _sglang_second_hit(first: dict[str, Any], second: dict[str, Any], **options: Any) -> int:
    cache = PrefixCache.create_simulated("radix", 256, 1, **options)
    prompt = list(range(1, 17))
    hits = []
    for rid, fields in (("a", first), ("b", second)):
        req = SimpleReq(rid, prompt, **fields)
        hit = alloc_for_extend(cache, req)
        assert hit is not None
        hits.append(hit)
        req.output_ids.append(1)
        cache.cache_finished_req(req)
    return hits[1]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"extra_key": "ab"}, {"extra_key": "a", "lora_id": "b"}),
        ({"extra_key": "a", "lora_id": "b"}, {"extra_key": "ab"}),
        ({"extra_key": "x"}, {"lora_id": "x"}),
        ({"extra_key": "a", "lora_id": "bc"}, {"extra_key": "ab", "lora_id": "c"}),
        ({"extra_key": ""}, {}),
        ({"cache_salt": "s"}, {"extra_key": "s"}),
        ({"cache_salt": "s"}, {"lora_id": "s"}),
    ],
)
def test_sglang_namespaces_that_concatenate_alike_never_share(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    assert _sglang_second_hit(first, second) == 0


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"extra_key": "a", "lora_id": "b"}, {"extra_key": "a", "lora_id": "b"}),
        ({"lora_id": "b"}, {"extra_key": "", "lora_id": "b"}),  # SGLang: (None or "") + b
        ({"cache_salt": ""}, {}),
        ({"extra_key": "e", "cache_salt": "s"}, {"extra_key": "e", "cache_salt": "s"}),
    ],
)
def test_sglang_what_sglang_shares_still_shares(
    first: dict[str, Any], second: dict[str, Any]
) -> None:
    assert _sglang_second_hit(first, second) == 15


def test_sglang_fold_lora_keeps_sglangs_own_rule() -> None:
    """Inside SGLang (lookups carry no LoRA id) the plug-in keys by SGLang's string."""
    lora = {"extra_key": "a", "lora_id": "b"}
    assert _sglang_second_hit({"extra_key": "ab"}, lora, fold_lora=True) == 15
    assert _sglang_second_hit(lora, lora, fold_lora=True) == 15


def test_sglang_tree_api_takes_the_lora_as_a_field() -> None:
    cache = PrefixCache.create_simulated("radix", 64, 1)
    prompt = [1, 2, 3, 4]
    pages = cache.pool.allocate(4)
    assert pages is not None
    cache.insert(prompt, pages, "a", lora_id="b")
    assert cache.match_prefix(prompt, "ab").prefix_len == 0
    assert cache.match_prefix(prompt, "a").prefix_len == 0
    assert cache.match_prefix(prompt, "a", lora_id="b").prefix_len == 4


def test_vllm_a_refused_id_is_looked_up_as_the_request_in_hand() -> None:
    """The issue's case: a lookup, no room, the id back with another salt and prompt."""
    kv = KVCacheManager("hash_chain", num_blocks=6, block_size=2)
    done = SimpleRequest("w", [1, 2, 3, 4, 5], cache_salt="s1")
    kv.get_computed_blocks(done)
    kv.allocate_slots(done, 5)
    done.num_computed_tokens = 5
    kv.free(done)
    first = SimpleRequest("r", [1, 2, 3, 4, 5, *range(10, 40)], cache_salt="s1")
    blocks, hit, _ = kv.get_computed_blocks(first)
    assert hit == 4
    assert kv.allocate_slots(first, first.num_tokens - hit, hit, blocks) is None  # no room
    again = SimpleRequest("r", [1, 2, 3, 4, 5], cache_salt="s2")
    assert kv.get_computed_blocks(again)[1] == 0
    with pytest.raises(InvalidTokenError, match="-5"):
        kv.get_computed_blocks(SimpleRequest("r", [1, 2, -5]))
    # The first request's lookup is not the second's: its hit cannot be adopted.
    with pytest.raises(PrefixKVError, match="without a matching get_computed_blocks"):
        kv.allocate_slots(again, 1, 4, blocks)
    kv.check_invariants()


def test_vllm_multimodal_requests_are_refused() -> None:
    kv = KVCacheManager("hash_chain", num_blocks=8, block_size=2)
    req = SimpleRequest("m", [1, 2, 3])
    req.mm_features = ["image"]  # type: ignore[attr-defined]
    with pytest.raises(PrefixKVError, match="multimodal"):
        kv.get_computed_blocks(req)


# -------------------------------------------------- namespaces as typed fields


@pytest.mark.parametrize(
    "extra_key",
    [
        SURROGATE,
        (("tenant", SURROGATE),),
        ((SURROGATE, "x"),),
        (("cache_salt", "a"), ("cache_salt", "b")),
        (("lora", "a"), ("lora", "b")),
    ],
)
def test_a_namespace_that_cannot_be_one_is_refused_by_name(extra_key: Any) -> None:
    with pytest.raises(InvalidTokenError):
        TokenKey([1], extra_key)


def test_empty_salt_and_lora_path_are_no_field() -> None:
    assert make_extra_key(cache_salt="") is None
    assert make_extra_key(lora="x", lora_path="") == make_extra_key(lora="x")
    assert TokenKey([1], (("cache_salt", ""), ("tenant", "t"))).extra_key == (("tenant", "t"),)


@pytest.mark.parametrize("algo", HASH_CHAINS)
@pytest.mark.parametrize("field", ["cache_salt", "tenant", "extra", "lora"])
def test_a_surrogate_in_any_field_is_a_named_error_on_every_hash(algo: str, field: str) -> None:
    m = CacheManager(HashChainIndex(2, hash_algorithm=algo), BlockAllocator(16))
    before = manager_state(m)
    with pytest.raises(InvalidTokenError, match="surrogate"):
        m.admit("a", [1, 2, 3], make_extra_key(**{field: SURROGATE}))
    assert manager_state(m) == before


@pytest.mark.parametrize(
    ("build", "bad"),
    [
        (lambda b: HashChainIndex(4, hash_algorithm=b), b)
        for b in (5, 1.5, None, True, [1], b"sha256", object(), int, "nope")
    ]
    + [
        (lambda b: make_index("hash_chain", block_size=4, hash_algorithm=b), b)
        for b in (5, [1], bytes)
    ]
    + [(lambda b: KVCacheManager(HashChainIndex(4, hash_algorithm=b)), b) for b in (5, [1])]
    + [
        (lambda b: HashChainIndex(4, hash_algorithm="sha256_cbor", seed=b), SURROGATE),
        (lambda b: HashChainIndex(4, hash_algorithm=lambda data: b), "not bytes"),
        (lambda b: RadixIndex(1, eviction=b), 5),
    ],
)
def test_a_wrongly_typed_hash_algorithm_is_a_named_error(build: Any, bad: Any) -> None:
    with pytest.raises(PrefixKVError):
        build(bad)
