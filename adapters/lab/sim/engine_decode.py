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

import statistics
from collections.abc import Sequence

from .calibration import StepSample
from .serving_path import HopSample

__all__ = ["decode_samples"]


def decode_samples(lone: Sequence[HopSample]) -> list[StepSample]:
    """One step sample per shape (prompt tokens, tokens decoded) of the requests of
    ``lone`` whose engine decode time the server said: ``num_tokens - 1`` decode steps
    of one row, the ``j``-th reading ``prompt_tokens + j`` tokens, taking the median of
    their times (as the sweep keeps the median of a shape's repeats, so the shape
    counts once in the fit however many requests or rounds timed it). No request or
    streaming cost: the engine core's own clock."""
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
