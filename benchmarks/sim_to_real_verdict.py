"""The sim-to-real table's verdict: per rate, "within 10%" or why not, in words.

A rate below saturation is held to 10% at TTFT and TPOT p50 and p90. Where an error is
larger, the verdict says which and names what the recording shows about it, each from
the measured requests alone (nothing is fitted to them):

- **the client stalled**: over a tenth of the requests were sent late or read in one
  burst by the load generator, which shares the cores with the server; what is left
  is not the server's pace;
- **the server drifted**: TPOT p50 is off the same way as the TTFT error, so the
  server's steps ran faster or slower than the calibration measured them;
- **the busy tail**: TTFT p90 is low and most of the measured top decile was sent
  while another request was running (the client's view: sent before it ended);
  their TTFT p90, measured and simulated, says how long the tail is, and what the
  calibration's busy requests showed of it (one-token ones show nothing: their
  stream ends with the token they wait on). Where the server is vLLM's CPU build
  with its worker bound to cores (its log says ``reserved_cpus=``), the verdict
  names what ``tests/serve/harness/serving_hops.py`` measured there: the engine core
  and its worker busy-wait on their shared-memory queue (``sched_yield()`` in a loop)
  while a request decodes, holding the cores the API server and the client need, so
  a decoding request's first token reaches the client late; with those waits napping
  instead the delay all but went;
- **idle requests**: TTFT p50 is off; the requests sent to an idle server, measured
  and simulated (the serving path and the prefill step, no queue), and what priced
  their first token: the calibration's lone requests that went on decoding (their p50
  beyond the charged step), or, in a profile made before they were sent, its one-token
  requests (a request that goes on decoding paid 2.1-2.4 ms more on a CPU vLLM);
- **pace from request to request**: TPOT p90 is off by over 10 points more than p50
  is; the ratio of TPOT p90 to p50, measured and simulated (the step model prices
  every step of a shape alike; the server's pace varies from one request to the
  next).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["BURST_STALL", "BUSY_WAIT", "WITHIN", "busy_at_send", "busy_waits", "verdict"]

WITHIN = 0.10
"""The error the simulator is held to at p50 and p90 below saturation."""


BUSY_WAIT = (
    "vLLM's CPU engine core and worker busy-wait on their shared-memory queue while a "
    "request decodes (sched_yield in a loop), holding the cores the API server and the "
    "client need: a decoding request's first token reaches the client late "
    "(tests/serve/harness/serving_hops.py, with and without the busy-wait)"
)
"""The mechanism the busy tail has on a CPU vLLM whose worker is bound to cores."""


BURST_STALL = "on this server mostly the busy-wait's stall, not the client's"
"""What a stream read in one burst is where the server busy-waits: with the busy-wait
napping instead, such bursts all but went, the client unchanged."""


def busy_waits(server_log: str) -> bool:
    """Whether ``server_log`` is a vLLM CPU server's whose worker's threads are bound
    to cores and the rest reserved (its OpenMP binding lines), the set-up where
    :data:`BUSY_WAIT` was measured."""
    return "OpenMP thread binding" in server_log and "reserved_cpus=" in server_log


def busy_at_send(sent: Sequence[float], latency: Sequence[float]) -> list[bool]:
    """Per request, whether another one was running when it was sent (sent before it
    and not yet done), as the client saw them. O(n log n)."""
    order = sorted(range(len(sent)), key=lambda k: sent[k])
    out = [False] * len(sent)
    latest_end = -math.inf
    for k in order:
        out[k] = latest_end > sent[k]
        latest_end = max(latest_end, sent[k] + latency[k])
    return out


def _pct(values: Sequence[float], q: float) -> float:
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    pos = (len(finite) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(finite) - 1)
    return finite[lo] + (finite[hi] - finite[lo]) * (pos - lo)


def _ms(v: float) -> str:
    return f"{v * 1e3:.0f}" if v >= 0.0995 else f"{v * 1e3:.1f}"


def verdict(row: dict[str, Any], pooled: dict[str, list[Any]]) -> str:
    """What a rate's row says, below saturation (see the module docstring).

    Args:
        row: the rate's errors (``ttft_p50_error``, ...), ``client_stalls`` and
            ``requests`` (``client_bursts``: of those stalls, streams read in one
            burst); ``busy_probe_tokens`` and ``busy_probe_p90_s`` (what the
            calibration's busy requests decoded and spent outside the engine core at
            p90; absent: not said) and ``busy_wait`` (:func:`busy_waits` of the
            server's log), where known.
        pooled: the requests kept (not stalled), pooled over the runs:
            ``ttft_measured``, ``ttft_sim``, ``tpot_measured``, ``tpot_sim`` and
            ``busy`` (sent while another ran).
    """
    stalled = row["client_stalls"] > WITHIN * row["requests"]
    parts = []
    for metric in ("ttft", "tpot"):
        errors = {q: row[f"{metric}_p{q}_error"] for q in (50, 90)}
        off = {q: e for q, e in errors.items() if not math.isnan(e) and abs(e) > WITHIN}
        name = metric.upper()
        if not off:
            parts.append(f"{name} within {WITHIN:.0%}")
            continue
        said = ", ".join(f"p{q} {e:+.0%}" for q, e in off.items())
        why = [] if stalled else _why(metric, off, row, pooled)
        parts.append(f"{name} off ({said}){': ' + '; '.join(why) if why else ''}")
    text = "; ".join(parts)
    if stalled and any(p.endswith(")") for p in parts):
        share = row["client_stalls"] / row["requests"]
        bursts = row.get("client_bursts", 0)
        if row.get("busy_wait") and 2 * bursts > row["client_stalls"]:
            text += (
                f" - {share:.0%} of the requests were sent late or read in one burst, "
                f"{bursts} of {row['client_stalls']} in a burst ({BURST_STALL}): left "
                "out, what is left is not the server's pace"
            )
        else:
            text += (
                f" - the client stalled on {share:.0%} of the requests (the load generator "
                "shares the cores): what is left is not the server's pace"
            )
    return text


def _why(
    metric: str, off: dict[int, float], row: dict[str, Any], pooled: dict[str, list[Any]]
) -> list[str]:
    """The reasons the recording shows for ``metric``'s errors ``off``."""
    why = []
    tpot = row["tpot_p50_error"]
    drift = not math.isnan(tpot) and abs(tpot) > WITHIN
    pace = "slower" if tpot < 0 else "faster"
    if metric == "ttft":
        if drift and any((e < 0) == (tpot < 0) for e in off.values()):
            why.append(f"the server's steps ran {pace} than calibrated (TPOT p50 {tpot:+.0%})")
        if off.get(90, 0.0) < -WITHIN:
            why += _busy_tail(row, pooled)
        if 50 in off:
            why += _idle(row, pooled)
    else:
        if drift:
            why.append(f"the server's steps ran {pace} than calibrated")
        if 90 in off and abs(off[90]) > abs(off.get(50, 0.0)) + WITHIN:
            why += _pace(pooled)
    return why


def _busy_tail(row: dict[str, Any], pooled: dict[str, list[Any]]) -> list[str]:
    """The measured top decile of TTFT, if mostly requests sent while another ran."""
    ttft, sim, busy = pooled["ttft_measured"], pooled["ttft_sim"], pooled["busy"]
    cut = _pct(ttft, 90)
    top = [k for k, t in enumerate(ttft) if t >= cut]
    in_busy = sum(busy[k] for k in top)
    if not top or 2 * in_busy < len(top):
        return []
    b_meas = _pct([t for t, b in zip(ttft, busy, strict=True) if b], 90)
    b_sim = _pct([t for t, b in zip(sim, busy, strict=True) if b], 90)
    said = (
        f"{in_busy} of the {len(top)} slowest were sent while another request ran: those "
        f"sent so took {_ms(b_meas)} ms at p90, simulated {_ms(b_sim)} ms ("
        + _busy_probe(row)
        + ")"
    )
    return [said + (f" - {BUSY_WAIT}" if row.get("busy_wait") else "")]


def _busy_probe(row: dict[str, Any]) -> str:
    """What the calibration's busy requests showed of the busy tail."""
    tokens = row.get("busy_probe_tokens")
    p90 = row.get("busy_probe_p90_s")
    if not tokens:
        return "a tail the calibration's busy requests did not show"
    if tokens == 1:
        return (
            "the calibration's busy requests decoded one token, which shows no such tail; "
            "calibrate again"
        )
    if p90 is None or math.isnan(p90):
        return f"the calibration's busy requests streamed {tokens} tokens"
    said = (
        f"the calibration's busy requests, streaming {tokens} tokens, spent {_ms(p90)} ms "
        "outside the engine core at p90"
    )
    bursts = row.get("busy_probe_bursts") or 0
    if bursts:
        # the stall a sweep shows as a late first token, held to the stream's end
        said += (
            f"; {bursts} more were read in one burst, left out as a sweep's are: their "
            "first token held until their stream ended"
        )
    return said


def _idle(row: dict[str, Any], pooled: dict[str, list[Any]]) -> list[str]:
    busy = pooled["busy"]
    meas = [t for t, b in zip(pooled["ttft_measured"], busy, strict=True) if not b]
    sim = [t for t, b in zip(pooled["ttft_sim"], busy, strict=True) if not b]
    if not meas:
        return []
    said = f"sent to an idle server: p50 {_ms(_pct(meas, 50))} / {_ms(_pct(sim, 50))} ms"
    kept = row.get("decoding_probe_kept") or 0
    p50 = row.get("decoding_probe_p50_s", math.nan)
    if kept and not math.isnan(p50):
        said += (
            f" (their first token priced from {kept} lone decoding requests of the "
            f"calibration, {_ms(p50)} ms beyond their step at p50)"
        )
    else:
        said += (
            " (priced as the calibration's one-token requests: its profile has no lone "
            "requests that went on decoding, which paid 2.1-2.4 ms more on a CPU vLLM)"
        )
    return [said]


def _pace(pooled: dict[str, list[Any]]) -> list[str]:
    ratios = []
    for key in ("tpot_measured", "tpot_sim"):
        p50, p90 = _pct(pooled[key], 50), _pct(pooled[key], 90)
        ratios.append(p90 / p50 if p50 > 0 else math.nan)
    if any(math.isnan(r) for r in ratios):
        return []
    return [
        f"the pace varies from request to request: TPOT p90 / p50 {ratios[0]:.2f} measured, "
        f"{ratios[1]:.2f} simulated"
    ]
