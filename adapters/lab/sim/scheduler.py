"""One engine replica's scheduler over a :class:`CacheManager`, with no model behind it.

It plans steps the way the engines do and leaves timing to the cost profile:

- ``mixed`` batching follows vLLM v1's ``Scheduler.schedule``: running requests
  first (a decode token each, or the next prefill chunk), within the step's token
  budget; when a block cannot be found, the last running request is preempted
  (recompute: its blocks are released, it goes back to the front of the waiting
  queue) until the block fits; then, only if nothing was preempted, waiting
  requests are admitted while ``max_num_seqs`` and the budget allow. Full prompt
  blocks are registered at admission, before the forward pass, as vLLM's
  ``allocate_slots`` does, so a request admitted later in the same step hits them.
- ``prefill_first`` batching follows SGLang's ``get_next_batch_to_run``: a step
  prefills (the unfinished chunked request, then new admissions) whenever it can,
  and decodes every running request otherwise; blocks are registered after the
  step (``cache_unfinished_req``).
- ``lpm`` orders the waiting queue as SGLang's ``SchedulePolicy.calc_priority``
  does: longest cached prefix first, stable, with requests whose small hit is
  shared with an earlier waiting request deferred (in-batch prefix caching), and
  plain FCFS when more than 128 requests wait.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from prefixkv.adapters.manager import CacheManager
from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.tokens import ExtraKey, TokenKey

from .config import SimConfig
from .metrics import RequestMetrics
from .profile import CostProfile, attention_pairs
from .requests import TimedRequest

__all__ = [
    "IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD",
    "IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD",
    "WAITING_QUEUE_PREFIX_MATCH_MAX",
    "Chunk",
    "ReplicaScheduler",
    "SimSeq",
    "StepPlan",
]

WAITING_QUEUE_PREFIX_MATCH_MAX = 128
"""SGLang: above this many waiting requests, ``lpm`` falls back to FCFS."""
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
"""SGLang: requests whose cached prefix is at most this long are checked against
the other waiting requests."""
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32
"""SGLang: a checked request sharing at least this many leading tokens with an
earlier checked one waits behind the rest, so the first one's prefill is cached."""


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

    request: TimedRequest
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

    def seconds(self, profile: CostProfile) -> float:
        """The step's duration under ``profile``."""
        prefill_tokens = prefill_pairs = num_decode = decode_context = 0
        for seq, start, n in self.chunks:
            if start < seq.prefill_end:
                prefill_tokens += n
                prefill_pairs += attention_pairs(n, start)
            else:
                num_decode += 1
                decode_context += start + 1
        return profile.step_time(prefill_tokens, prefill_pairs, num_decode, decode_context)


