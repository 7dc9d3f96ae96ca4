"""The differential test's driver: random operation sequences on one build of prefixkv,
every result printed (``tests/adapters/test_differential.py`` runs it on both builds).

``python tests/adapters/differential.py SEED STEPS`` prints the build it runs, then one line per
operation for each backend (the hash chain and the radix tree at block sizes 1 to 4,
each hash and eviction policy, pools of 6 to 24 blocks): the operation with its
arguments, its result or the error's class and message, and the manager's state after
it (free blocks, index statistics, every running request's table, computed tokens and
key, the totals). Operations are ``CacheManager``'s (admissions sharing prefixes, with
and without a lookup made earlier, commits, appends, advances, finishes, aborts,
evictions, resets), and a tenth of the calls give a checked argument an odd value
(``ODD``). Then the two engine classes replay a random trace as their engines' schedulers
do, with the KV events of every step printed. The output depends only on the seed:
compared line for line, it shows the first operation whose result differs.
"""

from __future__ import annotations

import dataclasses
import random
import re
import sys
from collections.abc import Callable
from typing import Any

from kv_event_drivers import SGLangDriver, VllmDriver, attach_recorder, run_k_live

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.adapters.vllm import KVCacheManager
from prefixkv.indexes import make_extra_key, make_index
from prefixkv.indexes.buildinfo import build_kind
from prefixkv.indexes.registry import pool_owned_options
from prefixkv.storage import BlockAllocator

BACKENDS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("hash_chain", 1, {"seed": 0}),
    ("hash_chain", 2, {"hash_algorithm": "sha256_cbor"}),
    ("hash_chain", 4, {"hash_algorithm": "xxhash", "verify": True}),
    ("radix", 1, {"eviction": "lru"}),
    ("radix", 2, {"eviction": "lfu"}),
    ("radix", 1, {"eviction": "priority"}),
    ("radix", 4, {"eviction": "fifo"}),
)
# Odd values for checked arguments: bools read as ints, negatives, ints past 64 bits,
# floats, strings, None, lists. Each is refused by name, or taken, alike on both builds.
ODD: tuple[object, ...] = (True, False, -1, 0, 2**63, 2**64 + 1, 1.0, "3", None, [1])
ADDRESS = re.compile(r" at 0x[0-9a-f]+")
BASES = 4  # shared prefixes a prompt starts from
NAMESPACES = (None, None, "tenant-a", make_extra_key(lora="a", cache_salt="s"))


def shown(value: object) -> str:
    """A result as printed: repr, with dataclasses as their fields and no addresses
    (an opaque handle's default repr has one)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"{type(value).__name__}{dataclasses.astuple(value)!r}"
    return ADDRESS.sub("", repr(value))


def state(m: CacheManager) -> str:
    """What every operation may change."""
    seqs = [
        (rid, m.block_table(rid), m.num_computed_tokens(rid), list(m.key(rid).tokens))
        for rid in m.running()
    ]
    return shown((m.allocator.free_block_ids(), shown(m.index.stats()), seqs, shown(m.totals)))


class Run:
    """One backend's random operations, printed as they happen."""

    def __init__(self, r: random.Random, name: str, block_size: int, options: dict[str, Any]):
        self.r = r
        self.num_blocks = r.randrange(6, 25)
        index = make_index(name, block_size, **options)
        self.m = CacheManager(index, BlockAllocator(self.num_blocks))
        self.bases = [[r.randrange(1, 50) for _ in range(r.randrange(1, 12))] for _ in range(BASES)]
        self.next_id = 0
        self.lookups: list[Any] = []

    def arg(self, usual: Callable[[], object]) -> object:
        """The usual value, or (one time in ten) an odd one."""
        return self.r.choice(ODD) if self.r.random() < 0.1 else usual()

    def prompt(self) -> list[int]:
        r = self.r
        base = r.choice(self.bases)
        return base[: r.randrange(len(base) + 1)] + [
            r.randrange(1, 50) for _ in range(r.randrange(1, 9))
        ]

    def running(self) -> str:
        live = self.m.running()
        return self.r.choice(live) if live and self.r.random() < 0.97 else "no-such-request"

    def step(self) -> str:
        r, m = self.r, self.m
        ops = ["admit", "lookup", "commit", "append", "advance", "finish", "abort", "evict",
               "evict_blocks", "common", "reset"]  # fmt: skip
        weights = [6, 2, 4, 4, 3, 3, 1, 1, 1, 1, 0.2] if m.running() else [1, 1] + [0.05] * 9
        op = r.choices(ops, weights)[0]
        rid = self.running()
        args: tuple[object, ...]
        call: Callable[[], object]
        if op == "admit":
            tokens = self.prompt()
            lookup = self.lookups.pop() if self.lookups and r.random() < 0.5 else None
            if lookup is not None:
                tokens = list(lookup.key.tokens)
            self.next_id += 1
            rid = f"r{self.next_id}"
            num = self.arg(lambda: r.randrange(1, len(tokens) + 1)) if r.random() < 0.3 else None
            reserve = self.arg(lambda: r.randrange(3)) if r.random() < 0.3 else 0
            extra = self.arg(lambda: r.choice(NAMESPACES))
            priority = r.choice([None, 0, 5]) if lookup is None else None
            args = (rid, tokens, extra, priority, num, reserve, lookup is not None)
            call = lambda: m.admit(  # noqa: E731
                rid, lookup.key if lookup else tokens, None if lookup else extra,
                priority=priority, num_tokens=num, reserve_blocks=reserve, lookup=lookup,
            )  # fmt: skip
        elif op == "lookup":
            key = m.make_key(self.prompt(), r.choice(NAMESPACES))
            self.lookups = [*self.lookups[-3:], m.match(key)]
            args, call = (list(key.tokens),), lambda: self.lookups[-1].match
        elif op == "commit":
            n = self.arg(lambda: r.randrange(len(m.key(rid)) + 2) if rid in m.running() else 1)
            args, call = (rid, n), lambda: m.commit(rid, n, swap_duplicates=r.random() < 0.7)
        elif op == "append":
            tokens = [self.arg(lambda: r.randrange(1, 50)) for _ in range(r.randrange(1, 4))]
            args, call = (rid, tokens), lambda: m.append(rid, tokens)
        elif op == "advance":
            have = len(m.key(rid)) if rid in m.running() else 4
            slots = self.arg(lambda: r.randrange(have + 3))
            computed = self.arg(lambda: r.randrange(have + 1)) if r.random() < 0.7 else None
            args, call = (rid, slots, computed), lambda: m.advance(rid, slots, computed)
        elif op in ("finish", "abort"):
            args, call = (rid,), (lambda: m.finish(rid)) if op == "finish" else lambda: m.abort(rid)
        elif op == "evict":
            n = self.arg(lambda: r.randrange(self.num_blocks + 1))
            args, call = (n,), lambda: m.evict(n)
        elif op == "evict_blocks":
            ids = [self.arg(lambda: r.randrange(self.num_blocks)) for _ in range(r.randrange(3))]
            args, call = (ids,), lambda: m.evict_blocks(ids)
        elif op == "common":
            args, call = (rid,), lambda: m.num_common_prefix_blocks(rid)
        else:
            args, call = (), m.reset
        try:
            result = shown(call())
        except Exception as exc:
            result = f"{type(exc).__name__}: {exc}"
        m.check_invariants()
        return f"{op}{args!r} -> {result} | {state(m)}"


