"""The engine core's own decode time of the serving path's lone requests, as steps.

A lone request's decode as the engine core timed it (vLLM's
``vllm:request_decode_time_seconds``) holds nothing but its one-row decode steps, free
of the client's and front end's stalls that the sweep's decode runs hold.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .calibration import StepSample
from .serving_path import HopSample

__all__ = ["decode_samples"]


def decode_samples(lone: Sequence[HopSample]) -> list[StepSample]:
    """One step sample per shape (prompt tokens, tokens decoded) of ``lone``'s requests
    whose engine decode time the server said: ``num_tokens - 1`` one-row decode steps,
    the median of their times (a shape counts once in the fit)."""
    times: dict[tuple[int, int], list[float]] = {}
    for s in lone:
        if s.engine_decode_s is not None and s.num_tokens > 1 and s.engine_decode_s > 0:
            times.setdefault((s.prompt_tokens, s.num_tokens), []).append(s.engine_decode_s)
    out = []
    for (prompt, k), seconds in times.items():
        n = k - 1
        out.append(
            StepSample(
                prefill_tokens=0,
                prefill_pairs=0,
                num_decode=n,
                decode_context=n * prompt + n * (n + 1) // 2,
                seconds=statistics.median(seconds),
                num_steps=n,
                runs=len(seconds),
            )
        )
    return out
