"""The cluster report's load section: offered vs achieved rate, overload and goodput per
run, the request-rate sweep, and where each policy saturates.

Every timed run states the same figures the same way
(:class:`~prefixkv.adapters.lab.sim.load.LoadSummary`, rebuilt by
:meth:`~..sim.runs.FleetSummary.load`); a sweep adds one row per policy and rate and
one line per policy (:func:`~prefixkv.adapters.lab.sim.rate_sweep.saturation_of`).
The header lines say what the run was sized for (model and GPU, the length rule, the
requests rejected, the SLO).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cluster.metrics import ClusterResult
from ..sim.rate_sweep import saturation_of
from .markdown import Column, rate, table

__all__ = ["header_lines", "load_section"]

_HEADER_NAMES = {
    "capacity_model": "model and GPU",
    "admission": "admission",
    "rejected_requests": "rejected requests",
    "slo": "SLO",
}


def header_lines(settings: Mapping[str, Any]) -> list[str]:
    """``- model and GPU: ...`` lines for the settings given (``None`` left out)."""
    return [
        f"- {_HEADER_NAMES.get(k, k.replace('_', ' '))}: {v}"
        for k, v in settings.items()
        if v is not None and v != ""
    ]


LOAD_COLUMNS: tuple[Column, ...] = tuple(
    (header, "-", "")
    for header in (
        "policy", "request rate", "req/s offered", "sent", "achieved", "goodput",
        "TTFT p50 (s)", "TTFT p90 (s)", "hit ratio", "verdict",
    )
)  # fmt: skip
"""The load table's columns (their meanings are the paragraph under it)."""


def _num(value: float | None) -> str:
    return "-" if value is None else rate(value)


def load_section(results: Sequence[ClusterResult], key: tuple[Any, ...]) -> list[str]:
    """The load table of the fault-free runs of fleet ``key`` (replicas, capacity),
    by policy then request rate, and each policy's saturation when rates were swept."""
    runs = [
        r
        for r in results
        if not r.labels["faults"] and (r.labels["num_replicas"], r.labels["capacity_tokens"]) == key
    ]
    if not runs:
        return []
    order = {p: k for k, p in enumerate(dict.fromkeys(r.labels["policy"] for r in runs))}
    runs.sort(key=lambda r: (order[r.labels["policy"]], r.labels.get("request_rate") or 0.0))
    rates = {r.labels.get("request_rate") for r in runs}
    slo = next((r.run.slo for r in runs if r.run.slo), "")
    title = "## Load" + (" and the request-rate sweep" if len(rates) > 1 else "")
    rows = []
    for r in runs:
        run, load = r.run, r.run.load()
        verdict = "overloaded" if load.overloaded else "held back" if load.held_back else "ok"
        rows.append(
            [r.labels["policy"], _num(r.labels.get("request_rate")), _num(load.offered_rate),
             _num(load.sent_rate), _num(load.achieved_rate), _num(load.goodput),
             _num(run.ttft_p50_s), _num(run.ttft_p90_s), f"{run.hit_ratio:.3f}", verdict]
        )  # fmt: skip
    lines = [
        f"{title} at {key[0]} replicas x {key[1]:,} tokens each",
        "",
        table(LOAD_COLUMNS, rows),
        "",
        "Request rate: the Poisson rate asked for (`-`: the trace's timestamps). Offered: "
        "requests per second of the arrival window asked for; sent: as sent (closed loop, a "
        "session's turn waits for its previous answer plus think time: `held back`); "
        "achieved: finished per second from the first arrival to the last finish. "
        "`overloaded`: the achieved rate falls more than 10% short of the sent rate and "
        "queueing grows by more than 0.1 s per s of run (queues grow without bound). "
        + (
            f"Goodput: finished requests per second meeting the SLO ({slo}), as "
            "`vllm bench serve --goodput`."
            if slo
            else "Goodput needs an SLO (`--slo-ttft`, `--slo-tpot`, `--slo-e2el`)."
        ),
        "",
    ]
    if len(rates) > 1:
        points = [
            (r.labels["policy"], float(r.labels["request_rate"]), r.run.load())
            for r in runs
            if r.labels.get("request_rate") is not None
        ]
        lines += [f"- {s.describe()}" for s in saturation_of(points)] + [""]
    return lines
