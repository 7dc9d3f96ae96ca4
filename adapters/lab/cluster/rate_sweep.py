"""A fleet at several request rates: every routing policy, as ``compare`` sweeps backends.

``prefixkv cluster --request-rate 1,2,4,8`` runs the experiment at the first rate,
then every policy (bounds included) at each other rate, on the first fleet size and
capacity, without faults; ``auto`` starts where the fleet has room
(:func:`fleet_start_rate`) and doubles until each policy is overloaded, at most
:data:`~prefixkv.adapters.lab.sim.rate_sweep.MAX_AUTO_RATES` rates. The walk over
rates is :func:`~prefixkv.adapters.lab.sim.rate_sweep.sweep_rates`, the overload
verdict :mod:`~prefixkv.adapters.lab.sim.load`'s: one rule for a replica and a fleet.
Each run carries the labels ``request_rate`` and ``role`` (``table`` or ``rate``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prefixkv.adapters.lab.sim.profile import CostProfile
from prefixkv.adapters.lab.sim.rate_sweep import Sizes, sweep_rates
from prefixkv.adapters.lab.sim.rate_sweep import start_rate as replica_start_rate
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.router.routing import PolicySpec

from .config import ClusterSettings
from .fleet import Fleet
from .metrics import ClusterResult
from .run import run_cluster

__all__ = ["fleet_start_rate", "is_rate_run", "run_rate_sweep"]


def fleet_start_rate(
    stats: Sizes, profile: CostProfile, max_num_batched_tokens: int, num_replicas: int
) -> float:
    """``auto``'s first rate: ``num_replicas`` times the rate one replica serves with
    room to spare (the power of two at or below one over the mean request's time
    alone on it)."""
    return num_replicas * replica_start_rate(stats, profile, max_num_batched_tokens)


def is_rate_run(res: ClusterResult) -> bool:
    """Whether ``res`` is a point of the rate sweep beyond the experiment's own rate."""
    return res.labels.get("role") == "rate"


def run_rate_sweep(
    requests: Callable[[ClusterSettings, float], Iterable[SimRequest]],
    policies: Sequence[PolicySpec],
    config: ClusterSettings,
    rates: Sequence[float],
    *,
    auto: bool = False,
    done: Sequence[ClusterResult] = (),
    fleet: Callable[[], Fleet] | None = None,
    on_run: Callable[[ClusterResult], None] | None = None,
    into: list[ClusterResult] | None = None,
) -> list[ClusterResult]:
    """Every policy at every rate (ascending), fault-free, on ``config``'s fleet.

    Args:
        requests: a fresh request stream for a fleet and a Poisson rate.
        policies: the policy (and bound) specs.
        config: the fleet (its size and capacity).
        rates: the rates, ascending (:func:`~..sim.rate_sweep.rate_schedule`).
        auto: stop each policy after its first overloaded run.
        done: runs already made; those of this fleet, without faults, with a
            ``request_rate`` label are not run again but count for ``auto``.
        fleet: makes the fleet of each run (Ray); default in-process.
        on_run: called with each new result as it finishes.
        into: each new result is appended here as it finishes (default a new list,
            returned), so Ctrl-C keeps the finished ones.
    """
    out: list[ClusterResult] = [] if into is None else into
    specs = {s.text: s for s in policies}

    def run(name: str, rate: float) -> ClusterResult:
        spec = specs[name]
        res = run_cluster(
            requests(config, rate),
            spec,
            config,
            fleet=fleet() if fleet is not None and not spec.is_bound else None,
            labels={"request_rate": rate, "role": "rate"},
        )
        if on_run is not None:
            on_run(res)
        return res

    made = {
        (r.labels["policy"], float(r.labels["request_rate"])): r
        for r in done
        if r.labels.get("request_rate") is not None
        and not r.labels["faults"]
        and r.labels["num_replicas"] == config.num_replicas
        and r.labels["capacity_tokens"] == config.capacity_tokens
    }
    for new in sweep_rates(
        list(specs), rates, run, lambda r: r.run.overloaded, auto=auto, done=made
    ):
        out.append(new)
    return out
