"""A served engine's cost of taking a new request in, beyond the step model.

It does not grow with the prompt, so the step model prices it at nothing; the simulator
adds it once to a step that first schedules a request.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .serving_path import EngineModel, HopSample

__all__ = ["fit_admit_s"]


def fit_admit_s(lone: Sequence[HopSample], model: EngineModel) -> float | None:
    """The median excess (at least 0) of a lone request's engine queue + prefill time
    over ``model``'s first step; ``None`` without engine-side samples."""
    excess = [
        s.engine_ttft_s - model(s.prompt_tokens, s.num_tokens)[0]
        for s in lone
        if s.engine_ttft_s is not None
    ]
    return max(0.0, statistics.median(excess)) if excess else None