class ReplicaScheduler:
    """Waiting and running queues of one replica, driven by one :class:`CacheManager`.

    Args:
        manager: admits, grows, registers and releases the requests' blocks.
        index: the manager's index (looked up, never locked, to size admissions
            and to order the queue for ``lpm``).
        config: the scheduler's settings.
        profile: prices prefill for the per-request GPU-seconds.
    """

    def __init__(
        self,
        manager: CacheManager,
        index: PrefixIndex,
        config: SimConfig,
        profile: CostProfile,
    ) -> None:
        self.manager = manager
        self.index = index
        self.config = config
        self.profile = profile
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
        if self.config.batching == "mixed":
            return self._schedule_mixed(now)
        return self._schedule_prefill_first(now)

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
            self._admit(chunks, budget, now, register_now=True)
        return StepPlan(chunks, preempted)

    def _schedule_prefill_first(self, now: float) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[Chunk] = []
        preempted: list[SimSeq] = []
        for seq in [s for s in self.running if s.num_computed < s.prefill_end]:
            if budget <= 0 or seq not in self.running:
                break
            n = min(seq.prefill_end - seq.num_computed, budget)
            if self._grow_or_preempt(seq, n, preempted):
                chunks.append(Chunk(seq, seq.num_computed, n))
                budget -= n
        if not preempted:
            self._admit(chunks, budget, now, register_now=False)
        if chunks:
            return StepPlan(chunks, preempted)
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if seq.num_tokens - seq.num_computed != 1:
                i += 1
                continue
            if not self._grow_or_preempt(seq, 1, preempted):
                break
            chunks.append(Chunk(seq, seq.num_computed, 1))
            i += 1
        return StepPlan(chunks, preempted)

    def _grow_or_preempt(self, seq: SimSeq, n: int, preempted: list[SimSeq]) -> bool:
        # vLLM: preempt the last running request until the block fits, or until the
        # request itself was the last one.
        while not self._grow(seq, n):
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

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

    def _preempt(self, seq: SimSeq) -> None:
        # Recompute mode: drop the K/V, keep the output; the next admission
        # prefills prompt + output (hitting whatever of it is still cached).
        self.manager.abort(seq.request.id)
        seq.num_computed = seq.num_in_key = 0
        seq.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)

    def _match(self, key: TokenKey) -> int:
        # The hit admission would get: capped at len - 1 (SPEC BB-1); locks nothing.
        return self.index.match_prefix(key, len(key) - 1).num_tokens

    def _admit(self, chunks: list[Chunk], budget: int, now: float, *, register_now: bool) -> None:
        cfg = self.config
        if cfg.policy == "lpm":
            self._sort_by_longest_prefix()
        while self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
            seq = self.waiting[0]
            key = seq.waiting_key()
            hit = self._match(key)
            n = len(key) - hit
            if cfg.enable_chunked_prefill:
                n = min(n, budget)
            elif n > budget:
                break
            chunk = self._admit_one(seq, key, hit + n)
            if chunk is None:
                break
            self.waiting.popleft()
            chunks.append(chunk)
            budget -= chunk.num_tokens
            if register_now:
                self._register_prompt(chunk)
            self._note_admission(seq, chunk.start, now)

    def _admit_one(self, seq: SimSeq, key: TokenKey, num_tokens: int) -> Chunk | None:
        # Slots for the hit and this step's chunk only (vLLM allocates per chunk).
        admission = self.manager.admit(seq.request.id, key, num_tokens=num_tokens)
        if admission is None:
            return None
        cached = admission.num_cached_tokens
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

    def _sort_by_longest_prefix(self) -> None:
        waiting = self.waiting
        if len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return  # SGLang turns the matching and sorting off for long queues
        hits: dict[int, float] = {}
        heads: set[tuple[ExtraKey | None, bytes]] = set()
        width = IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
        for seq in waiting:
            key = seq.waiting_key()
            hit = self._match(key)
            hits[id(seq)] = -hit
            if hit > IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD or len(key) < width:
                continue
            # A waiting-queue radix tree at page 1 matches >= width tokens exactly
            # when some earlier checked request has the same first width tokens.
            head = (key.extra_key, key.tokens[:width].tobytes())
            if head in heads:
                hits[id(seq)] = math.inf
            else:
                heads.add(head)
        self.waiting = deque(sorted(waiting, key=lambda s: hits[id(s)]))

    # ------------------------------------------------------------------- results

    def complete(self, plan: StepPlan, now: float) -> list[SimSeq]:
        """Record a computed step that ended at ``now``: register K/V, sample, finish.

        Returns:
            The requests that finished in this step.
        """
        manager = self.manager
        profile = self.profile
        # vLLM registers decode blocks as they fill; SGLang inserts a request's
        # decoded tokens when it finishes (cache_finished_req).
        register_decode = self.config.batching == "mixed"
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
                    m.first_token_s = now
                if seq.num_output == seq.request.output_len:
                    finished.append(seq)
        for seq in finished:
            if not register_decode:
                manager.commit(seq.request.id, seq.num_computed)
            manager.finish(seq.request.id)
            seq.metrics.finish_s = now
        if finished:
            done = {id(s) for s in finished}
            self.running = [s for s in self.running if id(s) not in done]
        return finished
