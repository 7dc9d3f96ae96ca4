"""One engine replica's scheduler over a :class:`CacheManager`, with no model behind it.

It plans steps the way the engines do (vLLM 0.33, SGLang 0.5.23, their defaults)
and leaves timing to the cost profile:

- ``mixed`` batching follows vLLM v1's ``Scheduler.schedule``: running requests
  first (a decode token each, or the next prefill chunk) within the step's token
  budget; when a block cannot be found, the last running request is preempted
  (recompute: its blocks are released, it goes back to the front of the waiting
  queue) until the block fits; then, only if nothing was preempted, waiting
  requests are admitted while ``max_num_seqs`` and the budget allow, each only if
  its whole sequence fits the free and evictable blocks
  (``scheduler_reserve_full_isl``, on by default) though only the chunk's blocks
  are allocated. Full prompt blocks are registered at admission, before the
  forward pass, as ``allocate_slots`` does; decoded blocks as they fill.
- ``prefill_first`` batching follows SGLang's ``get_next_batch_to_run``: a step
  prefills (the unfinished chunked request, then new admissions) whenever it can,
  and decodes every running request otherwise. A request is admitted only if its
  uncached prompt plus the tokens it will decode (clipped at 4096) fit what the
  free and evictable pool keeps after the running requests' remaining decode
  (``PrefillAdder``; requests have fixed lengths, so the new-token ratio is 1).
  Prefill chunks are registered after their step (``cache_unfinished_req``),
  decoded tokens when the request finishes (``cache_finished_req``). Short of a
  block while decoding, requests are retracted in SGLang's order (fewest output
  tokens, then longest prompt, first) to the back of the waiting queue.
- the waiting queue is FCFS or ``lpm`` (:mod:`.queue_order`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes.base import PrefixIndex, PrefixMatch
from prefixkv.indexes.tokens import TokenKey
from prefixkv.storage.allocator import BlockAllocator

from .config import SimConfig
from .errors import SimError
from .metrics import RequestMetrics
from .profile import CostProfile, attention_pairs
from .queue_order import sort_by_longest_prefix
from .requests import SimRequest

__all__ = ["CLIP_MAX_NEW_TOKENS", "Chunk", "ReplicaScheduler", "SimSeq", "StepPlan", "StepWork"]

CLIP_MAX_NEW_TOKENS = 4096
"""SGLang: admission counts at most this many of a request's tokens still to decode."""


@dataclass(slots=True, eq=False)
class SimSeq:
    """A request inside the replica: its progress and its record.

    Attributes:
        request: the request.
        metrics: its record, filled in as it runs.
        num_output: tokens generated so far (kept across preemptions).
        num_computed: while running, leading tokens whose K/V exist.
        num_in_key: while running, tokens the manager's key holds.
        prefill_end: tokens known at the last admission; positions below are prefill.
        num_admissions: admissions so far (1 + preemptions once running).
        key: while waiting, the key to admit it with (prompt + output so far).
    """

    request: SimRequest
    metrics: RequestMetrics
    num_output: int = 0
    num_computed: int = 0
    num_in_key: int = 0
    prefill_end: int = 0
    num_admissions: int = 0
    key: TokenKey | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.request.prompt) + self.num_output

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens ``start .. end - 1`` of prompt + output."""
        prompt = self.request.prompt
        p = len(prompt)
        head = prompt[start:end].tolist() if start < p else []
        return head + [self.request.output_token(i - p) for i in range(max(start, p), end)]

    def waiting_key(self) -> TokenKey:
        """The key to admit with, made once per wait."""
        if self.key is None:
            self.key = TokenKey(self.tokens(0, self.num_tokens))
        return self.key


class Chunk(NamedTuple):
    """Tokens ``start .. start + num_tokens - 1`` of ``seq``, computed this step."""

    seq: SimSeq
    start: int
    num_tokens: int


class StepPlan(NamedTuple):
    """One step's work.

    Attributes:
        chunks: what is computed, in schedule order.
        preempted: requests preempted (and requeued) while planning.
    """

    chunks: list[Chunk]
    preempted: list[SimSeq]

    def work(self) -> StepWork:
        """What the step computes, in the cost profile's units."""
        prefill_tokens = prefill_pairs = num_decode = decode_context = max_context = 0
        sampled = 0
        for seq, start, n in self.chunks:
            sampled += start + n == seq.num_tokens
            if start < seq.prefill_end:
                prefill_tokens += n
                prefill_pairs += attention_pairs(n, start)
                max_context = max(max_context, start + n)
            else:
                num_decode += 1
                decode_context += start + 1
                max_context = max(max_context, start + 1)
        return StepWork(
            prefill_tokens, prefill_pairs, num_decode, decode_context, max_context, sampled
        )

    def seconds(self, profile: CostProfile) -> float:
        """The step's duration under ``profile``."""
        w = self.work()
        return profile.step_time(w.prefill_tokens, w.prefill_pairs, w.num_decode, w.decode_context)


