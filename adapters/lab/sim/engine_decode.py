"""The engine core's own decode time of the serving path's lone requests, as steps.

The sweep's decode runs time ``b`` concurrent requests to the slowest one's last token
at the client, so they hold the client's and the front end's stalls too: on a 2-core
CPU vLLM, five rounds timed the same run of 16 requests at 0.2 to 2.1 s. A lone
request's decode, as the engine core timed it (vLLM's
``vllm:request_decode_time_seconds``: its first token to its last, in the engine
core), holds nothing but its ``k - 1`` decode steps of one row. The serving path's
long requests (:mod:`.serving_path`) say it for each of them; :func:`decode_samples`
makes them step samples, so the step fit sees the decode step a lone request pays
(the steps a light load is made of) as the engine core paid it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .calibration import StepSample
from .serving_path import HopSample

__all__ = ["decode_samples"]


def decode_samples(lone: Sequence[HopSample]) -> list[StepSample]:
    """One step sample per request of ``lone`` whose engine decode time the server
    said: ``num_tokens - 1`` decode steps of one row, the ``j``-th reading
    ``prompt_tokens + j`` tokens (no request or streaming cost: the engine core's
    own clock)."""
    out = []
    for s in lone:
        n = s.num_tokens - 1
        if s.engine_decode_s is None or n < 1 or s.engine_decode_s <= 0:
            continue
        out.append(
            StepSample(
                prefill_tokens=0,
                prefill_pairs=0,
                num_decode=n,
                decode_context=n * s.prompt_tokens + n * (n + 1) // 2,
                seconds=s.engine_decode_s,
                num_steps=n,
            )
        )
    return out
