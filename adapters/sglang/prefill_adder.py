"""SGLang 0.5.23's prefill admission arithmetic, over ``PrefixCache``'s own answers.

SGLang's scheduler decides which waiting requests join a prefill batch with a
``PrefillAdder`` (``srt/managers/schedule_policy.py``) over a ``PrefillBudget``
(``srt/mem_cache/prefill_budget.py``): the free and evictable tokens of the pool
(``available_size() + evictable_size()``, read with the candidate's hit locked) less
what is promised already - the running requests' remaining decode and, for each
request admitted in this pass, its page-rounded extend, one page and its decode. This
module writes that arithmetic once, for SGLang's plain token pool (no sliding window,
Mamba state, host tier, LoRA or priority preemption), beside the cache it reads, as
:mod:`.simulated` holds the allocation steps:

    adder = PrefillAdder(cache, running, new_token_ratio=1.0,
                         rem_input_tokens=16384, rem_chunk_tokens=8192)
    if chunked is not None:
        adder.add_chunked_req(rid, fill_len, prefix_len, max_new_tokens)
    for each waiting request, matched (``prefix_len``, ``last_node``):
        if adder.budget_state() is AddReqResult.OTHER: break
        if adder.add_one_req(rid, fill_len, prefix_len, last_node, max_new_tokens,
                             num_output) is not AddReqResult.CONTINUE: break
    ... allocate adder.can_run_list (alloc_for_extend), then adder.release()

Nothing here allocates: as in SGLang, the admitted requests' pages are allocated
after the pass, and each admitted hit stays locked until then (:meth:`release`).
Pure Python: it runs once per scheduler step, not per token.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from prefixkv.adapters.errors import EngineSettingsError
from prefixkv.indexes.validation import ceil_div, check_count

from .prefix_cache import PrefixCache, PrefixNode

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "AddReqResult",
    "PrefillAdder",
    "PrefillAdmission",
    "RunningReq",
    "init_req_max_new_tokens",
]

CLIP_MAX_NEW_TOKENS = 4096
"""SGLang's ``CLIP_MAX_NEW_TOKENS`` (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``): the
admission counts at most this many tokens still to decode per request."""


class AddReqResult(Enum):
    """SGLang's ``AddReqResult``: whether the pass goes on after a request."""

    CONTINUE = "continue"
    NO_TOKEN = "no_token"
    OTHER = "other"


class RunningReq(NamedTuple):
    """A running request as the adder counts it (SGLang reads ``req.sampling_params``
    and ``req.output_ids``).

    Attributes:
        max_new_tokens: its ``sampling_params.max_new_tokens`` (after
            :func:`init_req_max_new_tokens`).
        num_output: its output tokens so far (``len(req.output_ids)``).
        ignore_eos: a fixed-length request: its decode is reserved whole, not
            scaled by the new-token ratio.
    """

    max_new_tokens: int
    num_output: int
    ignore_eos: bool = True


class PrefillAdmission(NamedTuple):
    """A request the pass admitted (an entry of SGLang's ``can_run_list``).

    Attributes:
        rid: its id.
        prefix_len: the cached tokens it starts from.
        extend_len: the tokens this step computes (``req.extend_input_len``).
        is_chunked: the prompt continues next step (``new_chunked_req``).
        lock: the lock the adder holds on its hit (``None`` for a continuing
            chunked request, which holds its own), released by :meth:`PrefillAdder.release`.
    """

    rid: str
    prefix_len: int
    extend_len: int
    is_chunked: bool
    lock: PrefixNode | None


def init_req_max_new_tokens(
    input_len: int, max_new_tokens: int, *, page_size: int, max_total_num_tokens: int
) -> int:
    """A request's ``max_new_tokens`` as SGLang sets it on arrival
    (``Scheduler.init_req_max_new_tokens`` with ``BaseTokenToKVPoolAllocator
    .max_new_tokens_for_memory``): at most ``max_req_len - input_len - 1``, where
    ``max_req_len = max_total_num_tokens - 1``, and at most what an empty pool holds
    after the page-rounded prompt and one page. So clipped, a request alone on the
    pool always passes :meth:`PrefillAdder.add_one_req`.
    """
    max_req_len = max_total_num_tokens - 1
    paged_input = ceil_div(input_len, page_size) * page_size
    clipped = max(0, min(max_new_tokens, max_req_len - input_len - 1))
    return max(0, min(clipped, max_total_num_tokens - paged_input - page_size - 1))


