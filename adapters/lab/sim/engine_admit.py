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

That step also pays the front end's share of the cores while it takes the request in
(``frontend_cpu_share x`` the front end's busy time during the step, at most
``frontend_request_cpu_s``): the engine core's time already holds whatever the front
end's work cost it, so :func:`fit_admit_s` takes that charge off too. Without it the
simulator priced the calibration's own lone requests 0.3-1.8 ms above what the engine
core said they took (``frontend_cpu_share`` 0.12-0.51 of 1.8-4.1 ms) on a 2-core CPU vLLM.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from .serving_path import EngineModel, HopSample

__all__ = ["fit_admit_s"]


def fit_admit_s(
    lone: Sequence[HopSample],
    model: EngineModel,
    frontend_request_cpu_s: float = 0.0,
    frontend_cpu_share: float = 0.0,
) -> float | None:
    """Seconds the engine core's queue + prefill time of a lone request exceeds what
    the simulator prices its first step at without ``admit_s`` (the median over
    ``lone``, at least 0).

    The simulator prices that step ``step + admit_s + share x min(frontend_request_cpu_s,
    step + admit_s)`` (:class:`~.runner.Replica`: the front end takes the request in as
    the step starts); ``admit_s`` is what makes that the engine core's time.

    Args:
        lone: requests sent one at a time, back to back (the serving path's short
            ones).
        model: the step model (:func:`~.serving_path.engine_model` of the profile
            the simulator prices steps with).
        frontend_request_cpu_s: the front end's CPU seconds per request.
        frontend_cpu_share: step seconds lost per CPU second of the front end.

    Returns:
        ``None`` when no sample says the engine's side (a server without vLLM's
        ``/metrics``).
    """
    share = frontend_cpu_share
    admits = []
    for s in lone:
        if s.engine_ttft_s is None:
            continue
        step = model(s.prompt_tokens, s.num_tokens)[0]
        excess = s.engine_ttft_s - step
        # a + share x min(cpu, step + a) = excess, increasing in a: the inverse of a
        # minimum of two increasing lines is the maximum of their inverses.
        admits.append(
            max(excess - share * frontend_request_cpu_s, (excess - share * step) / (1 + share))
        )
    return max(0.0, statistics.median(admits)) if admits else None
