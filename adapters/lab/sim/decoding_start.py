"""What a lone request that goes on decoding pays to its first token, sent to an idle server.

The simulator prices a request sent to an idle engine as the time it spends outside the
engine core (drawn from the calibration's idle requests, :mod:`.serving_spread`) plus
its first step (the step model, ``wake_s`` after a pause, ``admit_s``, the front end's
share of the step) and the front end streaming its first token (``stream_token_s``).
On a 2-core CPU vLLM that priced a sweep's lone requests 2.1-2.4 ms short at TTFT p50,
whatever their prompt's length, where the calibration's own idle requests were priced
right. Those differ from a sweep's in three ways: they decode one token, so the engine
core goes idle with their token where a sweep's request keeps it busy-waiting on its
worker for the next step while the token travels back through the API server to a
client on the same cores (vLLM 0.32's CPU build schedules steps synchronously: the
first token leaves the engine core before the next step is scheduled); they came at
most 0.5 s after the previous request, never past the second after which vLLM's shm
queue readers stop busy-waiting and sleep (sweep requests sent more than 1 s after the
last one ended were priced 2.2-4.1 ms short, those within 0.3-1 s 1.1-2.6 ms); and a
``/metrics`` read came just before each.

So the calibration sends lone requests that go on decoding after pauses on both sides
of that second (:data:`~.serving_path.DECODING_PAUSES_S`, the server idling after the
read), and this module keeps what each one's client TTFT exceeds what the simulator
charges it by (:func:`decoding_excess`): its first step as priced, with the wake cost
where its pause was long enough, the admission and the front end's share, and its first
token's streaming. Their quantiles (``decoding_request_spread_s``) stand for the idle
table for a request that decodes more than one token and is sent to an idle engine; a
request drawing from it by its id (:func:`~.serving_spread.serving_delay`) meets, at the
calibration's pauses, the client TTFTs the calibration measured, by construction.
Streams the client read in one burst (:func:`~.serving_spread.is_burst`: its process
waited for a core for the whole stream) are left out, as a sweep leaves them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .replica import step_charge
from .serving_spread import is_burst

if TYPE_CHECKING:
    from .profile import CostProfile
    from .serving_path import EngineModel, HopSample

__all__ = ["decoding_excess"]


def decoding_excess(
    decoding: Sequence[HopSample], model: EngineModel, profile: CostProfile
) -> list[float]:
    """Each request of ``decoding`` (sent after the server idled ``idle_s``): its client
    TTFT less what the simulator charges it with ``profile``'s serving terms and
    ``model``'s price of its first step, but for streams read in one burst.

    The charge: the first step as :class:`~.replica.Replica` charges it
    (:func:`~.replica.step_charge`: waking where ``idle_s >= wake_after_s``, taking the
    request in, the front end busy with it for ``frontend_request_cpu_s``), plus
    ``stream_token_s``.
    """
    p = profile
    out = []
    for s in decoding:
        if is_burst(s):
            continue
        step = step_charge(
            p,
            model(s.prompt_tokens, 1)[0],
            wakes=s.idle_s >= p.wake_after_s,
            admits=True,
            frontend_busy_s=p.frontend_request_cpu_s,
        )
        out.append(s.client_ttft_s - step - p.stream_token_s)
    return out