class PrefillAdder:
    """One prefill pass's admission budget (SGLang's ``PrefillAdder`` with the plain
    ``PrefillBudget``).

    Args:
        cache: the prefix cache whose ``available_size() + evictable_size()`` the
            budget reads live.
        running: the running batch (SGLang's ``running_batch.reqs``; the unfinished
            chunked request is not in it).
        new_token_ratio: SGLang's ``new_token_ratio``: the share of a running request's
            remaining decode that is reserved (``ignore_eos`` requests: all of it).
        rem_input_tokens: SGLang's ``max_prefill_tokens``: tokens one prefill batch
            may compute (the first request may exceed it).
        rem_chunk_tokens: SGLang's ``chunked_prefill_size``, or ``None`` without
            chunked prefill.

    Raises:
        EngineSettingsError: a budget that is not a positive int, or a ratio that is
            not a number in ``[0, 1]``.
    """

    def __init__(
        self,
        cache: PrefixCache,
        running: list[RunningReq] | tuple[RunningReq, ...],
        *,
        new_token_ratio: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
    ) -> None:
        if type(new_token_ratio) not in (int, float) or not 0 <= new_token_ratio <= 1:
            raise EngineSettingsError(
                f"new_token_ratio must be a number in [0, 1], got {new_token_ratio!r:.60}"
            )
        self.rem_input_tokens = check_count(
            "rem_input_tokens", rem_input_tokens, lo=1, error=EngineSettingsError
        )
        self.rem_chunk_tokens: int | None = (
            None
            if rem_chunk_tokens is None
            else check_count("rem_chunk_tokens", rem_chunk_tokens, lo=1, error=EngineSettingsError)
        )
        self.cache = cache
        self.page_size = cache.page_size
        self.new_token_ratio = new_token_ratio
        self.can_run_list: list[PrefillAdmission] = []
        self.new_chunked_req: PrefillAdmission | None = None
        # PrefillBudget: tokens promised (total) and promised for this step (current).
        self.total_offset: float = 0
        self.current_offset = 0
        self.total_offset += sum(self.running_request_total_token_offset(r) for r in running)

    # ----------------------------------------------------------- the budget

    def running_request_total_token_offset(self, req: RunningReq) -> float:
        """SGLang's ``_get_running_request_total_token_offset``: a running request's
        remaining decode, clipped, times the ratio (1 for ``ignore_eos``)."""
        ratio = 1.0 if req.ignore_eos else self.new_token_ratio
        return min(req.max_new_tokens - req.num_output, CLIP_MAX_NEW_TOKENS) * ratio

    def _available_and_evictable(self) -> int:
        cache = self.cache
        return cache.available_size() + cache.evictable_size()

    @property
    def rem_total_tokens(self) -> float:
        """``PrefillBudget.remaining_total``: free plus evictable tokens less every
        promise (decode included)."""
        return self._available_and_evictable() - self.total_offset

    @property
    def cur_rem_tokens(self) -> int:
        """``PrefillBudget.remaining_current``: less this step's promises only."""
        return self._available_and_evictable() - self.current_offset

    def ceil_paged_tokens(self, tokens: int) -> int:
        """``tokens`` rounded up to whole pages."""
        return ceil_div(tokens, self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        """SGLang's ``budget_state``: ``NO_TOKEN`` when the pool is promised away,
        ``OTHER`` when the step's token budgets are spent, else ``CONTINUE``."""
        if not (self.rem_total_tokens > 0 and self.cur_rem_tokens > 0):
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, extend_input_len: int, max_new_tokens: int) -> None:
        # SGLang's _update_prefill_budget and PrefillBudget.reserve: the KV budgets take
        # the page-rounded extend plus one page (the allocator may use one more page),
        # the total one also the decode; the compute budgets the page-rounded extend.
        extend = self.ceil_paged_tokens(extend_input_len)
        immediate = extend + self.page_size
        self.total_offset += immediate + max_new_tokens
        self.current_offset += immediate
        self.rem_input_tokens -= extend
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend

    # ------------------------------------------------------------ admission

    def add_chunked_req(
        self, rid: str, fill_len: int, prefix_len: int, max_new_tokens: int
    ) -> PrefillAdmission:
        """SGLang's ``add_chunked_req``: the unfinished chunked request's next chunk,
        as much as the chunk budget and the pool allow (never nothing: it must make
        progress to release its pages); its decode is reserved with its last chunk.

        Args:
            rid: its id.
            fill_len: prompt (plus output before a retraction) tokens in all.
            prefix_len: tokens computed so far.
            max_new_tokens: its ``sampling_params.max_new_tokens``.

        Returns:
            Its admission (appended to :attr:`can_run_list`); ``is_chunked`` when the
            prompt goes on after this chunk.

        Raises:
            EngineSettingsError: the adder has no chunk budget (chunked prefill off).
        """
        chunk_limit = self.rem_chunk_tokens
        if chunk_limit is None:
            raise EngineSettingsError("a chunked request needs rem_chunk_tokens (chunked prefill)")
        # PrefillBudget.available_chunk_tokens
        available = min(chunk_limit, int(self.rem_total_tokens))
        rem_tokens = available if available > 0 else chunk_limit
        extend = fill_len - prefix_len
        truncated = extend > rem_tokens
        new_len = min(extend, rem_tokens)
        adm = PrefillAdmission(rid, prefix_len, new_len, truncated, None)
        self.can_run_list.append(adm)
        self._update_prefill_budget(
            new_len, 0 if truncated else min(max_new_tokens, CLIP_MAX_NEW_TOKENS)
        )
        return adm

    def add_one_req(
        self,
        rid: str,
        fill_len: int,
        prefix_len: int,
        last_node: PrefixNode,
        max_new_tokens: int,
        num_output: int = 0,
    ) -> AddReqResult:
        """SGLang's ``add_one_req`` (``_select_prefill_admission`` and
        ``_commit_prefill_admission``) for a waiting request whose match is
        ``prefix_len`` tokens ending at ``last_node``.

        With the hit locked, the request fits when its extend, its remaining decode
        (clipped) and one page are strictly fewer than the pool's unpromised tokens;
        past the chunk budget its extend is cut to whole pages (chunked). Admitted, its
        hit stays locked and its page-rounded extend, one page and its whole decode
        (clipped; none while chunked) are promised.

        Args:
            rid: its id.
            fill_len: prompt plus output so far (``len(req.fill_ids)``).
            prefix_len: the matched tokens.
            last_node: the match's last node.
            max_new_tokens: its ``sampling_params.max_new_tokens``.
            num_output: output tokens so far (a retracted request resumes with them).

        Returns:
            ``NO_TOKEN`` (not admitted: the pool is short), ``OTHER`` (not admitted:
            the step's budget), or, once admitted, :meth:`budget_state` for the next
            request.
        """
        cache = self.cache
        max_new = min(max(max_new_tokens - num_output, 0), CLIP_MAX_NEW_TOKENS)
        extend_len = fill_len - prefix_len
        total_tokens = extend_len + max_new + self.page_size
        lock = cache.lock(last_node)  # the pin keeps the hit out of the evictable budget
        try:
            admission = self._select_prefill_admission(
                rid, prefix_len, extend_len, total_tokens, max_new_tokens
            )
        except BaseException:
            cache.unlock(lock)
            raise
        if isinstance(admission, AddReqResult):
            cache.unlock(lock)
            return admission
        adm, max_new_reserved = admission
        adm = adm._replace(lock=lock)  # admitted: the hit stays pinned until release()
        self.can_run_list.append(adm)
        if adm.is_chunked:
            self.new_chunked_req = adm
        self._update_prefill_budget(adm.extend_len, max_new_reserved)
        return self.budget_state()

    def _select_prefill_admission(
        self, rid: str, prefix_len: int, extend_len: int, total_tokens: int, max_new_tokens: int
    ) -> tuple[PrefillAdmission, int] | AddReqResult:
        # SGLang's _select_prefill_admission over PrefillBudget.check_prefill.
        input_tokens = self.ceil_paged_tokens(extend_len)
        if not total_tokens < self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        chunk_limit = self.rem_chunk_tokens
        if chunk_limit is None and self.can_run_list and input_tokens >= self.rem_input_tokens:
            return AddReqResult.OTHER  # without chunking the first may pass the cap
        # The whole decode (not what is left of it) is promised, clipped; none while
        # the prompt is chunked.
        max_new_reserved = min(max_new_tokens, CLIP_MAX_NEW_TOKENS)
        is_chunked = False
        if chunk_limit is not None and input_tokens > chunk_limit:
            ps = self.page_size
            extend_len = chunk_limit // ps * ps
            extend_len = (prefix_len + extend_len) // ps * ps - prefix_len
            if extend_len <= 0:
                return AddReqResult.OTHER
            is_chunked = True
            max_new_reserved = 0
        return PrefillAdmission(rid, prefix_len, extend_len, is_chunked, None), max_new_reserved

    def release(self) -> None:
        """Unlock the hits the admissions hold (after their pages are allocated)."""
        cache = self.cache
        for adm in self.can_run_list:
            if adm.lock is not None:
                cache.unlock(adm.lock)
        self.can_run_list = [adm._replace(lock=None) for adm in self.can_run_list]
