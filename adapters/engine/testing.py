"""Test doubles and oracles for the equal-KV property (SPEC BB-6), shipped in the package.

``KVRecorder`` gathers each finished request's K/V through its block table;
``check_equal_kv`` compares them, and the greedy tokens, with the request computed
alone without a cache; ``WriteGuard`` checks that no K/V lands in a cached block
(BB-5). ``FaultyIndex`` breaks a real index on purpose, to show the checks bite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch

from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes.base import CacheHandle, InsertResult, PrefixIndex, PrefixMatch
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.tokens import TokenKey
from prefixkv.indexes.wrapper import IndexWrapper
from prefixkv.storage.paged_kv import PagedKVCache

from .model import TinyTransformer

__all__ = [
    "FaultKind",
    "FaultyIndex",
    "IndexWrapper",
    "KVCapture",
    "KVRecorder",
    "WriteGuard",
    "assert_no_leaks",
    "check_equal_kv",
]

FaultKind = Literal["wrong_block", "skip_ref"]


class KVCapture(NamedTuple):
    """A finished request's K/V, read back through its block table.

    Attributes:
        token_ids: prompt then generated tokens.
        num_tokens: leading tokens with K/V (``len(token_ids) - 1``).
        keys: per layer, ``[num_tokens, num_kv_heads, head_dim]`` (copies).
        values: per layer, likewise.
    """

    token_ids: tuple[int, ...]
    num_tokens: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


class KVRecorder:
    """An ``on_finish`` hook that keeps every finished request's K/V.

    Use as ``Engine(config, on_finish=recorder)``; ``captures`` maps request ids
    to :class:`KVCapture`.
    """

    def __init__(self) -> None:
        self.captures: dict[int, KVCapture] = {}

    def __call__(
        self,
        request_id: int,
        token_ids: Sequence[int],
        block_table: list[int],
        num_tokens: int,
        kv_cache: PagedKVCache,
    ) -> None:
        """Gather and copy the request's K/V for its first ``num_tokens`` tokens."""
        keys, values = [], []
        for layer in range(kv_cache.num_layers):
            k, v = kv_cache.gather(layer, block_table, num_tokens)
            keys.append(k.clone())
            values.append(v.clone())
        self.captures[request_id] = KVCapture(tuple(token_ids), num_tokens, keys, values)


def check_equal_kv(
    model: TinyTransformer,
    recorder: KVRecorder,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]],
    request_ids: Sequence[int],
    *,
    atol: float = 1e-12,
) -> None:
    """Check each request against itself computed alone, once, with no cache.

    For every request: its tokens with K/V are prompt plus all outputs but the
    last; the K/V gathered through its block table equal the dense reference's
    within ``atol`` in every layer, and each output token is the argmax of the
    reference logits at the position before it.

    Raises:
        AssertionError: naming the request, layer or position that differs.
    """
    for i, (prompt, output, rid) in enumerate(zip(prompts, outputs, request_ids, strict=True)):
        cap = recorder.captures.get(rid)
        assert cap is not None, f"request {i} (id {rid}) finished without a K/V capture"
        tokens = [*prompt, *output]
        assert list(cap.token_ids) == tokens, f"request {i}: tokens {cap.token_ids} != {tokens}"
        n = len(tokens) - 1
        assert cap.num_tokens == n, f"request {i}: {cap.num_tokens} tokens with K/V, expected {n}"
        ref = model.reference_forward(tokens[:n])
        for layer in range(len(cap.keys)):
            _check_close(f"request {i}: K of layer {layer}", cap.keys[layer], ref.keys[layer], atol)
            _check_close(
                f"request {i}: V of layer {layer}", cap.values[layer], ref.values[layer], atol
            )
        greedy = torch.argmax(ref.logits, dim=-1).tolist()
        for j, token in enumerate(output):
            want = greedy[len(prompt) - 1 + j]
            assert want == token, (
                f"request {i}: output {j} is {token}, the no-cache run gives {want}"
            )


