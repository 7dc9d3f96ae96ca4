"""Requests an engine would refuse for their length, rejected where they come in.

vLLM answers 400 to a request whose prompt plus ``max_tokens`` exceed ``max_model_len``,
and never runs one whose KV cannot fit the whole pool alone; the server goes on with
the others. :func:`admit` does the same to a workload before any replica sees it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from prefixkv.adapters.servable import unservable

from .backends import CapacityError, check_positive
from .sim.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS
from .traces import TraceRequest, TraceSource, TraceStats
from .workloads import Workload

__all__ = ["AdmissionRule", "admit", "length_rule"]

_NAMED = 5  # rejected requests named in the note


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    """What a request must fit: prompt plus output tokens at most ``max_model_len``, and
    alone a KV pool of ``pool_tokens`` in blocks of ``block_size`` (the coarsest of the
    backends) with chunked prefill under ``max_num_batched_tokens`` (``None``: no limit)."""

    max_model_len: int | None = None
    pool_tokens: int | None = None
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS

    def reason(self, prompt_tokens: int, output_tokens: int) -> str | None:
        """Why a request of these sizes is refused, or ``None``."""
        output = max(1, output_tokens)  # an engine decodes at least one token
        if self.max_model_len is not None and prompt_tokens + output > self.max_model_len:
            return (
                f"{prompt_tokens:,} prompt + {output:,} output tokens exceed max_model_len "
                f"{self.max_model_len:,}"
            )
        if self.pool_tokens is None:
            return None
        why = unservable(
            prompt_tokens,
            output,
            block_size=self.block_size,
            num_blocks=self.pool_tokens // self.block_size,
            enable_chunked_prefill=True,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )
        return None if why is None else f"{prompt_tokens:,} prompt + {output:,} output tokens {why}"

    def describe(self) -> str:
        """``"prompt + output <= max_model_len 8,192, and alone in the KV pool (capacity
        467,291 tokens)"``."""
        parts = []
        if self.max_model_len is not None:
            parts.append(f"prompt + output <= max_model_len {self.max_model_len:,}")
        if self.pool_tokens is not None:
            parts.append(f"alone in the KV pool (capacity {self.pool_tokens:,} tokens)")
        return ", and ".join(parts) or "no limit"


def length_rule(
    max_model_len: int | None,
    pool_tokens: int | None,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> AdmissionRule | None:
    """The rule of ``max_model_len`` and the smallest pool any run uses, or ``None``
    when neither bounds anything; a bound that is not a positive int is a CompareError."""
    for name, value in (
        ("max_model_len", max_model_len),
        ("pool_tokens", pool_tokens),
        ("block_size", block_size),
        ("max_num_batched_tokens", max_num_batched_tokens),
    ):
        if value is not None:
            check_positive(name, value)
    if max_model_len is None and pool_tokens is None:
        return None
    return AdmissionRule(max_model_len, pool_tokens, block_size, max_num_batched_tokens)


@dataclass(slots=True)
class Rejections:
    """The requests a workload lost to its rule: how many, their prompt tokens, and
    the first few as ``"id (why)"``."""

    rule: AdmissionRule
    count: int = 0
    prompt_tokens: int = 0
    named: list[str] = field(default_factory=list)

    def note(self, total: int) -> str:
        """The report's line: how many were rejected, why, and the first ones."""
        left = self.count - len(self.named)
        more = f"; and {left:,} more" if left > 0 else ""
        return (
            f"{self.count:,} of {total:,} requests rejected before scheduling, as vLLM "
            f"refuses them (a 400, not an abort), for their length: each must fit "
            f"{self.rule.describe()}. Their {self.prompt_tokens:,} prompt tokens are out of "
            f"every figure. Rejected: {'; '.join(self.named)}{more} (--on-long-request "
            "abort stops instead)"
        )


@dataclass(frozen=True, slots=True, eq=False)
class _Admitted:
    """The requests of ``source`` that ``rule`` admits, re-iterable (a trace streams)."""

    source: Iterable[TraceRequest]
    rule: AdmissionRule

    def __iter__(self) -> Iterator[TraceRequest]:
        reason = self.rule.reason
        return (r for r in self.source if reason(len(r.tokens), len(r.output)) is None)


def admit(
    workload: Workload, rule: AdmissionRule, *, abort: bool = False
) -> tuple[Workload, Rejections]:
    """The workload without the requests ``rule`` refuses (unchanged when none is), and
    what was refused; a trace's sizes are read without building tokens.

    Raises:
        CapacityError: ``abort`` and a request is refused, or every request is.
    """
    rejected = Rejections(rule)
    stats = TraceStats()
    requests = workload.requests
    if isinstance(requests, TraceSource):
        sizes = ((s.id, s.prompt_tokens, s.output_tokens) for s in requests.sizes())
    else:
        sizes = ((r.id, len(r.tokens), len(r.output)) for r in requests)
    for rid, prompt, output in sizes:
        why = rule.reason(prompt, output)
        if why is None:
            stats.add(prompt, output)
            continue
        if abort:
            raise CapacityError(
                f"{workload.name}: request {rid!r} is too long: {why} (--on-long-request "
                "reject, the default, counts such requests as vLLM rejects them)"
            )
        rejected.count += 1
        rejected.prompt_tokens += prompt
        if len(rejected.named) < _NAMED:
            rejected.named.append(f"{rid} ({why})")
    if not rejected.count:
        return workload, rejected
    if not stats.num_requests:
        raise CapacityError(
            f"{workload.name}: all {rejected.count:,} requests are too long to fit "
            f"{rule.describe()}; the first: {rejected.named[0]}. Raise the capacity or "
            "--max-model-len"
        )
    kept = replace(
        workload,
        requests=_Admitted(workload.requests, rule),
        stats=stats.finish(),
        notes=(*workload.notes, rejected.note(workload.stats.num_requests)),
        rejected_requests=workload.rejected_requests + rejected.count,
    )
    return kept, rejected
