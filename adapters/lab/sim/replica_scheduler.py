"""One engine replica's scheduler over its seat (:mod:`.seats`), with no model behind it.

It plans steps as the engines do (vLLM 0.33, SGLang 0.5.23, their defaults), calls only
its seat and admits whatever the engine class admits. ``mixed`` is vLLM v1's
``Scheduler.schedule``: running requests first within the token budget, preempting the
last one until a slot fits, then, if nothing was preempted, waiting ones.
``prefill_first`` is SGLang's ``get_next_batch_to_run``: a step prefills whenever its
``PrefillAdder`` admits, else decodes, retracting when short of a page. ``lpm`` orders
the waiting queue as SGLang's ``calc_priority`` (longest cached prefix first; a short
hit sharing its first 32 tokens with an earlier one waits; over 128 waiting, FCFS).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

from prefixkv.adapters.sglang.prefill_adder import AddReqResult, PrefillAdder, RunningReq
from prefixkv.indexes.tokens import ExtraKey, TokenKey

from .config import SimSettings
from .errors import SimError, SimSettingsError
from .metrics import RequestRow
from .profile import CostProfile, attention_pairs
from .requests import SimRequest
from .seats import Seat, SglangSeat, VllmSeat

__all__ = ["Chunk", "ReplicaScheduler", "SimSeq", "StepPlan", "StepWork"]


@dataclass(slots=True, eq=False)
class SimSeq:
    """A request inside the replica: its progress (positions below ``prefill_end`` are
    prefill; ``num_computed`` have K/V) and its record."""

    request: SimRequest
    metrics: RequestRow
    num_output: int = 0
    num_computed: int = 0
    prefill_end: int = 0
    num_admissions: int = 0
    key: TokenKey | None = None
    max_new_tokens: int = 0  # SGLang's, clipped when the request arrives

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.request.prompt) + self.num_output

    def waiting_key(self) -> TokenKey:
        """The key to admit with (prompt + output so far), made once per wait."""
        if self.key is None:
            r = self.request
            output = [r.output_token(i) for i in range(self.num_output)]
            self.key = TokenKey(r.prompt.tolist() + output)
        return self.key


class Chunk(NamedTuple):
    """Tokens ``start .. start + num_tokens - 1`` of ``seq``, computed this step."""

    seq: SimSeq
    start: int
    num_tokens: int


class StepPlan(NamedTuple):
    """One step's work: the chunks computed, in order, and the requests preempted."""

    chunks: list[Chunk]
    preempted: list[SimSeq]

    def work(self) -> StepWork:
        """What the step computes, in the cost profile's units."""
        prefill_tokens = prefill_pairs = num_decode = decode_context = max_context = sampled = 0
        for seq, start, n in self.chunks:  # a decode chunk is one token
            sampled += start + n == seq.num_tokens
            max_context = max(max_context, start + n)
            if start < seq.prefill_end:
                prefill_tokens += n
                prefill_pairs += attention_pairs(n, start)
            else:
                num_decode += 1
                decode_context += start + 1
        return StepWork(
            prefill_tokens, prefill_pairs, num_decode, decode_context, max_context, sampled
        )


class StepWork(NamedTuple):
    """One step's work: the cost model's four variables, the longest context and the
    tokens it samples."""

    prefill_tokens: int
    prefill_pairs: int
    num_decode: int
    decode_context: int
    max_context: int
    num_sampled: int


