"""Whether a request can ever run on a pool and step budget: one check for the
reference engine and the arrival-time simulator.

A request holds K/V for at most ``prompt + max_new_tokens - 1`` tokens at once (after
its last decode step, or when a preempted request is prefilled again: its last token
never has K/V). Those blocks must fit the whole pool; and without chunked prefill
that many tokens must fit one step's budget, as vLLM's scheduler config requires
``max_num_batched_tokens >= max_model_len`` when chunked prefill is off.
"""

from __future__ import annotations

from prefixkv.indexes.validation import ceil_div

__all__ = ["unservable"]


def unservable(
    num_prompt_tokens: int,
    max_new_tokens: int,
    *,
    block_size: int,
    num_blocks: int,
    enable_chunked_prefill: bool,
    max_num_batched_tokens: int,
) -> str | None:
    """Why such a request can never run, or ``None`` when it can.

    The reason reads after the request's name: ``"needs 5 blocks of 16 tokens ..."``.
    O(1).
    """
    peak = num_prompt_tokens + max_new_tokens - 1
    blocks = ceil_div(peak, block_size)
    if blocks > num_blocks:
        return (
            f"needs {blocks} blocks of {block_size} tokens for {peak} tokens, "
            f"but the pool has num_blocks {num_blocks}"
        )
    if not enable_chunked_prefill and peak > max_num_batched_tokens:
        return (
            f"may need a {peak}-token prefill, over max_num_batched_tokens "
            f"{max_num_batched_tokens}; enable chunked prefill or raise the budget"
        )
    return None
