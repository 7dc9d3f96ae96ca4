"""The engine core's own times of the serving path's lone requests: its cost of taking a
request in, beyond the step model (which prices it at nothing, as it does not grow with
the prompt; the simulator adds it once to a step that first schedules a request), and its
decode steps, free of the client's and front end's stalls that the sweep's runs hold.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .calibration import StepSample
from .serving_path import EngineModel, HopSample

__all__ = ["decode_samples", "fit_admit_s"]


def fit_admit_s(lone: Sequence[HopSample], model: EngineModel) -> float | None:
    """The median excess (at least 0) of a lone request's engine queue + prefill time
    over ``model``'s first step; ``None`` without engine-side samples."""
    excess = [
        s.engine_ttft_s - model(s.prompt_tokens, s.num_tokens)[0]
        for s in lone
        if s.engine_ttft_s is not None
    ]
    return max(0.0, statistics.median(excess)) if excess else None


def decode_samples(lone: Sequence[HopSample]) -> list[StepSample]:
    """One sample per shape (prompt, tokens decoded) of ``num_tokens - 1`` one-row
    decode steps, the median of its engine decode times (a shape counts once)."""
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