class ReplicaScheduler:
    """Waiting and running queues of one replica, stepped through one seat.

    Raises:
        SimSettingsError: SGLang's chunked prefill with a budget under a page.
    """

    def __init__(self, seat: Seat, config: SimSettings, profile: CostProfile) -> None:
        if (
            isinstance(seat, SglangSeat)
            and config.enable_chunked_prefill
            and config.max_num_batched_tokens < seat.block_size
        ):
            raise SimSettingsError(
                f"max_num_batched_tokens {config.max_num_batched_tokens} is under the page "
                f"size {seat.block_size}: SGLang cuts a chunked prompt at a whole page, so "
                "no prompt past the budget could start"
            )
        self.seat = seat
        self.config = config
        self.profile = profile
        self.waiting: deque[SimSeq] = deque()
        self.running: list[SimSeq] = []
        # SGLang's running_batch.batch_is_full.
        self.batch_is_full = False

    def add(self, seq: SimSeq) -> None:
        """Queue a new request at the back (SGLang clips its ``max_new_tokens`` now)."""
        if isinstance(self.seat, SglangSeat):
            r = seq.request
            seq.max_new_tokens = self.seat.max_new_tokens(len(r.prompt), r.output_len)
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> StepPlan:
        """Plan the step that starts at virtual time ``now``."""
        seat = self.seat
        if isinstance(seat, VllmSeat):
            return self._schedule_mixed(seat, now)
        assert isinstance(seat, SglangSeat), seat
        return self._schedule_prefill_first(seat, now)

    def preempt_all(self) -> None:
        """Preempt every running request to the queue's front, in order (vLLM's
        ``reset_prefix_cache(reset_running_requests=True)``)."""
        for seq in reversed(self.running):
            self._release(seq, front=True)
        self.running.clear()

    def _schedule_mixed(self, seat: VllmSeat, now: float) -> StepPlan:
        budget = self.config.max_num_batched_tokens
        chunks: list[Chunk] = []
        preempted: list[SimSeq] = []
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed, budget)
            # vLLM: preempt the last running request until the slots fit, or until
            # the request itself was the last one.
            while not seat.grow(seq.request.id, seq.num_computed, n):
                victim = self.running.pop()
                self._release(victim, front=True)
                preempted.append(victim)
                if victim is seq:
                    break
            else:
                chunks.append(Chunk(seq, seq.num_computed, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:  # vLLM admits nothing in a step that preempted
            self._order_waiting()
            cfg = self.config
            while self.waiting and len(self.running) < cfg.max_num_seqs and budget > 0:
                seq = self.waiting[0]
                got = seat.admit(
                    seq.request.id,
                    seq.waiting_key().tokens,
                    budget,
                    chunked=cfg.enable_chunked_prefill,
                    scheduled=bool(chunks),
                )
                if got is None:
                    break
                hit, n = got
                chunks.append(self._start(seq, hit, n, now))
                budget -= n
        return StepPlan(chunks, preempted)

    def _schedule_prefill_first(self, seat: SglangSeat, now: float) -> StepPlan:
        # SGLang's get_new_batch_prefill: one PrefillAdder pass, then its chunks are
        # allocated in order (prepare_for_extend); a step that prefills nothing decodes.
        chunked = next((s for s in self.running if s.num_computed < s.prefill_end), None)
        if not self.running:
            self.batch_is_full = False  # nothing left to leave: admission reopens
        if chunked is None and (self.batch_is_full or not self.waiting):
            return self._decode_or_retract(seat)
        adder = self._prefill_adder(seat, chunked)
        admitted = [] if self.batch_is_full else self._add_waiting(seat, adder, chunked)
        chunks: list[Chunk] = []
        new = adder.can_run_list
        if chunked is not None:
            adm, new = new[0], new[1:]
            if seat.chunk(chunked.request.id, adm.extend_len):
                chunks.append(Chunk(chunked, chunked.num_computed, adm.extend_len))
        for seq, adm in zip(admitted, new, strict=True):
            hit = seat.admit(seq.request.id, seq.waiting_key().tokens, extend_len=adm.extend_len)
            if hit is None:  # pragma: no cover - the adder admitted what fits
                break
            chunks.append(self._start(seq, hit, adm.extend_len, now))
        adder.release()
        if chunks:
            return StepPlan(chunks, [])
        return self._decode_or_retract(seat)

    def _prefill_adder(self, seat: SglangSeat, chunked: SimSeq | None) -> PrefillAdder:
        # The running batch (the chunked request apart) reserved, the chunk taken first.
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        # One past its clipped max_new_tokens reserves nothing more.
        running = [
            RunningReq(max(s.max_new_tokens, s.num_output), s.num_output)
            for s in self.running
            if s is not chunked
        ]
        adder = seat.prefill_adder(
            running,
            rem_input_tokens=budget,
            rem_chunk_tokens=budget if cfg.enable_chunked_prefill else None,
        )
        if chunked is not None:
            adder.add_chunked_req(
                chunked.request.id,
                chunked.prefill_end,
                chunked.num_computed,
                chunked.max_new_tokens,
            )
        return adder

    def _add_waiting(
        self, seat: SglangSeat, adder: PrefillAdder, chunked: SimSeq | None
    ) -> list[SimSeq]:
        self._order_waiting()
        num_running = len(self.running) - (chunked is not None)
        admitted: list[SimSeq] = []
        for seq in self.waiting:
            if adder.budget_state() is AddReqResult.OTHER:
                break
            if len(adder.can_run_list) >= self.config.max_num_seqs - num_running:
                self.batch_is_full = True
                break
            got = len(adder.can_run_list)
            res = seat.add_one_req(
                adder, seq.request.id, seq.waiting_key().tokens, seq.max_new_tokens, seq.num_output
            )
            if len(adder.can_run_list) > got:
                admitted.append(seq)
            if res is AddReqResult.NO_TOKEN:
                # Full until a running request leaves (finishes or is retracted).
                self.batch_is_full = bool(adder.can_run_list) or num_running > 0
            if res is not AddReqResult.CONTINUE:
                break
        return admitted

    def _decode_or_retract(self, seat: SglangSeat) -> StepPlan:
        chunks: list[Chunk] = []
        retracted: list[SimSeq] = []
        for seq in list(self.running):
            if seq.num_tokens - seq.num_computed != 1 or seq in retracted:
                continue
            while not seat.grow(seq.request.id):
                if len(self.running) == 1:
                    raise SimError(  # pragma: no cover - the servability check rules it out
                        f"request {seq.request.id!r} cannot decode alone in the pool"
                    )
                # The victim: the last of the minima of (output tokens, -prompt tokens).
                victim = min(
                    reversed(self.running), key=lambda s: (s.num_output, -len(s.request.prompt))
                )
                self.running.remove(victim)
                self._release(victim, front=False)
                retracted.append(victim)
                self.batch_is_full = False
                chunks = [c for c in chunks if c.seq is not victim]
                if victim is seq:
                    break
            else:
                chunks.append(Chunk(seq, seq.num_computed, 1))
        return StepPlan(chunks, retracted)

    def _order_waiting(self) -> None:
        if self.config.queue_order != "lpm" or len(self.waiting) > 128:
            return
        index = self.seat.index
        order: dict[int, float] = {}
        heads: set[tuple[ExtraKey | None, bytes]] = set()
        for seq in self.waiting:
            key = seq.waiting_key()
            hit = index.match_prefix(key, len(key) - 1).num_tokens
            order[id(seq)] = -hit
            if hit > 32 or len(key) < 32:
                continue
            # SGLang's page-1 tree of the checked requests: a match of 32 or more
            # tokens is an earlier one with the same first 32 tokens.
            head = (key.extra_key, key.tokens[:32].tobytes())
            if head in heads:
                order[id(seq)] = math.inf
            else:
                heads.add(head)
        self.waiting = deque(sorted(self.waiting, key=lambda s: order[id(s)]))

    def _release(self, seq: SimSeq, *, front: bool) -> None:
        # Recompute: drop the K/V, keep the output.
        self.seat.release(seq.request.id)
        seq.num_computed = 0
        seq.metrics.num_preemptions += 1
        if front:
            self.waiting.appendleft(seq)
        else:
            self.waiting.append(seq)

    def _start(self, seq: SimSeq, hit: int, n: int, now: float) -> Chunk:
        self.waiting.popleft()
        seq.key = None
        seq.num_computed = hit
        seq.prefill_end = seq.num_tokens
        self.running.append(seq)
        m = seq.metrics
        if seq.num_admissions == 0:
            m.first_scheduled_s = now
            m.hit_tokens = hit
        seq.num_admissions += 1
        m.saved_gpu_s += self.profile.prefill_s(hit, 0)
        return Chunk(seq, hit, max(1, n))

    def complete(self, plan: StepPlan, now: float, delivered: float | None = None) -> list[SimSeq]:
        """Record a computed step that ended at ``now`` and reached the clients at
        ``delivered`` (default ``now``); returns the requests it finished."""
        seat = self.seat
        profile = self.profile
        seen = now if delivered is None else delivered
        finished: list[SimSeq] = []
        for seq, start, n in plan.chunks:
            end = start + n
            seq.num_computed = end
            rid = seq.request.id
            m = seq.metrics
            if start < seq.prefill_end:
                if end < seq.prefill_end:
                    seat.prefilled(rid, end)
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
                else:
                    # SGLang checkpoints a finished prefill after sampling from it.
                    seat.sampled(rid, seq.request.output_token(seq.num_output - 1))
                    if end == seq.prefill_end:
                        seat.prefilled(rid, end)
        for seq in finished:
            seat.finish(seq.request.id, seq.num_computed)
            seq.metrics.finish_s = seen
        if finished:
            done = {id(s) for s in finished}
            self.running = [s for s in self.running if id(s) not in done]
            self.batch_is_full = False
        return finished
