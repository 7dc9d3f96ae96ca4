"""The reference engine: tiny model + paged KV + continuous batching + any prefix index.

It is the oracle of SPEC BB-6 ("equal KV outputs"): the prefix index comes from a
config flag and is reached only through :class:`CacheManager`, so ``none``,
``hash_chain`` and ``radix`` run exactly the same code and must give the same
tokens and the same K/V. Shaped like nano-vllm's ``LLMEngine`` (add, step, generate).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from prefixkv.adapters.accounting import BoundaryTracker
from prefixkv.adapters.manager import CacheManager
from prefixkv.adapters.observer import CacheObserver
from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import InvalidTokenError, RequestStateError
from prefixkv.indexes.registry import make_index
from prefixkv.indexes.validation import ceil_div
from prefixkv.storage.allocator import BlockAllocator
from prefixkv.storage.paged_kv import PagedKVCache

from .config import EngineConfig, EngineConfigError
from .model import SeqChunk, TinyTransformer
from .scheduler import EngineRequest, Scheduler

__all__ = ["Engine", "EngineStats", "FinishHook", "RequestResult", "StepHook"]


class FinishHook(Protocol):
    """Called for each finished request just before its blocks are released.

    Args:
        request_id: the request.
        token_ids: prompt then generated tokens (the last one has no K/V).
        block_table: the request's block table now.
        num_tokens: leading tokens whose K/V are in the cache.
        kv_cache: the engine's paged cache.
    """

    def __call__(
        self,
        request_id: int,
        token_ids: Sequence[int],
        block_table: list[int],
        num_tokens: int,
        kv_cache: PagedKVCache,
    ) -> None:
        """See the class docstring."""
        ...


StepHook = Callable[["Engine"], None]
"""Called with the engine after every step (after the integrity check, if on)."""


class RequestResult(NamedTuple):
    """One request's output and cache accounting (SPEC BB-8).

    Attributes:
        request_id: the engine's id for the request.
        prompt_len: prompt tokens.
        output_tokens: the greedy tokens generated.
        hit_tokens: prompt tokens served from the cache at first admission.
        computed_prefill_tokens: prefill tokens computed, over every admission
            (the recompute after a preemption included).
        recomputed_tokens: the part of ``computed_prefill_tokens`` computed after
            preemptions.
        matched_tokens: prompt tokens equal to cached content at token granularity
            at first admission (``None`` without a ``BoundaryTracker`` observer).
        cap_lost_tokens: cached but recomputed because of the ``len - 1`` cap
            (the recomputed last block), or ``None``.
        boundary_lost_tokens: matched but recomputed because they share a block
            with different tokens, or ``None``.
        num_preemptions: times the request was preempted.
    """

    request_id: int
    prompt_len: int
    output_tokens: tuple[int, ...]
    hit_tokens: int
    computed_prefill_tokens: int
    recomputed_tokens: int
    matched_tokens: int | None
    cap_lost_tokens: int | None
    boundary_lost_tokens: int | None
    num_preemptions: int


@dataclass(slots=True)
class EngineStats:
    """Totals since the engine was built.

    Attributes:
        num_steps: scheduler steps run.
        num_requests: requests added.
        num_finished: requests finished.
        num_prompt_tokens: prompt tokens of the added requests.
        num_hit_tokens: prompt tokens of finished requests served from the cache at
            their first admission.
        num_prefill_tokens: prefill tokens computed (recompute included).
        num_recomputed_tokens: prefill tokens recomputed after preemptions.
        num_decode_tokens: decode tokens computed.
        num_preemptions: preemptions.
        max_batch_size: most requests computed in one step.
    """

    num_steps: int = 0
    num_requests: int = 0
    num_finished: int = 0
    num_prompt_tokens: int = 0
    num_hit_tokens: int = 0
    num_prefill_tokens: int = 0
    num_recomputed_tokens: int = 0
    num_decode_tokens: int = 0
    num_preemptions: int = 0
    max_batch_size: int = 0


class Engine:
    """Greedy generation over a paged KV cache with a pluggable prefix index.

    Args:
        config: the engine's settings (default ``EngineConfig()``).
        index: a ready index to use instead of building ``config.prefix_index``
            (third-party instances, test doubles); its ``block_size`` rules.
        observers: the cache manager's observers; a
            :class:`~prefixkv.adapters.accounting.BoundaryTracker` among them fills
            the results' BB-8 fields.
        on_finish: see :class:`FinishHook`.
        on_step: see :data:`StepHook`.

    Raises:
        EngineConfigError: ``config.block_size`` disagrees with ``index``.
        UnknownIndexError: ``config.prefix_index`` is not registered.

    The cache persists across ``generate`` calls, as in a server. Thread safety:
    none.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        index: PrefixIndex | None = None,
        observers: Sequence[CacheObserver] = (),
        on_finish: FinishHook | None = None,
        on_step: StepHook | None = None,
    ) -> None:
        cfg = EngineConfig() if config is None else config
        if not isinstance(cfg, EngineConfig):
            raise EngineConfigError(f"config must be an EngineConfig, got {cfg!r}")
        if index is None:
            index = make_index(cfg.prefix_index, cfg.block_size, **dict(cfg.index_options))
        elif cfg.block_size is not None and cfg.block_size != index.block_size:
            raise EngineConfigError(
                f"config.block_size {cfg.block_size} disagrees with the index's {index.block_size}"
            )
        self.config = cfg
        self.manager = CacheManager(index, BlockAllocator(cfg.num_blocks), observers=observers)
        self.accounting = next((o for o in observers if isinstance(o, BoundaryTracker)), None)
        self.block_size = self.manager.block_size
        self.model = TinyTransformer(cfg.model, dtype=cfg.torch_dtype, device=cfg.torch_device)
        self.kv_cache = self.model.make_kv_cache(cfg.num_blocks, self.block_size)
        self.scheduler = Scheduler(
            self.manager,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            enable_chunked_prefill=cfg.enable_chunked_prefill,
        )
        self.stats = EngineStats()
        self.on_finish = on_finish
        self.on_step = on_step
        self._requests: dict[int, EngineRequest] = {}
        self._next_id = 0

    # ------------------------------------------------------------------ requests

    def _check_prompt(self, prompt: Sequence[int], what: str) -> list[int]:
        if isinstance(prompt, (str, bytes)) or not isinstance(prompt, Sequence):
            raise InvalidTokenError(f"{what} must be a sequence of token ids, got {prompt!r}")
        if not prompt:
            raise InvalidTokenError(f"{what} is empty; a prompt needs at least one token")
        vocab = self.config.model.vocab_size
        out: list[int] = []
        for pos, token in enumerate(prompt):
            try:
                value = -1 if isinstance(token, bool) else operator.index(token)
            except TypeError:
                value = -1
            if not 0 <= value < vocab:
                raise InvalidTokenError(
                    f"{what}: position {pos} holds {token!r}, not a token id in [0, {vocab})"
                )
            out.append(value)
        return out

    def _check_fits(self, num_prompt: int, max_new_tokens: int, what: str) -> None:
        # The most tokens that ever need K/V at once: after the last decode step,
        # or when a preempted request is prefilled again (its last token has none).
        peak = num_prompt + max_new_tokens - 1
        blocks = ceil_div(peak, self.block_size)
        cfg = self.config
        if blocks > cfg.num_blocks:
            raise EngineConfigError(
                f"{what} needs {blocks} blocks of {self.block_size} tokens for {peak} tokens, "
                f"but the pool has num_blocks {cfg.num_blocks}"
            )
        if not cfg.enable_chunked_prefill and peak > cfg.max_num_batched_tokens:
            raise EngineConfigError(
                f"{what} may need a {peak}-token prefill, over max_num_batched_tokens "
                f"{cfg.max_num_batched_tokens}; enable chunked prefill or raise the budget"
            )

    def _prepare(self, prompt: Sequence[int], max_new_tokens: object, what: str) -> list[int]:
        tokens = self._check_prompt(prompt, what)
        if type(max_new_tokens) is not int or max_new_tokens <= 0:
            raise EngineConfigError(
                f"{what}: max_new_tokens must be a positive int, got {max_new_tokens!r}"
            )
        self._check_fits(len(tokens), max_new_tokens, what)
        return tokens

    def add_request(self, prompt: Sequence[int], max_new_tokens: int = 16) -> int:
        """Queue a request; ``step`` runs it.

        Returns:
            Its request id.

        Raises:
            InvalidTokenError: an empty prompt or a token outside ``[0, vocab_size)``.
            EngineConfigError: bad ``max_new_tokens``, or the request can never fit
                the pool (or one step, without chunked prefill).
        """
        tokens = self._prepare(prompt, max_new_tokens, "prompt")
        return self._add(tokens, max_new_tokens)

    def _add(self, tokens: list[int], max_new_tokens: int) -> int:
        request_id = self._next_id
        self._next_id += 1
        req = EngineRequest(request_id, tokens, max_new_tokens)
        self._requests[request_id] = req
        self.scheduler.add(req)
        self.stats.num_requests += 1
        self.stats.num_prompt_tokens += len(tokens)
        return request_id

    def has_unfinished_requests(self) -> bool:
        """Whether any request is waiting or running."""
        return self.scheduler.has_unfinished()

    # --------------------------------------------------------------------- steps

    def step(self) -> list[int]:
        """Schedule, compute and sample one step (a no-op when nothing is queued).

        Returns:
            Ids of the requests that finished in this step.

        Raises:
            EngineConfigError: nothing can be scheduled (see ``Scheduler.schedule``).
            AssertionError: with ``config.check_invariants``, a broken invariant.
        """
        plan = self.scheduler.schedule()
        self.stats.num_preemptions += len(plan.preempted)
        if not plan.chunks:
            return []  # nothing to run: no request is waiting or running
        if self.accounting is not None:
            for c in plan.chunks:  # a first admission's record, while it is running
                if c.request.record is None:
                    c.request.record = self.accounting.record(c.request.request_id)
        # Read the tables only now: admissions, growth and preemption of this step
        # are done, and commits may have swapped blocks since the last step.
        chunks = [
            SeqChunk(
                c.request.token_ids[c.start : c.start + c.num_tokens],
                c.start,
                self.manager.block_table(c.request.request_id),
            )
            for c in plan.chunks
        ]
        logits = self.model.forward(chunks, self.kv_cache)
        next_tokens: list[int] = torch.argmax(logits, dim=-1).tolist()
        finished = self.scheduler.update(plan, next_tokens, self._before_release)
        st = self.stats
        st.num_steps += 1
        st.max_batch_size = max(st.max_batch_size, len(chunks))
        for c in plan.chunks:
            if c.start < c.request.prefill_end:
                st.num_prefill_tokens += c.num_tokens
                if c.request.num_preemptions:
                    st.num_recomputed_tokens += c.num_tokens
            else:
                st.num_decode_tokens += c.num_tokens
        for req in finished:
            st.num_finished += 1
            st.num_hit_tokens += req.hit_tokens or 0
        if self.config.check_invariants:
            self.manager.check_invariants()
        if self.on_step is not None:
            self.on_step(self)
        return [r.request_id for r in finished]

    def _before_release(self, req: EngineRequest) -> None:
        if self.on_finish is not None:
            rid = req.request_id
            self.on_finish(
                rid, req.token_ids, self.manager.block_table(rid), req.num_computed, self.kv_cache
            )

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int] = 16
    ) -> list[RequestResult]:
        """Generate greedily for every prompt, with continuous batching.

        All prompts are validated before any is queued. Requests added earlier
        with ``add_request`` run too, but only these prompts' results return.

        Args:
            prompts: token id sequences.
            max_new_tokens: tokens to generate, for all prompts or per prompt.

        Returns:
            One result per prompt, in the order of ``prompts``.

        Raises:
            InvalidTokenError: an empty prompt or an out-of-vocabulary token.
            EngineConfigError: bad ``max_new_tokens``, or a request that can
                never fit the pool.
        """
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise InvalidTokenError(f"prompts must be a sequence of prompts, got {prompts!r}")
        if isinstance(max_new_tokens, Sequence):
            limits = list(max_new_tokens)
            if len(limits) != len(prompts):
                raise EngineConfigError(
                    f"max_new_tokens has {len(limits)} entries for {len(prompts)} prompts"
                )
        else:
            limits = [max_new_tokens] * len(prompts)
        pairs = zip(prompts, limits, strict=True)
        prepared = [self._prepare(p, n, f"prompt {i}") for i, (p, n) in enumerate(pairs)]
        ids = [self._add(tokens, n) for tokens, n in zip(prepared, limits, strict=True)]
        while self.has_unfinished_requests():
            self.step()
        results = [self.result(rid) for rid in ids]
        for rid in ids:
            del self._requests[rid]
        return results

    def result(self, request_id: int) -> RequestResult:
        """The output and accounting of a request (so far, if it is not finished).

        Requests run by ``generate`` are forgotten when it returns their results.

        Raises:
            RequestStateError: unknown request id.
        """
        req = self._requests.get(request_id)
        if req is None:
            raise RequestStateError(f"engine has no request {request_id!r}")
        rec = req.record
        return RequestResult(
            request_id=request_id,
            prompt_len=len(req.prompt),
            output_tokens=tuple(req.output),
            hit_tokens=req.hit_tokens or 0,
            computed_prefill_tokens=req.computed_prefill_tokens,
            recomputed_tokens=req.recomputed_tokens,
            matched_tokens=None if rec is None else rec.matched_tokens,
            cap_lost_tokens=None if rec is None else rec.cap_lost_tokens,
            boundary_lost_tokens=None if rec is None else rec.boundary_lost_tokens,
            num_preemptions=req.num_preemptions,
        )
