"""The routing-policy interface, the context a decision sees, and policy specs.

A policy is one method, ``choose(ctx) -> Worker``, over a :class:`RouteContext`: the
routable workers, each one's predicted overlap (matched blocks, from the policy's
cluster index) and booked load, the request's keys and size, the cost profile and a
seeded random generator. The router builds the context, calls the policy, then
reserves load and tells the index, so a policy holds no cluster state of its own
(round robin's counter and a hash ring are its only memory).

A policy spec names a policy, optionally the index it reads, and its parameters:
``name[@index][:key=value]...``, e.g. ``dynamo:temperature=0.5`` or
``sglang@radix``. ``pooled`` and ``infinite`` name the two bounds.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from .cluster_index import ClusterIndex
from .errors import UnknownPolicyError
from .keys import RouteKeys, Worker
from .load import LoadTracker

__all__ = [
    "BOUNDS",
    "INDEX_KINDS",
    "INDEX_OPTIONS",
    "CostModel",
    "PolicySpec",
    "RouteContext",
    "RoutingPolicy",
    "parse_policies",
    "parse_policy",
]

BOUNDS = ("pooled", "infinite")
"""Not policies: one shared cache of N x capacity (Mooncake's pooled "global cache"),
and one with no capacity limit (the trace's theoretical hit ratio)."""

INDEX_KINDS = ("chained", "radix", "approx")
"""Cluster indexes a policy can read."""

INDEX_OPTIONS = ("ttl", "max_blocks")
"""Spec parameters that configure the index (the approximate one), not the policy."""


class CostModel(Protocol):
    """What the router prices prefill with: the lab's ``CostProfile`` is one.

    The router books each request's uncached prefill in these seconds (Mooncake's
    queue time); Mooncake's policy adds one step's fixed cost to estimate TTFT.
    """

    @property
    def step_s(self) -> float:
        """Fixed seconds per engine step."""
        ...

    def prefill_s(self, num_tokens: int, num_cached: int = 0) -> float:
        """Seconds to prefill ``num_tokens`` tokens after ``num_cached`` cached ones."""
        ...


@dataclass(slots=True)
class RouteContext:
    """What one routing decision sees.

    Attributes:
        now: virtual seconds.
        request_id: the request.
        keys: its block keys.
        num_tokens: prompt tokens.
        output_len: tokens it will generate (the router knows ``max_tokens``).
        candidates: workers it may go to, in fleet order (never empty).
        overlap: predicted cached blocks per candidate holding any (empty for
            policies without an index).
        loads: booked load and reported gauges per worker.
        cluster_index: the cluster index the policy reads, or ``None``.
        block_size: tokens per block.
        profile: the cost model (Mooncake's TTFT estimate).
        rng: the router's seeded random generator (ties, sampling).
    """

    now: float
    request_id: str
    keys: RouteKeys
    num_tokens: int
    output_len: int
    candidates: list[Worker]
    overlap: dict[Worker, int]
    loads: LoadTracker
    cluster_index: ClusterIndex | None
    block_size: int
    profile: CostModel
    rng: random.Random

    def cached_tokens(self, worker: Worker) -> int:
        """Predicted hit in tokens: matched blocks, capped as admission caps (len - 1)."""
        blocks = min(self.overlap.get(worker, 0), (self.num_tokens - 1) // self.block_size)
        return blocks * self.block_size

    def match_rate(self) -> float:
        """Longest predicted hit over the prompt (Ray's and SGLang's ``match_rate``)."""
        best = max((self.cached_tokens(w) for w in self.candidates), default=0)
        return best / self.num_tokens if self.num_tokens else 0.0


@runtime_checkable
class RoutingPolicy(Protocol):
    """Picks a worker for one request."""

    name: str

    def choose(self, ctx: RouteContext) -> Worker:
        """The worker ``ctx.request_id`` goes to (one of ``ctx.candidates``)."""
        ...


class PolicySpec(NamedTuple):
    """A parsed policy spec.

    Attributes:
        name: the policy (or bound) name.
        index_kind: the cluster index it reads (``None``: its default, or none).
        params: policy parameters.
        index_params: index parameters (``ttl``, ``max_blocks``).
        text: the spec as written (the run's label).
    """

    name: str
    index_kind: str | None
    params: dict[str, Any]
    index_params: dict[str, Any]
    text: str

    @property
    def is_bound(self) -> bool:
        """Whether it names a bound rather than a policy."""
        return self.name in BOUNDS


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("inf", "infinity"):
        return math.inf
    if low in ("none", "off"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_policy(text: str, known: tuple[str, ...]) -> PolicySpec:
    """Parse ``name[@index][:key=value]...``.

    Raises:
        UnknownPolicyError: an unknown name or index, or a malformed parameter.
    """
    head, *pairs = text.strip().split(":")
    name, _, index = head.partition("@")
    if name not in known and name not in BOUNDS:
        raise UnknownPolicyError(
            f"unknown routing policy {name!r}; known: {', '.join(known + BOUNDS)}"
        )
    if index and index not in INDEX_KINDS:
        raise UnknownPolicyError(
            f"unknown cluster index {index!r} in {text!r}; known: {', '.join(INDEX_KINDS)}"
        )
    params: dict[str, Any] = {}
    index_params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UnknownPolicyError(f"policy parameter {pair!r} in {text!r} is not key=value")
        (index_params if key in INDEX_OPTIONS else params)[key] = _value(value)
    return PolicySpec(name, index or None, params, index_params, text.strip())


def parse_policies(text: str, known: tuple[str, ...]) -> list[PolicySpec]:
    """Parse a comma-separated list of specs (see :func:`parse_policy`)."""
    specs = [parse_policy(part, known) for part in text.split(",") if part.strip()]
    if not specs:
        raise UnknownPolicyError("no routing policy given")
    return specs