class StepWork(NamedTuple):
    """One step's work: the cost model's four variables, the longest context and the
    tokens it samples (every decode row, and each prefill that reaches its end)."""

    prefill_tokens: int
    prefill_pairs: int
    num_decode: int
    decode_context: int
    max_context: int
    num_sampled: int


class ReplicaScheduler:
    """Waiting and running queues of one replica, driven by one :class:`CacheManager`.

    Args:
        manager: admits, grows, registers and releases the requests' blocks.
        allocator: the manager's pool (read for admission: free blocks).
        index: the manager's index (looked up, never locked, to size admissions
            and to order the queue for ``lpm``).
        config: the scheduler's settings.
        profile: prices prefill for the per-request GPU-seconds.
    """

    def __init__(
        self,
        manager: CacheManager,
        allocator: BlockAllocator,
        index: PrefixIndex,
        config: SimConfig,
        profile: CostProfile,
    ) -> None:
        self.manager = manager
        self.allocator = allocator
        self.index = index
        self.config = config
        self.profile = profile
        self.vllm = config.batching == "mixed"
        self.waiting: deque[SimSeq] = deque()
        self.running: list[SimSeq] = []

    def add(self, seq: SimSeq) -> None:
        """Queue a new request at the back."""
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ planning

    def schedule(self, now: float) -> StepPlan:
        """Plan the step that starts at virtual time ``now``."""
        return self._schedule_mixed(now) if self.vllm else self._schedule_prefill_first(now)

    def _schedule_mixed(self, now: float) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[Chunk] = []
        preempted: list[SimSeq] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            if not self._grow_or_preempt(seq, n, preempted):
                break  # seq preempted itself: it was the last running request
            chunks.append(Chunk(seq, seq.num_computed, n))
            budget -= n
            i += 1
        if not preempted:  # vLLM admits nothing in a step that preempted
            self._admit(chunks, budget, now)
        return StepPlan(chunks, preempted)

    def _grow_or_preempt(self, seq: SimSeq, n: int, preempted: list[SimSeq]) -> bool:
        # vLLM: preempt the last running request until the block fits, or until the
        # request itself was the last one.
        while not self._grow(seq, n):
            victim = self.running.pop()
            self._release(victim, front=True)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _schedule_prefill_first(self, now: float) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[Chunk] = []
        for seq in self.running:
            if seq.num_computed < seq.prefill_end and budget > 0:
                n = min(seq.prefill_end - seq.num_computed, budget)
                if self._grow(seq, n):  # else it waits for decodes to free blocks
                    chunks.append(Chunk(seq, seq.num_computed, n))
                    budget -= n
        self._admit(chunks, budget, now)
        if chunks:
            return StepPlan(chunks, [])
        retracted: list[SimSeq] = []
        for seq in list(self.running):
            if seq.num_tokens - seq.num_computed != 1 or seq in retracted:
                continue
            while not self._grow(seq, 1):
                if len(self.running) == 1:
                    raise SimError(  # pragma: no cover - the servability check rules it out
                        f"request {seq.request.id!r} cannot decode alone in the pool"
                    )
                # SGLang keeps most-output, shortest-prompt requests: the victim is the
                # last of the minima of (output tokens, -prompt tokens).
                victim = min(
                    reversed(self.running), key=lambda s: (s.num_output, -len(s.request.prompt))
                )
                self.running.remove(victim)
                self._release(victim, front=False)
                retracted.append(victim)
                chunks = [c for c in chunks if c.seq is not victim]
                if victim is seq:
                    break
            else:
                chunks.append(Chunk(seq, seq.num_computed, 1))
        return StepPlan(chunks, retracted)

    def _grow(self, seq: SimSeq, n: int) -> bool:
        rid = seq.request.id
        if seq.num_in_key < seq.num_tokens:
            # A token was sampled last step: it joins the key and gets its slot
            # (its K/V is computed now, so the slots needed are exactly the tokens).
            ok = self.manager.append(rid, seq.tokens(seq.num_in_key, seq.num_tokens))
        else:
            ok = self.manager.advance(rid, seq.num_computed + n, seq.num_computed) is not None
        if ok:
            seq.num_in_key = seq.num_tokens
        return ok

    def _release(self, seq: SimSeq, *, front: bool) -> None:
        # Recompute mode: drop the K/V, keep the output; the next admission
        # prefills prompt + output (hitting whatever of it is still cached).
        self.manager.abort(seq.request.id)
        seq.num_computed = seq.num_in_key = 0
        seq.metrics.num_preemptions += 1
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def _match(self, key: TokenKey) -> PrefixMatch:
        # What admission would hit: capped at len - 1 (SPEC BB-1); locks nothing.
        return self.index.match_prefix(key, len(key) - 1)

    def _admit(self, chunks: list[Chunk], budget: int, now: float) -> None:
        cfg = self.config
        if cfg.policy == "lpm":
            self.waiting = sort_by_longest_prefix(self.waiting, lambda k: self._match(k).num_tokens)
        reserved = 0 if self.vllm else sum(_to_decode(s) for s in self.running)
        while self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            key = seq.waiting_key()
            match = self._match(key)
            n = len(key) - match.num_tokens
            if cfg.enable_chunked_prefill:
                n = min(n, budget)
            elif n > budget:
                break
            # Alone, a servable request always fits: the gates only hold back company.
            if (self.running or chunks) and not self._fits(seq, key, match, reserved):
                break
            chunk = self._admit_one(seq, key, match.num_tokens + n)
            if chunk is None:
                break
            self.waiting.popleft()
            chunks.append(chunk)
            budget -= chunk.num_tokens
            if self.vllm:
                self._register_prompt(chunk)
            else:
                reserved += len(key) - chunk.start + _to_decode(seq)
            self._note_admission(seq, chunk.start, now)

    def _fits(self, seq: SimSeq, key: TokenKey, match: PrefixMatch, reserved: int) -> bool:
        # Free blocks plus the cache's evictable ones, less the hit's own (locking
        # the hit protects them from eviction).
        room = (
            self.allocator.num_free_blocks
            + self.index.stats().num_evictable_blocks
            - self.index.count_evictable(match.handle)
        )
        bs = self.index.block_size
        if self.vllm:
            return -(-len(key) // bs) - len(match.block_ids) <= room
        return len(key) - match.num_tokens + _to_decode(seq) < room * bs - reserved

    def _admit_one(self, seq: SimSeq, key: TokenKey, num_tokens: int) -> Chunk | None:
        # Slots for the hit and this step's chunk only (both engines allocate per chunk).
        admission = self.manager.admit(seq.request.id, key, num_tokens=num_tokens)
        if admission is None:
            return None
        cached = admission.hit_tokens
        seq.key = None  # the manager owns the key now and appends to it
        seq.num_computed = cached
        seq.num_in_key = seq.prefill_end = len(key)
        self.running.append(seq)
        return Chunk(seq, cached, max(1, num_tokens - cached))

    def _register_prompt(self, chunk: Chunk) -> None:
        # vLLM registers the chunk's full blocks before the forward pass. Not the
        # block of the last prompt token: the len - 1 cap may have left it out of a
        # hit although it is cached, and registering it now would only duplicate it.
        seq, start, n = chunk
        bs = self.index.block_size
        promised = min(start + n, (seq.prefill_end - 1) // bs * bs)
        if promised > start:
            self.manager.commit(seq.request.id, promised, swap_duplicates=False)

    def _note_admission(self, seq: SimSeq, cached: int, now: float) -> None:
        m = seq.metrics
        if seq.num_admissions == 0:
            m.first_scheduled_s = now
            m.hit_tokens = cached
        seq.num_admissions += 1
        m.saved_gpu_s += self.profile.prefill_s(cached, 0)

    # ------------------------------------------------------------------- results

    def complete(self, plan: StepPlan, now: float, delivered: float | None = None) -> list[SimSeq]:
        """Record a computed step that ended at ``now``: register K/V, sample, finish.

        The step's tokens reach their clients at ``delivered`` (default ``now``; a
        serving front end streams them after the step): first-token and finish times
        are those.

        Returns:
            The requests that finished in this step.
        """
        manager = self.manager
        profile = self.profile
        # vLLM registers decode blocks as they fill; SGLang inserts a request's
        # decoded tokens when it finishes (cache_finished_req).
        register_decode = self.vllm
        seen = now if delivered is None else delivered
        finished: list[SimSeq] = []
        for seq, start, n in plan.chunks:
            end = start + n
            seq.num_computed = end
            if register_decode or start < seq.prefill_end:
                manager.commit(seq.request.id, end)
            m = seq.metrics
            if start < seq.prefill_end:
                m.computed_prefill_tokens += n
                m.prefill_gpu_s += profile.prefill_s(n, start)
                if m.num_preemptions:
                    m.recomputed_tokens += n
            if end == seq.num_tokens:
                seq.num_output += 1
                if seq.num_output == 1:
                    m.first_token_s = seen
                if seq.num_output == seq.request.output_len:
                    finished.append(seq)
        for seq in finished:
            if not register_decode:
                manager.commit(seq.request.id, seq.num_computed)
            manager.finish(seq.request.id)
            seq.metrics.finish_s = seen
        if finished:
            done = {id(s) for s in finished}
            self.running = [s for s in self.running if id(s) not in done]
        return finished


def _to_decode(seq: SimSeq) -> int:
    """Tokens ``seq`` will still generate, clipped as SGLang's admission counts them."""
    return min(seq.request.output_len - seq.num_output, CLIP_MAX_NEW_TOKENS)
