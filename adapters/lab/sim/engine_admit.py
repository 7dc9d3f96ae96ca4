"""What a served engine's step costs for taking a new request in, beyond the step model.

Taking a request in (the scheduler and input-batch bookkeeping) does not grow with the
prompt, so the step model prices it at nothing. :func:`fit_admit_s` measures it from the
serving path's one-token requests sent back to back; the simulator adds it once to a
step that first schedules a request (:class:`~.runner.Replica`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .serving_path import EngineModel, HopSample

__all__ = ["fit_admit_s"]


def fit_admit_s(lone: Sequence[HopSample], model: EngineModel) -> float | None:
    """The median seconds (at least 0) the engine core's queue + prefill time of a lone
    request exceeds ``model``'s price of its first step; ``None`` when no sample says
    the engine's side (a server without vLLM's ``/metrics``)."""
    excess = [
        s.engine_ttft_s - model(s.prompt_tokens, s.num_tokens)[0]
        for s in lone
        if s.engine_ttft_s is not None
    ]
    return max(0.0, statistics.median(excess)) if excess else None
