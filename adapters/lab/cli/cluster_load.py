"""``prefixkv cluster``'s capacity, length rule and request rates, read as ``compare``
reads them.

Each replica's pool is ``--capacity-tokens`` (or ``auto``: what vLLM sizes on the
cost profile's hardware, or on ``--model-config`` and ``--gpu-memory``,
:mod:`.model_flags`); requests longer than ``--max-model-len`` or the smallest pool
are rejected and counted before any replica sees them (:mod:`..admission`), or abort
the run (``--on-long-request abort``). ``--request-rate 1,2,4,8|auto`` becomes the
experiment's rate and the sweep's (:mod:`..sim.rate_sweep`).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from ..admission import admit
from ..sim.model_config import ModelConfig
from ..sim.profile import CostProfile
from ..sim.rate_sweep import rate_schedule, start_rate
from ..workloads import Workload
from .common import capacities, capacity_warnings
from .model_flags import admission_rule, model_line

__all__ = ["DEFAULT_CAPACITY", "Rates", "admitted", "fleet_capacities", "rates_of"]

DEFAULT_CAPACITY = 3_000_000
"""Each replica's KV tokens when none is given: Mooncake's per-node local cache."""

_BUILT_IN_RATE = 2.0
"""Requests per second for a built-in workload (it has no timestamps) when none is given."""


def fleet_capacities(
    args: argparse.Namespace, profile: CostProfile, model: ModelConfig | None
) -> list[int]:
    """Each replica's capacities in tokens: ``--capacity-tokens`` (``auto`` as vLLM
    sizes the pool), else the default. With the model flags, the sizing line is
    printed, and capacities beyond the hardware warn.

    Raises:
        CLIUsageError: ``auto`` on a profile that does not say its hardware.
    """
    caps = capacities(args, profile) if args.capacity_tokens == "auto" else None
    caps = caps or args.capacity_tokens or [DEFAULT_CAPACITY]
    sizing = model_line(args, profile, model)
    if sizing:
        print(f"capacity: {sizing}")
        for line in capacity_warnings(sorted(set(caps)), profile, args):
            print(f"prefixkv: warning: {line}", file=sys.stderr)
    return list(caps)


def admitted(
    args: argparse.Namespace,
    workload: Workload,
    model: ModelConfig | None,
    block_size: int,
    pool_tokens: int,
    profile: CostProfile,
) -> tuple[Workload, dict[str, Any]]:
    """The requests every replica can take (each must fit ``--max-model-len``, or the
    model's context, and ``pool_tokens`` alone), and the report's settings: the
    sizing, the rule and how many were rejected. The rejection note is printed.

    Raises:
        CapacityError: ``--on-long-request abort`` and a request is too long, or every
            request is.
    """
    settings: dict[str, Any] = {"capacity_model": model_line(args, profile, model)}
    rule = admission_rule(args, model, block_size, pool_tokens)
    if rule is None:
        return workload, settings
    kept, rejected = admit(workload, rule, abort=args.on_long_request == "abort")
    settings.update(admission=rule.describe(), rejected_requests=rejected.count)
    if rejected.count:
        print(f"note: {rejected.note(workload.stats.num_requests)}")
    return kept, settings


@dataclass(frozen=True, slots=True)
class Rates:
    """The experiment's Poisson rate and the sweep's.

    Attributes:
        first: the experiment's rate (``None``: the trace's timestamps).
        sweep: every rate of the sweep, ascending, ``first`` included (empty: none).
        auto: the sweep doubles until each policy is overloaded.
    """

    first: float | None
    sweep: tuple[float, ...] = ()
    auto: bool = False

    def describe(self, seed: int, time_scale: float | None) -> str:
        """``"Poisson 2/s (seed 0)"``, with the sweep; or the trace's timestamps."""
        if self.first is None:
            return f"trace timestamps x {time_scale or 1.0}"
        text = f"Poisson {self.first:g}/s (seed {seed})"
        if self.auto:
            return text + ", then doubling until each policy is overloaded"
        if self.sweep:
            return text + ", swept at " + ", ".join(f"{r:g}" for r in self.sweep) + " req/s"
        return text


def rates_of(args: argparse.Namespace, workload: Workload, profile: CostProfile) -> Rates:
    """``--request-rate`` resolved: ``auto`` starts at the first fleet size times the
    rate one replica serves with room to spare (:func:`~..sim.rate_sweep.start_rate`);
    a built-in workload without a rate gets 2 requests/s."""
    asked = args.request_rate
    if asked == "auto":
        one = start_rate(workload.stats, profile, args.max_num_batched_tokens)
        first = args.replicas[0] * one
        return Rates(first, tuple(rate_schedule(first, auto=True)), auto=True)
    if asked is None:
        return Rates(_BUILT_IN_RATE if args.trace is None else None)
    sweep = tuple(rate_schedule(asked[0], asked[1:])) if len(asked) > 1 else ()
    return Rates(asked[0], sweep)
