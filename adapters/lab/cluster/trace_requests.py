"""Trace requests as the simulator's cluster requests: arrivals, and Mooncake's prefill-only mode.

Each :class:`~prefixkv.adapters.lab.traces.TraceRequest` becomes a
:class:`~prefixkv.adapters.lab.sim.SimRequest` (the prompt, the output's length;
decoded tokens are the filler token, since no later prompt quotes them in a hash-id
trace), stamped by the sim's arrival processes. ``prefill_only`` keeps one output
token, as Mooncake's cache experiments do ("restrict all request outputs to 1", FAST'25
section 5.3.2) and as its prefill pool sees requests: TTFT is then the prefill
instance's queueing plus prefill.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prefixkv.adapters.lab.sim.arrivals import with_arrivals
from prefixkv.adapters.lab.sim.requests import SimRequest, from_trace
from prefixkv.adapters.lab.traces import TraceRequest

__all__ = ["sim_requests"]


def sim_requests(
    requests: Iterable[TraceRequest],
    *,
    prefill_only: bool = False,
    request_rate: float | None = None,
    time_scale: float | None = None,
    seed: int = 0,
    closed_loop: bool = True,
) -> Iterator[SimRequest]:
    """The simulator's requests, stamped with arrival times, lazily, in arrival order.

    Closed loop, a turn names the request it follows (its ``parent``, or else the
    previous request of its ``session``) and its think time, and the cluster run
    routes it once that one finished.

    Args:
        requests: trace requests in arrival order.
        prefill_only: one output token each (Mooncake's prefill pool).
        request_rate: Poisson arrivals at this rate (seeded) instead of the trace's.
        time_scale: the trace's timestamps times this (``< 1`` is more load).
        seed: the Poisson process's seed.
        closed_loop: link each session's turns (see above); ``False``: open loop.

    Raises:
        SimSettingsError: both a rate and a scale, or a bad one.
        SimInputError: a request without an arrival where the trace's are used.
    """
    return with_arrivals(
        from_trace(
            requests, closed_loop=closed_loop, output_tokens=False, prefill_only=prefill_only
        ),
        request_rate=request_rate,
        time_scale=time_scale,
        seed=seed,
    )
