"""Continuous-batching scheduler over the CacheManager, in the style of vLLM v1's.

Each step schedules the running requests first (one decode token, or the next chunk
of a prefill), preempting the most recently admitted one when no block can be found
(vLLM's recompute mode), then admits waiting requests first come first served within
``max_num_seqs`` and the step's token budget. Nothing here knows the index backend.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from prefixkv.adapters.accounting import RequestRecord
from prefixkv.adapters.manager import CacheManager

from .config import EngineConfigError

__all__ = ["EngineRequest", "RequestStatus", "ScheduledChunk", "Scheduler", "SchedulerOutput"]


class RequestStatus(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request's tokens, progress and accounting.

    Attributes:
        request_id: unique within the engine; also the manager's request id.
        prompt: the prompt tokens.
        max_new_tokens: stop after this many generated tokens.
        output: generated tokens so far (kept across preemption).
        status: waiting, running or finished.
        num_computed: while running, leading tokens whose K/V are in the cache.
        num_in_key: while running, tokens the manager's key holds.
        prefill_end: tokens known at the last admission; computing positions below
            it is prefill (recompute after a preemption), above it decode.
        num_preemptions: times the request was preempted and requeued.
        computed_prefill_tokens: prefill tokens computed, recompute included.
        recomputed_tokens: the part of ``computed_prefill_tokens`` computed after
            a preemption.
        hit_tokens: prompt tokens served from the cache at the first admission
            (``None`` until admitted).
        record: the accounting record of the first admission, when the engine has
            a boundary tracker (SPEC BB-8).
    """

    request_id: int
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0
    num_in_key: int = 0
    prefill_end: int = 0
    num_preemptions: int = 0
    computed_prefill_tokens: int = 0
    recomputed_tokens: int = 0
    hit_tokens: int | None = None
    record: RequestRecord | None = None

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.prompt) + len(self.output)

    @property
    def token_ids(self) -> list[int]:
        """Prompt then generated tokens (a new list)."""
        return [*self.prompt, *self.output]

    @property
    def is_done(self) -> bool:
        """Whether every requested token has been generated."""
        return len(self.output) >= self.max_new_tokens


class ScheduledChunk(NamedTuple):
    """Tokens ``start .. start + num_tokens - 1`` of a request, computed this step."""

    request: EngineRequest
    start: int
    num_tokens: int


class SchedulerOutput(NamedTuple):
    """One step's plan.

    Attributes:
        chunks: what to compute, running requests first, then new admissions.
        preempted: requests preempted (and requeued) while planning.
    """

    chunks: list[ScheduledChunk]
    preempted: list[EngineRequest]

    @property
    def num_batched_tokens(self) -> int:
        """Tokens computed in the step."""
        return sum(c.num_tokens for c in self.chunks)


FinishCallback = Callable[[EngineRequest], None]


