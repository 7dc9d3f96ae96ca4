"""Hypothesis state machines driving ``CacheManager`` over each caching backend.

Tiny block sizes (1, 2, 4) and tiny pools (4..24 blocks, sometimes a generous one) make
splits and eviction happen on most steps. Prompts come from a 4-token alphabet and are
built by cutting and extending earlier prompts, so sequences share prefixes at
unaligned positions. After every step: ``check_invariants()`` (which runs the index's
``check_invariants()``), block conservation, and a reference model of the content of
every registered block (no hit may ever return a block holding other tokens; without
eviction the hit must be exactly the model's).

The ``ci`` profile (default) keeps the whole file under a minute. Run longer with::

    HYPOTHESIS_PROFILE=dev .venv/bin/pytest tests/adapters/test_stateful.py

(the ``dev`` profile is random and multiplies the examples; steps per example stay as
set here). ``HYPOTHESIS_PROFILE=dev`` also honours ``--hypothesis-seed=N``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import common_prefix
from helpers import manager_state as snapshot
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from prefixkv.adapters.manager import CacheManager, Lookup
from prefixkv.indexes import (
    InvalidTokenError,
    PrefixKVError,
    RequestStateError,
    StaleHandleError,
    TokenKey,
    make_index,
)
from prefixkv.storage import BlockAllocator

ALPHABET = st.integers(0, 3)
NAMESPACES = st.sampled_from(
    [
        None,
        None,
        None,
        "tenant-a",
        (("lora", 1),),
        # Each its own namespace, though their fields concatenate alike or nearly so.
        "ab",
        (("extra", "a"), ("lora", "b")),
        (("lora", "ab"),),
        (("cache_salt", "ab"),),
        (("tenant", "ab"),),
        (("lora", "1"),),
        "",
        # Equal to None: an empty salt is no salt in both engines.
        (("cache_salt", ""),),
    ]
)
MAX_RUNNING = 6
HASH_ALGORITHMS = st.sampled_from(
    ["xxh3_128", "xxh3_128", "sha256_raw", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
)

# Bad prompts / appended tokens and a substring the error message must contain.
BAD_TOKENS: list[tuple[list[Any], str]] = [
    ([-1], "-1"),
    ([True], "True"),
    ([1.5], "1.5"),
    ([2**32], str(2**32)),
    ([None], "None"),
    ([0, 1, -7], "-7"),
    ([3, False], "False"),
    (["7"], "'7'"),
]
# How a prompt is drawn: cut an earlier sequence at ``cut`` and extend it by ``suffix``.
PROMPT: dict[str, st.SearchStrategy[Any]] = {
    "base": st.integers(0, 10**6),
    "cut": st.integers(0, 32),
    "suffix": st.lists(ALPHABET, max_size=8),
    "extra_key": NAMESPACES,
}
BAD_EXTRA_KEYS: list[Any] = [
    5,
    1.5,
    ["tenant"],
    (("lora", True),),
    (("lora",),),
    ((1, "x"),),
    "\ud800",  # a lone surrogate: no hash can encode it
    (("tenant", "\udfff"),),
    (("cache_salt", "a"), ("cache_salt", "b")),  # a kind twice
]

Content = tuple[Any, tuple[int, ...]]  # (namespace, every token up to the block's end)


def canonical_namespace(extra_key: Any) -> Any:
    return TokenKey([0], extra_key).extra_key


@dataclass
class Req:
    """The model of one request (kept after it finishes, as a registration record)."""

    rid: str
    ns: Any
    tokens: list[int]
    hit: int
    table: list[int]
    computed: int
    reg: int  # leading blocks the index holds for it (hit blocks included)
    running: bool = True

    def content(self, i: int, bs: int) -> Content:
        return (self.ns, tuple(self.tokens[: (i + 1) * bs]))


@dataclass
class Model:
    """Block contents and registrations, independent of how the index stores them."""

    bs: int
    content: dict[int, Content] = field(default_factory=dict)
    records: list[Req] = field(default_factory=list)
    # Blocks whose entries ``evict_blocks`` dropped while a request held them: still
    # held (and their content still valid for it) but never matchable again.
    unmatchable: set[int] = field(default_factory=set)
    dropped_any: bool = False

    def forget(self, bid: int) -> None:
        """The block went back to the pool or is being overwritten."""
        self.content.pop(bid, None)
        self.unmatchable.discard(bid)

    def matchable(self, bid: int, value: Content) -> bool:
        return self.content.get(bid) == value and bid not in self.unmatchable

    def register(self, req: Req, table: list[int], new_reg: int) -> None:
        for i in range(req.reg, new_reg):
            bid = table[i]
            value = req.content(i, self.bs)
            if bid in self.content:
                # A block may be registered twice only for the same content.
                assert self.content[bid] == value, (bid, self.content[bid], value)
            self.content[bid] = value
        req.reg = max(req.reg, new_reg)

    def intact(self, rec: Req, num_blocks: int) -> bool:
        return all(self.matchable(rec.table[i], rec.content(i, self.bs)) for i in range(num_blocks))

    def hit_bounds(self, prompt: list[int], ns: Any) -> tuple[int, int]:
        """(lowest, highest) correct hit: from registrations still intact / ever made."""
        bs = self.bs
        cap = len(prompt) - 1
        lo = hi = 0
        for rec in self.records:
            if rec.ns != ns or not rec.reg:
                continue
            n = min(common_prefix(prompt, rec.tokens[: rec.reg * bs]), cap)
            n -= n % bs
            hi = max(hi, n)
            if n > lo and self.intact(rec, n // bs):
                lo = n
        return lo, hi


class ManagerMachine(RuleBasedStateMachine):
    """Random request lifecycles through one ``CacheManager`` with a tiny pool."""

    backend = "hash_chain"
    max_len = 24

    def __init__(self) -> None:
        super().__init__()
        self.m: CacheManager | None = None
        self.model = Model(1)
        self.running: dict[str, Req] = {}
        self.finished: list[str] = []
        self.history: list[list[int]] = []
        self.next_id = 0
        # Lookups made earlier and admitted later, with anything in between (vLLM's
        # scheduler looks up, then allocates; a connector or another request may act
        # on the cache between the two): (lookup, prompt, namespace).
        self.lookups: list[tuple[Lookup, list[int], Any]] = []

    # ------------------------------------------------------------------ helpers

    @property
    def mgr(self) -> CacheManager:
        assert self.m is not None
        return self.m

    def blocks_for(self, n: int) -> int:
        return -(-n // self.model.bs)

    def make_prompt(self, base: int, cut: int, suffix: list[int]) -> list[int]:
        prompt = list(suffix)
        if self.history:
            prompt = self.history[base % len(self.history)][:cut] + prompt
        return prompt[: self.max_len] or [suffix[0] if suffix else 0]

    def expect_error(self, exc: type[PrefixKVError], fn: Any, *contains: str) -> None:
        before = snapshot(self.mgr)
        with pytest.raises(exc) as info:
            fn()
        assert isinstance(info.value, PrefixKVError)
        for text in contains:
            assert text in str(info.value), (text, str(info.value))
        assert snapshot(self.mgr) == before, "a rejected call changed the state"

    def pick(self, i: int) -> Req:
        return list(self.running.values())[i % len(self.running)]

    # -------------------------------------------------------------------- rules

    @initialize(
        bs=st.sampled_from((1, 2, 4)),
        pool=st.sampled_from((4, 5, 6, 8, 12, 16, 24, 1024)),
        hash_algorithm=HASH_ALGORITHMS,
    )
    def setup(self, bs: int, pool: int, hash_algorithm: str = "xxh3_128") -> None:
        # The hash chain under each of its hashes (vLLM's too, which key a namespace
        # by its fields): namespaces must stay apart in every one.
        options = {"hash_algorithm": hash_algorithm} if self.backend == "hash_chain" else {}
        index = make_index(self.backend, block_size=bs, **options)
        self.m = CacheManager(index, BlockAllocator(pool))
        self.model = Model(bs)

    @precondition(lambda self: len(self.running) < MAX_RUNNING)
    @rule(**PROMPT, reuse_id=st.booleans())
    def admit(self, base: int, cut: int, suffix: list[int], extra_key: Any, reuse_id: bool) -> None:
        self.do_admit(self.make_prompt(base, cut, suffix), extra_key, reuse_id)

    @rule(**PROMPT)
    def lookup(self, base: int, cut: int, suffix: list[int], extra_key: Any) -> None:
        """Look a prompt up now; ``admit_looked_up`` may use it many steps later."""
        prompt = self.make_prompt(base, cut, suffix)
        lookup = self.mgr.match(TokenKey(prompt, extra_key))
        self.lookups = [*self.lookups[-3:], (lookup, prompt, canonical_namespace(extra_key))]

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), suffix=st.lists(ALPHABET, min_size=1, max_size=12))
    def lookup_sharing_a_running_prefix(self, i: int, suffix: list[int]) -> None:
        """Look up a prompt that extends what a running request has registered, so the
        hit is blocks that request holds locked (the lookup sees none evictable)."""
        req = self.pick(i)
        prompt = req.tokens[: req.reg * self.model.bs] + suffix
        lookup = self.mgr.match(TokenKey(prompt, req.ns))
        self.lookups = [*self.lookups[-3:], (lookup, prompt, req.ns)]

    @precondition(lambda self: self.lookups)
    @rule(i=st.integers(0, 100))
    def evict_blocks_of_a_lookup(self, i: int) -> None:
        """An adversary drops exactly the entries a pending lookup names."""
        lookup = self.lookups[i % len(self.lookups)][0]
        self.evict_blocks_now(list(lookup.block_ids))

    @precondition(lambda self: self.lookups and self.running)
    @rule(i=st.integers(0, 100), abort=st.booleans())
    def finish_a_holder_of_a_lookup(self, i: int, abort: bool) -> None:
        """The request that held a pending lookup's blocks finishes: they turn evictable."""
        named = set(self.lookups[i % len(self.lookups)][0].block_ids)
        for req in list(self.running.values()):
            if named.intersection(req.table):
                self.do_finish(req, abort)
                return

    @precondition(lambda self: self.lookups and len(self.running) < MAX_RUNNING)
    @rule(i=st.integers(0, 100))
    def admit_looked_up(self, i: int) -> None:
        """Admit with an old lookup: valid now, stale (rejected) or not fitting."""
        lookup, prompt, ns = self.lookups.pop(i % len(self.lookups))
        self.sync()
        m = self.mgr
        rid = f"r{self.next_id}"
        self.next_id += 1
        before = snapshot(m)
        try:
            adm = m.admit(rid, lookup.key, lookup=lookup)
        except StaleHandleError:
            event("admit with lookup: stale")
            assert snapshot(m) == before, "a stale lookup changed the state"
            return
        if adm is None:
            event("admit with lookup: rejected")
            after = snapshot(m)
            assert after[:-1] == before[:-1], "a rejected admission changed the state"
            return
        event("admit with lookup: admitted")
        assert adm.hit_tokens == lookup.num_tokens
        assert adm.block_table[: len(lookup.block_ids)] == lookup.block_ids
        self.check_admission(rid, prompt, ns, adm.hit_tokens, adm.block_table, None)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.integers(0, 10**6))
    def commit(self, i: int, n: int) -> None:
        req = self.pick(i)
        self.do_commit(req, n % (self.commit_limit(req) + 1))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=ALPHABET)
    def append(self, i: int, token: int) -> None:
        self.do_append(self.pick(i), token)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), abort=st.booleans())
    def finish(self, i: int, abort: bool) -> None:
        self.do_finish(self.pick(i), abort)

    @rule(**PROMPT, output=st.lists(ALPHABET, max_size=4))
    def serve(
        self, base: int, cut: int, suffix: list[int], extra_key: Any, output: list[int]
    ) -> None:
        """A whole lifecycle in one step: prefill, decode ``output``, finish (VL-2)."""
        req = self.do_admit(self.make_prompt(base, cut, suffix), extra_key, False)
        if req is None:
            return
        self.do_commit(req, len(req.tokens))
        for token in output:
            if not self.do_append(req, token):
                break
            self.do_commit(req, len(req.tokens) - 1)  # the newest token has no KV yet
        self.do_finish(req, False)

    @rule(n=st.integers(0, 6))
    def evict(self, n: int) -> None:
        """The engine frees cache space on its own (``CacheManager.evict``)."""
        m = self.mgr
        s = m.index.stats()
        freed = m.evict(n)
        assert freed >= min(n, s.num_evictable_blocks), (freed, n, s)
        assert m.index.stats().num_locked_blocks == s.num_locked_blocks
        self.sync()

    @rule(picks=st.lists(st.integers(0, 10**6), max_size=3), ghost=st.integers(0, 64))
    def evict_blocks(self, picks: list[int], ghost: int) -> None:
        """KV-connector eviction of given blocks (HC-10): later lookups stop there."""
        m = self.mgr
        if not hasattr(m.index, "evict_blocks"):
            self.expect_error(PrefixKVError, lambda: m.evict_blocks([0]), type(m.index).__name__)
            return
        cached = sorted(self.model.content)
        ids = [cached[p % len(cached)] for p in picks] if cached else []
        ids.append(ghost % m.allocator.num_blocks)  # often free or private: ignored
        self.evict_blocks_now(ids)

    def evict_blocks_now(self, ids: list[int]) -> None:
        m = self.mgr
        if not hasattr(m.index, "evict_blocks"):
            return
        m.evict_blocks(ids)
        self.sync()
        for bid in ids:
            if bid in self.model.content:  # still held by a running request
                self.model.unmatchable.add(bid)
                self.model.dropped_any = True

    # ------------------------------------------------------------------ actions

    def commit_limit(self, req: Req) -> int:
        return min(len(req.tokens), len(req.table) * self.model.bs)

    def do_admit(self, prompt: list[int], extra_key: Any, reuse_id: bool) -> Req | None:
        self.sync()
        m = self.mgr
        ns = canonical_namespace(extra_key)
        reused = bool(reuse_id and self.finished)
        if reused:
            rid = self.finished.pop(0)  # ids are unique among running requests only
        else:
            rid = f"r{self.next_id}"
            self.next_id += 1
        lo, hi = self.model.hit_bounds(prompt, ns)
        evicted_before = m.index.stats().num_evicted_blocks
        if evicted_before == 0 and not self.model.dropped_any:
            assert lo == hi  # model self-check: nothing evicted, every record intact
        fits_free = self.blocks_for(len(prompt)) <= m.allocator.num_free_blocks
        before = snapshot(m)
        adm = m.admit(rid, prompt, extra_key)
        if m.index.stats().num_evicted_blocks > evicted_before:
            event("admit: evicted")
        if adm is None:
            event("admit: rejected")
            assert not fits_free, "rejected although the free blocks sufficed"
            assert rid not in m
            after = snapshot(m)
            assert after[0] == before[0] and after[3:-1] == before[3:-1]
            rejected = dataclasses.replace(m.totals, num_rejected=before[-1][3])
            assert dataclasses.astuple(rejected) == before[-1]
            assert after[1].num_locked_blocks == before[1].num_locked_blocks
            if reused:
                self.finished.insert(0, rid)
            return None
        hit, table = adm.hit_tokens, adm.block_table
        event("admit: hit" if hit else "admit: miss")
        if hit and lo == hi:
            event("admit: exact hit checked")
        if hit and lo < hi:
            event("admit: hit after eviction")
        assert lo <= hit, f"hit {hit} below {lo} for {prompt} ns={ns}"
        return self.check_admission(rid, prompt, ns, hit, table, hi)

    def check_admission(
        self, rid: str, prompt: list[int], ns: Any, hit: int, table: list[int], hi: int | None
    ) -> Req:
        """A hit names only blocks holding exactly the prompt's tokens, owned by nobody
        privately; the rest of the table is blocks nobody else holds."""
        bs = self.model.bs
        if hi is None:
            hi = self.model.hit_bounds(prompt, ns)[1]
        assert hit % bs == 0 and 0 <= hit <= len(prompt) - 1, (hit, len(prompt))
        assert hit <= hi, f"hit {hit} above {hi} for {prompt} ns={ns}"
        assert len(table) == self.blocks_for(len(prompt))
        assert len(set(table)) == len(table)
        for i, bid in enumerate(table[: hit // bs]):
            got = self.model.content.get(bid)
            want = (ns, tuple(prompt[: (i + 1) * bs]))
            assert got == want, f"wrong hit: block {bid} at {i} holds {got}, want {want}"
            assert bid not in self.model.unmatchable, f"hit on block {bid} after evict_blocks"
        others = {b for r in self.running.values() for b in r.table[r.reg :]}
        for bid in table[: hit // bs]:
            assert bid not in others, f"hit on block {bid} that another request holds"
        for bid in table[hit // bs :]:
            assert bid not in others, f"block {bid} handed out while another request holds it"
            self.model.forget(bid)  # the engine overwrites it now
        req = Req(rid, ns, list(prompt), hit, list(table), hit, hit // bs)
        self.running[rid] = req
        self.model.records.append(req)
        self.history.append(list(prompt))
        return req

    def do_commit(self, req: Req, n: int) -> None:
        self.mgr.commit(req.rid, n)
        req.computed = max(req.computed, n)
        table = self.mgr.block_table(req.rid)
        assert table[: req.reg] == req.table[: req.reg], "registered blocks moved"
        req.table = table
        self.model.register(req, table, n // self.model.bs)

    def do_append(self, req: Req, token: int) -> bool:
        self.sync()
        before = snapshot(self.mgr)
        if not self.mgr.append(req.rid, [token]):
            event("append: refused")
            assert snapshot(self.mgr) == before, "a refused append changed the state"
            return False
        req.tokens.append(token)
        table = self.mgr.block_table(req.rid)
        assert table[: len(req.table)] == req.table
        for bid in table[len(req.table) :]:
            self.model.forget(bid)
        req.table = table
        return True

    def do_finish(self, req: Req, abort: bool) -> None:
        del self.running[req.rid]
        req.running = False
        if abort:
            self.mgr.abort(req.rid)
        else:
            self.mgr.finish(req.rid)
            # finish registers what has KV; a duplicate it frees is dropped by sync().
            self.model.register(req, req.table, req.computed // self.model.bs)
        self.finished.append(req.rid)
        self.history.append(list(req.tokens))
        self.sync()

    def sync(self) -> None:
        """Forget the content of blocks back in the pool (evicted, or freed duplicates)."""
        if self.m is None:
            return
        for bid in [b for b in self.model.content if self.m.allocator.is_free(b)]:
            self.model.forget(bid)

    # ------------------------------------------------------------ invalid calls

    @rule(
        kind=st.sampled_from(
            [
                "unknown-finish",
                "unknown-abort",
                "unknown-commit",
                "unknown-append",
                "unknown-table",
                "admit-running-id",
                "admit-bad-tokens",
                "admit-empty",
                "admit-bad-extra-key",
                "append-bad-tokens",
                "commit-over",
                "commit-negative",
                "commit-bool",
                "commit-float",
            ]
        ),
        k=st.integers(),
        bad=st.sampled_from(BAD_TOKENS),
        extra_key=st.sampled_from(BAD_EXTRA_KEYS),
        prefix=st.lists(ALPHABET, max_size=3),
    )
    def invalid_call(
        self, kind: str, k: int, bad: tuple[list[Any], str], extra_key: Any, prefix: list[int]
    ) -> None:
        """A misuse must raise its named error, say the offending value, change nothing."""
        m = self.mgr
        tokens, text = bad
        if not self.running and not kind.startswith(("unknown", "admit-bad", "admit-empty")):
            kind = "unknown-finish"
        if kind.startswith("unknown"):
            pool = self.finished or ["ghost"]
            rid = pool[k % len(pool)] if k % 3 else f"ghost-{k}"  # finished ones: a double finish
            if rid in self.running:  # a finished id may have been admitted again
                return
            calls = {
                "unknown-finish": lambda: m.finish(rid),
                "unknown-abort": lambda: m.abort(rid),
                "unknown-commit": lambda: m.commit(rid, 0),
                "unknown-append": lambda: m.append(rid, [1]),
                "unknown-table": lambda: m.block_table(rid),
            }
            self.expect_error(RequestStateError, calls[kind], repr(rid))
        elif kind == "admit-bad-tokens":
            self.expect_error(InvalidTokenError, lambda: m.admit("bad", prefix + tokens), text)
        elif kind == "admit-empty":
            self.expect_error(InvalidTokenError, lambda: m.admit("empty", []), "empty")
        elif kind == "admit-bad-extra-key":
            self.expect_error(
                InvalidTokenError, lambda: m.admit("bad-ns", [1, 2], extra_key), repr(extra_key)
            )
        else:
            req = self.pick(k)
            if kind == "admit-running-id":
                self.expect_error(
                    RequestStateError, lambda: m.admit(req.rid, [1, 2, 3]), repr(req.rid)
                )
            elif kind == "append-bad-tokens":
                self.expect_error(InvalidTokenError, lambda: m.append(req.rid, tokens), text)
            else:
                limit = min(len(req.tokens), len(req.table) * self.model.bs)
                n: Any = {
                    "commit-over": limit + 1 + k % 5,
                    "commit-negative": -1 - k % 5,
                    "commit-bool": True,
                    "commit-float": 1.0,
                }[kind]
                self.expect_error(PrefixKVError, lambda: m.commit(req.rid, n), repr(n))

    # --------------------------------------------------------------- invariants

    @invariant()
    def integrity(self) -> None:
        if self.m is None:
            return
        m, bs = self.m, self.model.bs
        m.check_invariants()
        s = m.index.stats()
        assert s.num_cached_blocks == s.num_evictable_blocks + s.num_locked_blocks
        self.sync()
        content = self.model.content
        assert set(m.running()) == set(self.running)
        for req in self.running.values():
            assert m.block_table(req.rid) == req.table
            for i in range(req.reg):
                bid = req.table[i]
                # A locked block is never evicted or overwritten (BB-5).
                assert content.get(bid) == req.content(i, bs), (req.rid, i, bid)
        if not self.running:
            assert m.num_held_only_blocks() == 0
            assert s.num_locked_blocks == 0
            assert m.allocator.num_free_blocks + s.num_cached_blocks == m.allocator.num_blocks

    def teardown(self) -> None:
        if self.m is None:
            return
        m = self.m
        for rid in list(self.running):
            m.finish(rid)
            m.check_invariants()
        self.running.clear()
        s = m.index.stats()
        assert m.num_held_only_blocks() == 0 and s.num_locked_blocks == 0
        assert m.allocator.num_free_blocks + s.num_cached_blocks == m.allocator.num_blocks
        m.reset()
        m.check_invariants()
        assert m.allocator.num_free_blocks == m.allocator.num_blocks
        assert m.index.stats().num_cached_blocks == 0


# Examples come from the loaded profile (ci: 60, dev: 1000); only the run length is set here.
STEPS = settings(settings.default, stateful_step_count=100)


def per_backend(machine: type[ManagerMachine]) -> tuple[Any, Any]:
    """``machine``'s test cases on the hash chain and on the radix tree, ``STEPS`` long
    (the machines named ``HashChain<name>`` and ``Radix<name>``, ``Manager`` dropped)."""
    stem = machine.__name__.removeprefix("Manager")
    cases = []
    for prefix, backend in (("HashChain", "hash_chain"), ("Radix", "radix")):
        case = type(prefix + stem, (machine,), {"backend": backend}).TestCase
        case.settings = STEPS
        cases.append(case)
    return cases[0], cases[1]


TestHashChainManager, TestRadixManager = per_backend(ManagerMachine)


class StaleLookupMachine(ManagerMachine):
    """The same model, driven only by the moves that make a lookup stale between it and
    its admission: requests that hold a prefix, lookups extending it, the holder
    finishing, its blocks evicted or dropped by ``evict_blocks``; in pools of 4-8
    blocks, so an admission with an old lookup is often one block short.

    Overriding a rule with a plain method takes it out of this machine.
    """

    @initialize(bs=st.sampled_from((1, 2, 4)), pool=st.integers(4, 8))
    def setup(self, bs: int, pool: int) -> None:
        super().setup(bs, pool)

    @precondition(lambda self: len(self.running) < MAX_RUNNING)
    @rule(**PROMPT)
    def hold(self, base: int, cut: int, suffix: list[int], extra_key: Any) -> None:
        """Admit a prompt and register it; the request stays running, holding it."""
        req = self.do_admit(self.make_prompt(base, cut, suffix)[:12], extra_key, False)
        if req is not None:
            self.do_commit(req, len(req.tokens))

    def admit(self, *args: Any, **kwargs: Any) -> None:  # not a rule here
        raise AssertionError

    append = commit = serve = evict_blocks = invalid_call = lookup = admit


TestHashChainStaleLookups, TestRadixStaleLookups = per_backend(StaleLookupMachine)


class DifferentialMachine(RuleBasedStateMachine):
    """One operation sequence on hash_chain(b) and radix(b), a pool too big to evict:
    every admission must get the same hit from both (and the same table length)."""

    max_len = 64

    def __init__(self) -> None:
        super().__init__()
        self.ms: list[CacheManager] = []
        self.bs = 1
        self.running: dict[str, list[int]] = {}
        self.history: list[list[int]] = []
        self.next_id = 0

    @initialize(bs=st.sampled_from((1, 2, 4, 16)))
    def setup(self, bs: int) -> None:
        self.bs = bs
        self.ms = [
            CacheManager(make_index(name, block_size=bs), BlockAllocator(8192))
            for name in ("hash_chain", "radix")
        ]

    def pick(self, i: int) -> str:
        return list(self.running)[i % len(self.running)]

    PROMPT = st.fixed_dictionaries(
        {
            "base": st.integers(0, 10**6),
            "cut": st.integers(0, 64),
            "suffix": st.lists(ALPHABET, max_size=20),
            "extra_key": NAMESPACES,
        }
    )

    def do_admit(self, base: int, cut: int, suffix: list[int], extra_key: Any) -> str:
        prompt = list(suffix)
        if self.history:
            prompt = self.history[base % len(self.history)][:cut] + prompt
        prompt = prompt[: self.max_len] or [0]
        rid = f"r{self.next_id}"
        self.next_id += 1
        adms = [m.admit(rid, prompt, extra_key) for m in self.ms]
        assert adms[0] is not None and adms[1] is not None
        hits = [a.hit_tokens for a in adms]
        assert hits[0] == hits[1], f"hash_chain hit {hits[0]} != radix hit {hits[1]}"
        event("differential: hit" if hits[0] else "differential: miss")
        assert len(adms[0].block_table) == len(adms[1].block_table)
        self.running[rid] = prompt
        self.history.append(list(prompt))
        return rid

    @precondition(lambda self: len(self.running) < MAX_RUNNING)
    @rule(prompt=PROMPT)
    def admit(self, prompt: dict[str, Any]) -> None:
        self.do_admit(**prompt)

    @rule(prompt=PROMPT, output=st.lists(ALPHABET, max_size=6))
    def serve(self, prompt: dict[str, Any], output: list[int]) -> None:
        """Prefill, decode ``output`` one token a step, finish: on both managers."""
        rid = self.do_admit(**prompt)
        for m in self.ms:
            m.commit(rid, len(m.key(rid)))
            for token in output:
                assert m.append(rid, [token])
                m.commit(rid, len(m.key(rid)) - 1)
            m.finish(rid)
        self.history.append(self.running.pop(rid) + output)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), n=st.integers(0, 10**6))
    def commit(self, i: int, n: int) -> None:
        rid = self.pick(i)
        limits = [min(len(m.key(rid)), len(m.block_table(rid)) * self.bs) for m in self.ms]
        assert limits[0] == limits[1]
        for m in self.ms:
            m.commit(rid, n % (limits[0] + 1))

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100), token=ALPHABET)
    def append(self, i: int, token: int) -> None:
        rid = self.pick(i)
        assert all(m.append(rid, [token]) for m in self.ms)
        self.running[rid].append(token)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 100))
    def finish(self, i: int) -> None:
        rid = self.pick(i)
        for m in self.ms:
            m.finish(rid)
        self.history.append(self.running.pop(rid))

    @invariant()
    def integrity(self) -> None:
        for m in self.ms:
            m.check_invariants()
            assert m.index.stats().num_evicted_blocks == 0


TestDifferential = DifferentialMachine.TestCase
TestDifferential.settings = settings(settings.default, stateful_step_count=60)
