"""Small helpers shared by the test modules (plain Python, the tests' own oracles)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.requests import ReqLike
from prefixkv.adapters.sglang import PrefixCache
from prefixkv.storage import BlockAllocator

ROOT = Path(__file__).resolve().parents[1]
"""The repository (the tests live one folder per room under ``tests/``)."""

TEST_DATA = ROOT / "tests" / "data"
"""The recorded fixtures and traces the tests read."""

BACKENDS = ("none", "hash_chain", "radix")
"""The built-in index backends."""

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
"""Torch devices to run on (CUDA only where there is one)."""


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, one token at a time (a reference, not fast)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def manager_state(m: CacheManager, *, totals: bool = True) -> tuple[Any, ...]:
    """Everything a refused call must leave as it was: the pool, the index (and vLLM's
    free queue, where it has one), every running request's block table, computed tokens
    and key, the blocks only a request holds, and the totals (last; ``totals=False``
    leaves them out, for a rejected admission, which counts as one)."""
    queue = getattr(m.index, "free_queue_block_ids", None)
    state = (
        tuple(m.allocator.free_block_ids()),
        m.index.stats(),
        tuple(queue()) if queue is not None else None,
        tuple(m.running()),
        tuple(
            (rid, tuple(m.block_table(rid)), m.num_computed_tokens(rid), tuple(m.key(rid).tokens))
            for rid in m.running()
        ),
        m.num_held_only_blocks(),
    )
    return (*state, dataclasses.astuple(m.totals)) if totals else state


class EngineClassMachine(RuleBasedStateMachine):
    """What the engine class state machines share. ``setup`` sets ``manager`` (the engine class's
    ``CacheManager``) and ``live`` (running requests by id); ``release`` ends a request
    as the engine does (vLLM ``free``, SGLang ``cache_finished_req``).

    The manager's integrity is checked after every step; at the end every live request
    is released and no block may stay held or locked.
    """

    manager: CacheManager
    live: dict[str, Any]

    def release(self, req: Any) -> None:
        raise NotImplementedError

    def draw_live(self, data: st.DataObject) -> Any:
        """One of the live requests, drawn."""
        return self.live[data.draw(st.sampled_from(sorted(self.live)))]

    @invariant()
    def conserved(self) -> None:
        if hasattr(self, "manager"):
            self.manager.check_invariants()

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            for req in list(self.live.values()):
                self.release(req)
            m = self.manager
            m.check_invariants()
            assert m.num_held_only_blocks() == 0 and m.index.stats().num_locked_blocks == 0


def cache_state(cache: PrefixCache, running: Sequence[ReqLike] = ()) -> tuple[Any, ...]:
    """Everything a refused call on SGLang's prefix cache must leave as it was: the
    pool, the index, each running request's row and cache state, and the totals."""
    rows = []
    for req in running:
        kv = req.kv
        row = kv.req_pool_idx
        pages = (
            ()
            if row is None
            else tuple(cache.rows.read(row, 0, -(-kv.kv_allocated_len // cache.page_size)))
        )
        rows.append((req.rid, pages, dataclasses.astuple(kv), id(req.last_node), id(req.lock)))  # type: ignore[call-overload]
    pool = cache.pool
    assert isinstance(pool, BlockAllocator)
    return (
        tuple(pool.free_block_ids()),
        cache.index.stats(),
        tuple(rows),
        dataclasses.astuple(cache.totals),
    )


class CacheMachine(RuleBasedStateMachine):
    """What the machines over SGLang's prefix cache share. ``setup`` sets ``cache`` and
    ``live`` (running requests by id); ``release`` ends a request as SGLang does
    (``cache_finished_req``).

    Conservation (with every running request) is checked after every step; at the
    end every live request is released and no page may stay held or locked.
    """

    cache: PrefixCache
    live: dict[str, Any]

    def release(self, req: Any) -> None:
        self.cache.cache_finished_req(req)

    def running(self) -> list[Any]:
        """The requests that hold rows."""
        return list(self.live.values())

    def draw_live(self, data: st.DataObject) -> Any:
        """One of the live requests, drawn."""
        return self.live[data.draw(st.sampled_from(sorted(self.live)))]

    @invariant()
    def conserved(self) -> None:
        if hasattr(self, "cache"):
            self.cache.check_invariants(self.running())

    def teardown(self) -> None:
        if hasattr(self, "cache"):
            for req in list(self.live.values()):
                self.release(req)
            self.live.clear()
            self.cache.check_invariants(self.running())
            assert self.cache.protected_size() == 0


@precondition(lambda self: self.live)
@rule(data=st.data())
def release_a_live_request(self: EngineClassMachine | CacheMachine, data: st.DataObject) -> None:
    """A rule for a :class:`EngineClassMachine` (under the engine's name for it): a drawn
    live request finishes."""
    rid = data.draw(st.sampled_from(sorted(self.live)))
    self.release(self.live.pop(rid))


def interrupt_after(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, calls: int) -> None:
    """Make ``module.name`` raise KeyboardInterrupt on its ``calls``-th call (Ctrl-C)."""
    real = getattr(module, name)
    count = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        if count[0] == calls:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``prefixkv ARGV`` in this process: its exit status, stdout and stderr."""
    from prefixkv.adapters.lab.cli import main  # the lab, only for the tests that run it

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def results_doc(out: Path) -> dict[str, Any]:
    """The ``results.json`` a ``compare`` wrote into ``out``."""
    doc: dict[str, Any] = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return doc
