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

from array import array
from collections.abc import Iterable, Iterator

from prefixkv.adapters.lab.sim.arrivals import with_arrivals
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.traces import TraceRequest
from prefixkv.indexes.tokens import TOKEN_TYPECODE

__all__ = ["sim_requests"]


def _sim_requests(
    requests: Iterable[TraceRequest], prefill_only: bool, closed_loop: bool
) -> Iterator[SimRequest]:
    last: dict[str, str] = {}
    for r in requests:
        prompt = r.tokens if isinstance(r.tokens, array) else array(TOKEN_TYPECODE, r.tokens)
        output = 1 if prefill_only else max(1, len(r.output))
        after = None
        if closed_loop:
            after = r.parent or (last.get(r.session) if r.session is not None else None)
            if r.session is not None:
                last[r.session] = r.id
        think = (r.think_s or 0.0) if after is not None else 0.0
        yield SimRequest(r.id, prompt, output, r.arrival, after=after, think_s=think)


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
        _sim_requests(requests, prefill_only, closed_loop),
        request_rate=request_rate,
        time_scale=time_scale,
        seed=seed,
    )
