"""Does the cluster simulator predict the live fleet? The same trace, both ways.

:func:`simulate` sends a live run's requests (their prompts and the tokens the
servers generated, in the order sent) through ``prefixkv cluster``'s library entry,
:func:`~prefixkv.adapters.lab.cluster.run_cluster`, with the same policy, seed and
fleet (N replicas of vLLM's prefix cache, the servers' block size and KV pool, vLLM's
CPU scheduler limits) and a cost profile, and compares request by request: the
replica chosen, the cached tokens, and the hit ratios.

One at a time in both: live, each request is routed once the previous one returned
(and its events arrived); in the simulator each arrives :data:`GAP_S` after the
previous one, longer than any of them takes, so every replica is idle at every
decision there too. (Given the live send times instead, a request the profile
prices a few milliseconds slower than the server served it is still running at the
next arrival, and a load-aware policy sees one request in flight the live router
never saw.)

:func:`fit_profile` fits that profile on the live run's own timings (one request at
a time, so each time to first token is one prefill: ``step_s + prefill_token_s x
uncached + prefill_attention_s x pairs``; each later token one decode step), for a
sim whose bookings expire as the live ones did. Any profile file does instead.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from live_trace import LiveRequest

from prefixkv.adapters.lab.cluster import ClusterSettings, run_cluster
from prefixkv.adapters.lab.compare.k_live import percentile
from prefixkv.adapters.lab.sim.config import SimSettings
from prefixkv.adapters.lab.sim.profile import CostProfile, attention_pairs
from prefixkv.adapters.lab.sim.requests import SimRequest

if TYPE_CHECKING:
    from live_run import LiveRun, RequestRow

BLOCK_SIZE = 32
"""The servers' ``--block-size``."""

__all__ = ["GAP_S", "VLLM_CPU_SCHEDULER", "fit_profile", "simulate"]

GAP_S = 60.0
"""Virtual seconds between two arrivals in the simulator: one request at a time."""

VLLM_CPU_SCHEDULER = SimSettings(max_num_seqs=128, max_num_batched_tokens=2048)
"""vLLM 0.32's defaults for ``vllm serve`` on a CPU (``EngineArgs``: 128 sequences,
2048 batched tokens a step), chunked prefill on."""


def fit_profile(
    rows: Sequence[RequestRow], trace: Sequence[LiveRequest], *, name: str, model: str
) -> CostProfile:
    """A cost profile fitted (least absolute deviations, coefficients >= 0) on a live run."""
    u = np.array([r.prompt_tokens - r.cached_tokens for r in rows], dtype=float)
    c = np.array([r.cached_tokens for r in rows], dtype=float)
    pairs = np.array([attention_pairs(int(a), int(b)) for a, b in zip(u, c, strict=True)], float)
    ttft = np.array([r.ttft_s for r in rows])
    coef = _nonnegative_fit([np.ones_like(u), u, pairs], ttft)
    step_s, token_s, pair_s = (float(x) for x in coef)
    itl = [
        (r.e2e_s - r.ttft_s) / (req.output_len - 1)
        for r, req in zip(rows, trace, strict=True)
        if req.output_len > 1
    ]
    decode_s = max(0.0, float(np.median(itl)) - step_s) if itl else 0.0
    residual = ttft - np.column_stack([np.ones_like(u), u, pairs]) @ coef
    return CostProfile(
        name=name,
        model=f"{model} (vllm serve, dummy weights)",
        device="this machine's CPU, shared",
        step_s=step_s if step_s > 0 else 1e-6,
        prefill_token_s=token_s,
        prefill_attention_s=pair_s,
        decode_seq_s=decode_s,
        decode_context_s=0.0,
        source="benchmarks/serve/live_fleet.py: client-timed TTFT and inter-token time, "
        "one request at a time",
        notes="TTFT includes HTTP; decode is one median inter-token time",
        fit={
            "requests": len(rows),
            "ttft_residual_p50_ms": float(np.median(np.abs(residual)) * 1e3),
            "uncached_tokens": [float(u.min()), float(u.max())],
        },
    )


def _nonnegative_fit(columns: list[Any], y: Any) -> Any:
    """Least absolute deviations (reweighted least squares), dropping (zeroing) any
    column whose coefficient comes out < 0. Absolute, not squared: on a shared machine
    a few requests wait hundreds of milliseconds for a core, and squares would let
    them set every coefficient."""
    keep = list(range(len(columns)))
    while True:
        a = np.column_stack([columns[k] for k in keep])
        weights = np.ones_like(y)
        for _ in range(50):
            sol, *_ = np.linalg.lstsq(a * weights[:, None], y * weights, rcond=None)
            weights = 1.0 / np.sqrt(np.maximum(np.abs(y - a @ sol), 1e-4))
        coef = np.zeros(len(columns))
        coef[keep] = sol
        negative = [k for k, v in zip(keep, sol, strict=True) if v < 0]
        if not negative:
            return coef
        keep.remove(negative[0])
        if not keep:
            return coef * 0


def simulate(
    run: LiveRun,
    trace: Sequence[LiveRequest],
    profile: CostProfile,
    *,
    num_servers: int,
    capacity_tokens: int = 1 << 20,
    seed: int = 0,
) -> dict[str, Any]:
    """``run``'s requests through the simulator; how far it agrees with the live run.

    Returns:
        policy, requests, decisions equal (replica chosen), hits equal (cached tokens
        per request), both hit ratios and the gap in points, both TTFT p50s.
    """
    requests = [
        SimRequest(req.id, req.prompt, req.output_len, i * GAP_S, array("I", row.output))
        for i, (req, row) in enumerate(zip(trace, run.rows, strict=True))
    ]
    config = ClusterSettings(
        num_replicas=num_servers,
        capacity_tokens=capacity_tokens,
        backend="hash_chain",
        block_size=BLOCK_SIZE,
        sim=VLLM_CPU_SCHEDULER,
        profile=profile,
        seed=seed,
    )
    result = run_cluster(requests, run.policy, config)
    sim = {rr.request_id: rr for rr in result.requests}
    live_ratio = run.hit_ratio_usage()
    sim_ratio = result.run.hit_ratio
    differ = [row.id for row in run.rows if sim[row.id].replica != row.replica]
    hits = sum(sim[r.id].hit_tokens == r.cached_tokens for r in run.rows)
    return {
        "policy": run.policy,
        "requests": len(run.rows),
        "decisions_equal": f"{len(run.rows) - len(differ)}/{len(run.rows)}",
        "decisions_differ": differ,
        "hits_equal": f"{hits}/{len(run.rows)}",
        "hit_ratio_live": live_ratio,
        "hit_ratio_sim": sim_ratio,
        "hit_gap_points": abs(sim_ratio - live_ratio) * 100,
        "ttft_p50_live_ms": percentile([r.ttft_s for r in run.rows], 50) * 1e3,
        "ttft_p50_sim_ms": percentile(
            [rr.first_token_s - rr.arrival_s for rr in result.requests], 50
        )
        * 1e3,
        "profile": profile.name,
    }
