"""How much the serving path varies request to request, idle and busy.

``request_s`` is the median time a request spends outside the engine's steps. On a
served engine it varies: on a 2-core CPU vLLM the one-at-a-time requests of the
calibration spent 4.5-7.0 ms outside the engine core (p10-p90), and in a recorded sweep
a request sent while another one decoded reached its first token 14-96 ms later than
the step model said one time in four (the API server, the client and the engine core's
processes share the cores; the client keeps reading the other stream). A constant puts
every request at the median: the simulated p90 came out 24-34% low at 1-2 req/s.

So the calibration keeps the distribution, as quantiles (:data:`QUANTILES`) of what a
request spent outside the engine core's queue + prefill time (the client's TTFT less
vLLM's ``/metrics`` figures, :mod:`.serving_path`) and outside the streaming of its first
token (``stream_token_s``, which the simulator adds after the step):

- ``request_spread_s``: requests sent to an idle server after a pause (the idle ones;
  the short ones, sent back to back, where a profile has none);
- ``busy_request_spread_s``: requests sent while another request decodes (the busy
  ones: each streams ``k`` tokens while a long request streams meanwhile), but for
  streams the client read in one burst (:func:`is_burst`);
- ``decoding_request_spread_s``: requests that go on decoding, sent to an idle server
  (:mod:`.decoding_start`: what their first token takes beyond what the simulator
  charges their first step).

The simulator draws each request's time outside the engine from the table of the state
the engine is in when it is sent (busy: it has requests to run; the busy table falls
back to the idle one, and both to ``request_s``), and for a request sent to an idle
engine that decodes more than one token, from the decoding table where there is one.
The draw is a pure function of the request's id (:func:`draw_fraction`), so a run stays
a pure function of its inputs and two simulators of the same requests draw alike.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .serving_path import HopSample

__all__ = [
    "BURST_TPOT_S",
    "QUANTILES",
    "ServingDelay",
    "draw_fraction",
    "is_burst",
    "quantile_table",
    "serving_delay",
    "spread_at",
]

QUANTILES = tuple(k / 20 for k in range(21))
"""The probabilities a spread table gives the quantiles at: 0, 5%, ..., 100%."""


BURST_TPOT_S = 1e-4
"""A stream whose chunks reached the client this close together, on average, was read
from a backlog: the client did not read while the server streamed it (no engine
decodes a stream at 10,000 tokens a second)."""


def is_burst(sample: HopSample) -> bool:
    """Whether the client read ``sample``'s stream of several tokens in one burst
    (:data:`BURST_TPOT_S`): its own stall, not the server's time."""
    n = sample.num_tokens - 1
    return n > 0 and sample.client_decode_s / n < BURST_TPOT_S


def quantile_table(values: Sequence[float]) -> tuple[float, ...]:
    """The quantiles of ``values`` at :data:`QUANTILES` (linear between order
    statistics, numpy's default), each at least 0; empty when ``values`` is."""
    if not values:
        return ()
    import numpy as np  # a calibration's step: the simulator imports without numpy

    xs = np.maximum(np.asarray(values, dtype=float), 0.0)
    return tuple(float(x) for x in np.quantile(xs, QUANTILES))


def draw_fraction(key: str) -> float:
    """A number in ``[0, 1)`` that ``key`` fixes, uniform over keys (a hash)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, person=b"prefixkv-spread").digest()
    return int.from_bytes(digest, "little") / 2.0**64


def spread_at(table: Sequence[float], u: float) -> float:
    """The value of a quantile ``table`` (at :data:`QUANTILES`) at probability ``u``
    in ``[0, 1]``, linear between its points."""
    if len(table) != len(QUANTILES):
        raise ValueError(f"a spread table has {len(QUANTILES)} quantiles, got {len(table)}")
    pos = min(max(u, 0.0), 1.0) * (len(table) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(table) - 1)
    return float(table[lo] + (table[hi] - table[lo]) * (pos - lo))


ServingDelay = Callable[[str, bool, bool], float]
"""``(request id, sent while the engine was busy, decodes more than one token) ->
seconds`` the request spends outside the engine before the scheduler sees it."""


def serving_delay(
    request_s: float,
    idle: Sequence[float] = (),
    busy: Sequence[float] = (),
    decoding: Sequence[float] = (),
) -> ServingDelay:
    """Each request's time outside the engine: drawn by its id from the table of the
    engine's state when it was sent (``busy`` falls back to ``idle``; sent to an idle
    engine, a request that goes on decoding draws from ``decoding`` where there is
    one), or ``request_s`` where there is no table."""
    busy = busy or idle

    def delay(request_id: str, is_busy: bool, continues: bool) -> float:
        table = busy if is_busy else (decoding if continues and decoding else idle)
        return spread_at(table, draw_fraction(request_id)) if table else request_s

    return delay