def cache_state(cache: PrefixCache, live: list[Any]) -> str:
    """What every step of SGLang's prefix cache may change (live: the live requests)."""
    pool = cache.pool
    assert isinstance(pool, BlockAllocator)
    ps = cache.page_size
    rows = [
        (
            req.rid,
            dataclasses.astuple(req.kv),
            cache.rows.read(req.kv.req_pool_idx, 0, -(-req.kv.kv_allocated_len // ps)),
        )
        for req in live
    ]
    return shown((pool.free_block_ids(), shown(cache.index.stats()), rows, shown(cache.totals)))


def step_printer(
    cache: KVCacheManager | PrefixCache, driver: list[Any], out: list[str]
) -> Callable[[], None]:
    """Where the engine takes its events: the step's events and the state, as a line."""
    name, events = type(cache).__name__, attach_recorder(cache)

    def end_step() -> None:
        if isinstance(cache, PrefixCache):
            now = cache_state(cache, [req for req, _ in driver[0].live])
        else:
            now = state(cache.manager)
        out.append(f"{name} {events.take_events()!r} | {now}")

    return end_step


def engine_classes(r: random.Random) -> list[str]:
    """Both engine classes through a k-live schedule of one random trace, events per step."""
    bases = [[r.randrange(1, 50) for _ in range(r.randrange(4, 40))] for _ in range(BASES)]
    trace = [
        {
            "id": i,
            "tokens": r.choice(bases)[: r.randrange(41)] + [r.randrange(1, 50) for _ in range(3)],
            "output": [r.randrange(1, 50) for _ in range(r.randrange(1, 6))],
        }
        for i in range(40)
    ]
    out: list[str] = []
    chain = make_index("hash_chain", 4, seed=0, **pool_owned_options("hash_chain"))
    vllm = KVCacheManager(chain, 25, enable_kv_cache_events=True)  # 24 and vLLM's null block
    sglang = PrefixCache.create_simulated("radix", 48, 2, enable_kv_cache_events=True)
    for cache, kind in ((vllm, VllmDriver), (sglang, SGLangDriver)):
        holder: list[Any] = []  # the driver, for the printer to see its live requests
        driver = kind(cache, step_printer(cache, holder, out))  # type: ignore[arg-type]
        holder.append(driver)
        run_k_live(driver, trace, 3)
    return out


def main() -> None:
    seed, steps = int(sys.argv[1]), int(sys.argv[2])
    print(build_kind())
    for n, (name, block_size, options) in enumerate(BACKENDS):
        r = random.Random(seed * 100 + n)
        run = Run(r, name, block_size, options)
        print(f"{name} block_size={block_size} {options} num_blocks={run.num_blocks}")
        for i in range(steps):
            print(i, run.step())
    for line in engine_classes(random.Random(seed)):
        print(line)


if __name__ == "__main__":
    main()