class Scheduler:
    """Waiting and running queues, driven by one :class:`CacheManager`.

    Args:
        manager: admits, grows, registers and releases the requests' blocks.
        max_num_seqs: most running requests.
        max_num_batched_tokens: most tokens per step.
        enable_chunked_prefill: let a prefill take what is left of a step's budget
            and continue next step; without it a prefill runs whole or waits.
    """

    def __init__(
        self,
        manager: CacheManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
    ) -> None:
        self.manager = manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []

    def add(self, request: EngineRequest) -> None:
        """Queue a new request at the back."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self.waiting or self.running)

    # ------------------------------------------------------------------ planning

    def schedule(self) -> SchedulerOutput:
        """Plan one step: grow running requests, preempt if short, admit new ones.

        Running requests are taken oldest first; when a block cannot be found for
        one, the newest running request is preempted (its blocks released, it
        goes back to the front of the waiting queue) until the block fits or the
        request itself was the newest. As in vLLM, no request is admitted in a
        step that preempted.

        Raises:
            EngineConfigError: nothing can run although requests wait (the pool
                cannot hold the head request even with the cache evicted).
        """
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[EngineRequest] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            new_tokens = req.token_ids[req.num_in_key :]
            while not self.manager.append(
                req.request_id, new_tokens, num_slots=req.num_computed + n
            ):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    break
            else:
                req.num_in_key = req.num_tokens
                chunks.append(ScheduledChunk(req, req.num_computed, n))
                budget -= n
                i += 1
        if not preempted:
            budget = self._admit(chunks, budget)
        if not chunks and self.has_unfinished():
            head = self.waiting[0]
            raise EngineConfigError(
                f"request {head.request_id} ({head.num_tokens} tokens) cannot be scheduled: "
                f"the pool of {self.manager.allocator.num_blocks} blocks cannot hold it"
            )
        return SchedulerOutput(chunks, preempted)

    def _admit(self, chunks: list[ScheduledChunk], budget: int) -> int:
        manager = self.manager
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            key = manager.make_key(req.token_ids)
            hit = manager.match(key)
            n = len(key) - hit.num_tokens
            if self.enable_chunked_prefill:
                n = min(n, budget)
            elif n > budget:
                break
            admission = manager.admit(
                req.request_id, key, num_tokens=hit.num_tokens + n, lookup=hit
            )
            if admission is None:
                break
            self.waiting.popleft()
            if req.hit_tokens is None:
                req.hit_tokens = admission.hit_tokens
            req.status = RequestStatus.RUNNING
            req.num_computed = admission.hit_tokens
            req.num_in_key = req.prefill_end = len(key)
            self.running.append(req)
            # Register the prefill's blocks now, before the forward pass (vLLM's
            # allocate_slots does too), so a request admitted later in this step
            # hits them: the model writes every chunk's K/V of a layer before any
            # chunk attends. Not the block of the last prompt token, though: the
            # len - 1 cap may have left it out of a hit although it is cached, and
            # registering it now would make this request's copy a duplicate. The
            # radix tree would swap that copy for its own block and aim this
            # step's writes at it (SPEC BB-5), or, unswapped, both would stay
            # pinned. It is committed after the forward pass, like every other
            # chunk, when a swap just frees the copy (SGLang's order).
            promised = min(
                req.num_computed + n, (len(key) - 1) // manager.block_size * manager.block_size
            )
            if promised > req.num_computed:
                manager.commit(req.request_id, promised, swap_duplicates=False)
            chunks.append(ScheduledChunk(req, req.num_computed, n))
            budget -= n
        return budget

    def _preempt(self, req: EngineRequest) -> None:
        # Recompute mode: drop the KV, keep the output; the next admission
        # prefills prompt + output and samples the token decode would have.
        self.manager.abort(req.request_id)
        req.status = RequestStatus.WAITING
        req.num_computed = req.num_in_key = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------- results

    def update(
        self,
        output: SchedulerOutput,
        next_tokens: Sequence[int],
        before_release: FinishCallback | None = None,
    ) -> list[EngineRequest]:
        """Record a computed step: commit the new K/V, append sampled tokens, finish.

        Args:
            output: the step's plan, as computed.
            next_tokens: per chunk, the greedy token after its last position (used
                only when the chunk reached the end of its request's tokens).
            before_release: called with each finished request while its blocks are
                still held (tests gather its K/V here).

        Returns:
            The requests that finished in this step.
        """
        manager = self.manager
        finished: list[EngineRequest] = []
        for chunk, token in zip(output.chunks, next_tokens, strict=True):
            req = chunk.request
            end = chunk.start + chunk.num_tokens
            req.num_computed = end
            manager.commit(req.request_id, end)
            if chunk.start < req.prefill_end:
                req.computed_prefill_tokens += chunk.num_tokens
                if req.num_preemptions:
                    req.recomputed_tokens += chunk.num_tokens
            if end == req.num_tokens:
                req.output.append(token)
                if req.is_done:
                    finished.append(req)
        for req in finished:
            if before_release is not None:
                before_release(req)
            manager.finish(req.request_id)
            req.status = RequestStatus.FINISHED
        if finished:
            self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]
        return finished