def _check_close(what: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> None:
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    ok = ((got - want).abs() <= atol).flatten(1).all(1)  # NaN counts as a mismatch
    if not bool(ok.all()):
        bad = int((~ok).nonzero()[0])
        err = (got[bad] - want[bad]).abs().max().item()
        raise AssertionError(
            f"{what} differs from the no-cache run at token {bad} by {err:.3g} (atol {atol})"
        )


def assert_no_leaks(manager: CacheManager) -> None:
    """After every request finished: nothing running, held or locked; blocks conserved.

    Raises:
        AssertionError: describing the leak.
    """
    manager.check_invariants()
    running = manager.running()
    assert not running, f"requests still running: {running}"
    held = manager.num_held_only_blocks()
    assert held == 0, f"{held} blocks still held by finished requests"
    stats = manager.index.stats()
    assert stats.num_locked_blocks == 0, f"{stats.num_locked_blocks} cached blocks still locked"
    free = manager.allocator.num_free_blocks
    assert free + stats.num_cached_blocks == manager.allocator.num_blocks, (
        f"free {free} + cached {stats.num_cached_blocks} != {manager.allocator.num_blocks}"
    )


class FaultyIndex(IndexWrapper):
    """A real index with one deliberate bug, to show the equal-KV property has teeth.

    Faults:
        ``"wrong_block"``: a hit of at least three blocks comes back with its first
            two blocks swapped, so the request reads other blocks' K/V. The ids
            stay distinct and the last one right, so no ownership check of the
            index or the manager notices: only the K/V comparison can.
        ``"skip_ref"``: locking a non-empty hit is skipped (a missing
            ``ref_cnt += 1`` / ``inc_lock_ref``), so blocks in use can be evicted
            and overwritten, and the later unlock is unbalanced.

    Args:
        inner: the index to wrap (it does the real work).
        fault: which bug.
        skip: opportunities to let pass before the first fault.
        max_faults: how many times to inject it (``None``: every opportunity).

    Attributes:
        num_faults: faults injected so far (a test should check it is > 0).

    Raises:
        PrefixKVError: an unknown fault.
    """

    def __init__(
        self, inner: PrefixIndex, fault: FaultKind, *, skip: int = 0, max_faults: int | None = 1
    ) -> None:
        if fault not in ("wrong_block", "skip_ref"):
            raise PrefixKVError(f"unknown fault {fault!r}; use 'wrong_block' or 'skip_ref'")
        super().__init__(inner)
        self.fault = fault
        self.num_faults = 0
        self._skip = skip
        self._max_faults = max_faults
        # Handles of non-empty matches not locked yet, by id(); holding them keeps
        # their ids from being reused by other handles.
        self._hit_handles: dict[int, CacheHandle] = {}

    def _should_fault(self) -> bool:
        if self._max_faults is not None and self.num_faults >= self._max_faults:
            return False
        if self._skip:
            self._skip -= 1
            return False
        self.num_faults += 1
        return True

    def match_prefix(self, key: TokenKey, max_num_tokens: int | None = None) -> PrefixMatch:
        """The inner match; under ``wrong_block`` its first two blocks swapped."""
        m = self.inner.match_prefix(key, max_num_tokens)
        if m.block_ids:
            self._hit_handles[id(m.handle)] = m.handle
        if self.fault == "wrong_block" and len(m.block_ids) >= 3 and self._should_fault():
            ids = list(m.block_ids)
            ids[0], ids[1] = ids[1], ids[0]
            return PrefixMatch(m.num_tokens, ids, m.handle)
        return m

    def lock(self, handle: CacheHandle) -> None:
        """Delegates, except that ``skip_ref`` drops the lock of a hit."""
        hit = self._hit_handles.pop(id(handle), None) is handle
        if self.fault == "skip_ref" and hit and self._should_fault():
            return
        self.inner.lock(handle)


class WriteGuard(IndexWrapper):
    """Checks SPEC BB-5 while an engine runs: K/V never go into a block the index holds.

    It wraps the engine's index, following which blocks the index holds from what
    ``insert`` returns and what ``evict`` / ``unlock`` / ``relock`` / ``reset`` hand
    back, and it wraps the cache's ``write``. A write into a block the index has held
    since the step began (cached content, someone's hit) fails; blocks registered in
    the step itself (an admitted prefill's, before its forward pass) may be written.

    Use: ``guard = WriteGuard(index)``, ``engine = Engine(config, index=guard,
    on_step=guard.on_step)``, ``guard.attach(engine.kv_cache)``.

    Args:
        inner: the index to wrap.

    Attributes:
        num_checked_writes: layer-0 writes checked so far.
    """

    def __init__(self, inner: PrefixIndex) -> None:
        super().__init__(inner)
        self.num_checked_writes = 0
        self._held: set[int] = set()
        self._held_since_step: set[int] = set()

    def attach(self, kv_cache: PagedKVCache) -> None:
        """Route ``kv_cache.write`` through the check (layer 0 is checked)."""
        write = kv_cache.write
        bs = kv_cache.block_size

        def checked(
            layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor | Sequence[int]
        ) -> None:
            if layer == 0:
                slots = torch.as_tensor(slot_mapping).tolist()
                blocks = {s // bs for s in slots if s >= 0}
                bad = blocks & self._held_since_step & self._held
                assert not bad, f"K/V written into blocks {sorted(bad)} that the index holds"
                self.num_checked_writes += 1
            write(layer, k, v, slot_mapping)

        setattr(kv_cache, "write", checked)  # noqa: B010 - an instance-level spy

    def on_step(self, engine: object) -> None:
        """A step ended: what the index holds now is off limits in the next one."""
        self._held_since_step = set(self._held)

    def _gone(self, block_ids: list[int]) -> list[int]:
        self._held.difference_update(block_ids)
        self._held_since_step.difference_update(block_ids)
        return block_ids

    def insert(
        self,
        key: TokenKey,
        block_ids: Sequence[int],
        num_tokens: int | None = None,
        prefix: CacheHandle | None = None,
    ) -> InsertResult:
        """Delegates; the returned blocks are the index's."""
        result = self.inner.insert(key, block_ids, num_tokens, prefix)
        self._held.update(result.block_ids)
        return result

    def unlock(self, handle: CacheHandle) -> list[int]:
        """Delegates; released blocks leave the index."""
        return self._gone(self.inner.unlock(handle))

    def relock(self, old: CacheHandle, new: CacheHandle) -> list[int]:
        """Delegates; released blocks leave the index."""
        return self._gone(self.inner.relock(old, new))

    def evict(self, num_blocks: int) -> list[int]:
        """Delegates; evicted blocks leave the index."""
        return self._gone(self.inner.evict(num_blocks))

    def reset(self) -> list[int]:
        """Delegates; every block leaves the index."""
        return self._gone(self.inner.reset())
