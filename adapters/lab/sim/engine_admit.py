"""What a served engine's step costs for taking a new request in, beyond the step model.

The step model prices a step by its work (tokens, attention pairs, decode rows). A step
that starts a new request also takes it in: on vLLM the engine core adds it to the
scheduler and the model runner adds it to its input batch and rebuilds the batch's
metadata before the forward pass. None of that grows with the prompt, so the step model
(fitted mostly to decode steps) prices it at nothing: on a 2-core CPU vLLM a lone
8-token request spent 7.8 ms in the engine core's queue + prefill
(``vllm:request_queue_time_seconds`` + ``vllm:request_prefill_time_seconds``), a
decode step 4-5 ms, and the step model priced its prefill step at 3.7 ms.

:func:`fit_admit_s` measures it from the serving path's one-token requests sent back
to back (:mod:`.serving_path`; not those sent after a pause, whose engine time holds
waking too, ``wake_s``): the median of what the engine core said each took (queue +
prefill) less the step model's price of its one step. The simulator adds it to a step
that first schedules a request, once a step (:class:`~.runner.Replica`): requests that
come one at a time cannot tell a cost per request from one per step, and the one per
step keeps the decode batches the step model was fitted to as they were.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .serving_path import EngineModel, HopSample

__all__ = ["fit_admit_s"]


def fit_admit_s(lone: Sequence[HopSample], model: EngineModel) -> float | None:
    """Seconds the engine core's queue + prefill time of a lone request exceeds the
    step model's price of its first step (the median over ``lone``, at least 0).

    Args:
        lone: requests sent one at a time, back to back (the serving path's short
            ones).
        model: the step model (:func:`~.serving_path.engine_model` of the profile
            the simulator prices steps with).

    Returns:
        ``None`` when no sample says the engine's side (a server without vLLM's
        ``/metrics``).
    """
    excess = [
        s.engine_ttft_s - model(s.prompt_tokens, s.num_tokens)[0]
        for s in lone
        if s.engine_ttft_s is not None
    ]
    return max(0.0, statistics.median(excess)) if excess else None
