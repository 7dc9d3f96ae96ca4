"""Small helpers shared by the test modules (plain Python, the tests' own oracles)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixkv.adapters.manager import CacheManager

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


class FacadeMachine(RuleBasedStateMachine):
    """What the facade state machines share. ``setup`` sets ``manager`` (the facade's
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


@precondition(lambda self: self.live)
@rule(data=st.data())
def release_a_live_request(self: FacadeMachine, data: st.DataObject) -> None:
    """A rule for a :class:`FacadeMachine` (under the engine's name for it): a drawn
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
