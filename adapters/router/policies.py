"""The routing policies, each with the defaults its source ships.

Load-only baselines: ``random``; ``round_robin``; ``pow2`` (Ray Serve's default
request router: two random replicas, the shorter queue); ``least_outstanding``
(fewest requests in flight, or least booked prefill work with ``by=tokens``);
``prefix_hash`` (SGLang gateway's consistent hash of the first 256 tokens with
bounded load, ``load_factor`` 1.25).

Cache-aware: ``ray_pca`` (Ray 2.60 ``PrefixCacheAffinityRouter``), ``sglang``
(SGLang router ``cache_aware``), ``dynamo`` (Dynamo KV router cost), ``llmd`` (llm-d
scorers prefix : kv-usage : queue = 2 : 1 : 1, max-score picker), ``mooncake``
(Mooncake Conductor's minimum estimated TTFT). Each docstring gives the rule and the
source; the README's table lists them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

import xxhash

from .approx import ApproxIndex
from .block_tree import RadixBlockIndex
from .cluster_index import ChainedHashIndex, ClusterIndex
from .errors import ClusterSettingsError, UnknownPolicyError
from .keys import HashScheme, Worker
from .routing import PolicySpec, RouteContext, RoutingPolicy

__all__ = [
    "POLICIES",
    "DynamoCost",
    "LeastOutstanding",
    "LlmdWeighted",
    "MooncakeTTFT",
    "Pow2",
    "PrefixHash",
    "Random",
    "RayPrefixAffinity",
    "RoundRobin",
    "SGLangCacheAware",
    "make_cluster_index",
    "make_policy",
    "policy_index",
]


def _pow2(workers: Sequence[Worker], ctx: RouteContext) -> Worker:
    """Ray's power of two choices: two distinct random workers, the shorter queue."""
    if len(workers) == 1:
        return workers[0]
    a, b = ctx.rng.sample(list(workers), 2)
    load = ctx.loads.load
    return a if load(a).active_requests <= load(b).active_requests else b


def _argmin_random_ties(
    workers: Sequence[Worker], costs: Sequence[float], ctx: RouteContext
) -> Worker:
    """The cheapest worker, ties broken uniformly (Dynamo's ``minimum_cost_index``)."""
    best, best_cost, ties = 0, math.inf, 0
    for i, c in enumerate(costs):
        if c < best_cost:
            best, best_cost, ties = i, c, 1
        elif c == best_cost:
            ties += 1
            if ctx.rng.randrange(ties) == 0:
                best = i
    return workers[best]


class _Params:
    """Checks a policy's numeric parameters on construction: a real number (no bool,
    no NaN) >= 0, an int >= 1 where the default is an int, infinity only where
    ``_unbounded`` names the parameter."""

    _unbounded: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            default = f.default
            if (
                not f.init
                or isinstance(default, (bool, str))
                or not isinstance(default, (int, float))
            ):
                continue
            value = getattr(self, f.name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and isinstance(default, int) and not isinstance(default, bool):
                ok = type(value) is int and value >= 1
            elif ok:
                ok = not math.isnan(value) and value >= 0
                ok = ok and (math.isfinite(value) or f.name in self._unbounded)
            if not ok:
                raise ClusterSettingsError(
                    f"{type(self).__name__} {f.name} must be "
                    f"{'an int >= 1' if type(default) is int else 'a number >= 0'}, got {value!r}"
                )


@dataclass
class Random:
    """Uniformly random worker."""

    name: str = field(default="random", init=False)

    def choose(self, ctx: RouteContext) -> Worker:
        """A uniform pick."""
        return ctx.rng.choice(ctx.candidates)


@dataclass
class RoundRobin:
    """Workers in turn."""

    name: str = field(default="round_robin", init=False)
    _next: int = field(default=0, init=False, repr=False)

    def choose(self, ctx: RouteContext) -> Worker:
        """The next worker in fleet order."""
        worker = ctx.candidates[self._next % len(ctx.candidates)]
        self._next += 1
        return worker


@dataclass
class Pow2:
    """Power of two choices on requests in flight (Ray Serve's default router)."""

    name: str = field(default="pow2", init=False)

    def choose(self, ctx: RouteContext) -> Worker:
        """The less loaded of two random workers."""
        return _pow2(ctx.candidates, ctx)


@dataclass
class LeastOutstanding:
    """The least loaded worker: fewest requests in flight (``by="requests"``) or least
    booked prefill work (``by="tokens"``); ties taken in turn (round robin among them,
    so an idle fleet is not all sent to its first worker)."""

    by: str = "requests"
    name: str = field(default="least_outstanding", init=False)
    _next: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.by not in ("requests", "tokens"):
            raise ClusterSettingsError(
                f"least_outstanding by must be requests or tokens, got {self.by!r}"
            )

    def choose(self, ctx: RouteContext) -> Worker:
        """The minimum of the load measure."""
        load = ctx.loads.load
        cands = ctx.candidates
        k = self._next % len(cands)
        self._next += 1
        order = cands[k:] + cands[:k]
        if self.by == "requests":
            return min(order, key=lambda w: (load(w).active_requests, load(w).prefill_tokens))
        return min(order, key=lambda w: (load(w).prefill_tokens, load(w).active_requests))


@dataclass
class PrefixHash(_Params):
    """SGLang gateway ``prefix_hash``: consistent hashing with bounded load.

    The first ``prefix_tokens`` tokens are hashed (xxh3-64) onto a ring of
    ``virtual_nodes`` points per worker; the worker found is taken when its load
    (requests in flight) is at most ``load_factor`` x the mean including this request,
    else the least loaded worker that is, else the ring's worker anyway.
    """

    prefix_tokens: int = 256
    load_factor: float = 1.25
    virtual_nodes: int = 160
    name: str = field(default="prefix_hash", init=False)
    _ring: tuple[tuple[Worker, ...], list[int], list[Worker]] | None = field(
        default=None, init=False, repr=False
    )

    def _ring_for(self, workers: list[Worker]) -> tuple[list[int], list[Worker]]:
        key = tuple(workers)
        if self._ring is None or self._ring[0] != key:
            points = sorted(
                (
                    xxhash.xxh3_64_intdigest(
                        f"{w.replica}:{w.data_parallel_rank}:{w.group_idx}#{v}".encode()
                    ),
                    w,
                )
                for w in workers
                for v in range(self.virtual_nodes)
            )
            self._ring = (key, [p for p, _ in points], [w for _, w in points])
        return self._ring[1], self._ring[2]

    def choose(self, ctx: RouteContext) -> Worker:
        """The ring's worker unless overloaded."""
        hashes, owners = self._ring_for(ctx.candidates)
        h = xxhash.xxh3_64_intdigest(ctx.keys.tokens[: self.prefix_tokens].tobytes())
        worker = owners[bisect.bisect_left(hashes, h) % len(owners)]
        load = ctx.loads.load
        total = sum(load(w).active_requests for w in ctx.candidates)
        cap = (total + 1) / len(ctx.candidates) * self.load_factor
        if total == 0 or load(worker).active_requests <= cap:
            return worker
        fits = [w for w in ctx.candidates if load(w).active_requests <= cap]
        return min(fits, key=lambda w: load(w).active_requests) if fits else worker


@dataclass
class RayPrefixAffinity(_Params):
    """Ray 2.60 ``PrefixCacheAffinityRouter``.

    If the queue spread (max - min requests in flight) exceeds
    ``imbalanced_threshold`` (default: never), power of two over all workers; else the
    workers with the longest match when the match rate reaches
    ``match_rate_threshold`` (0.1), or those with the smallest cache when it does not;
    power of two within that group.
    """

    match_rate_threshold: float = 0.1
    imbalanced_threshold: float = math.inf
    name: str = field(default="ray_pca", init=False)
    _unbounded = ("imbalanced_threshold",)

    def choose(self, ctx: RouteContext) -> Worker:
        """As above."""
        cands = ctx.candidates
        queue = [ctx.loads.load(w).active_requests for w in cands]
        if max(queue) - min(queue) > self.imbalanced_threshold:
            return _pow2(cands, ctx)
        if ctx.match_rate() >= self.match_rate_threshold:
            best = max(ctx.cached_tokens(w) for w in cands)
            return _pow2([w for w in cands if ctx.cached_tokens(w) == best], ctx)
        index = ctx.cluster_index
        sizes = [index.num_blocks(w) if index is not None else 0 for w in cands]
        smallest = min(sizes)
        return _pow2([w for w, s in zip(cands, sizes, strict=True) if s == smallest], ctx)


@dataclass
class SGLangCacheAware(_Params):
    """SGLang router ``cache_aware`` (its CLI defaults: 0.3, 64, 1.5).

    Load is requests in flight. When ``max - min > balance_abs_threshold`` and
    ``max > min * balance_rel_threshold`` the least loaded worker is taken; else the
    longest match when the match rate exceeds ``cache_threshold``, else the worker
    with the smallest cache.
    """

    cache_threshold: float = 0.3
    balance_abs_threshold: float = 64.0
    balance_rel_threshold: float = 1.5
    name: str = field(default="sglang", init=False)
    _unbounded = ("balance_abs_threshold", "balance_rel_threshold")

    def choose(self, ctx: RouteContext) -> Worker:
        """As above; ties go to the first worker in fleet order."""
        cands = ctx.candidates
        load = [ctx.loads.load(w).active_requests for w in cands]
        hi, lo = max(load), min(load)
        if hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold:
            return cands[load.index(lo)]
        if ctx.match_rate() > self.cache_threshold:
            return max(cands, key=ctx.cached_tokens)
        index = ctx.cluster_index
        if index is None:
            return cands[load.index(lo)]
        return min(cands, key=index.num_blocks)


@dataclass
class DynamoCost(_Params):
    """Dynamo KV router's default cost, the cheapest worker (softmax when ``temperature``).

    ``cost = prefill_load_scale * max((booked prefill tokens + prompt) / block_size
    - overlap_score_credit * overlap, 0) + decode blocks``; with ``temperature > 0``
    a worker is sampled with probability ``exp(-normalized cost / temperature)``, the
    costs normalized to [0, 1] as Dynamo does.
    """

    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    temperature: float = 0.0
    name: str = field(default="dynamo", init=False)

    def costs(self, ctx: RouteContext) -> list[float]:
        """Each candidate's cost, in blocks."""
        bs = ctx.block_size
        out = []
        for w in ctx.candidates:
            load = ctx.loads.load(w)
            raw = (load.prefill_tokens + ctx.num_tokens) / bs
            credit = self.overlap_score_credit * ctx.overlap.get(w, 0)
            out.append(self.prefill_load_scale * max(raw - credit, 0.0) + load.decode_blocks)
        return out

    def choose(self, ctx: RouteContext) -> Worker:
        """Argmin (random ties) or a softmax sample."""
        costs = self.costs(ctx)
        if self.temperature <= 0:
            return _argmin_random_ties(ctx.candidates, costs, ctx)
        lo, hi = min(costs), max(costs)
        if lo == hi:
            return ctx.rng.choice(ctx.candidates)
        scale = -1.0 / ((hi - lo) * self.temperature)
        weights = [math.exp((c - lo) * scale) for c in costs]
        return ctx.rng.choices(ctx.candidates, weights)[0]


@dataclass
class LlmdWeighted(_Params):
    """llm-d's endpoint picker: weighted scorers, the highest total (random ties).

    Prefix: matched blocks, min-max normalized over the workers holding any (1 when
    they are equal, 0 for the others); KV usage: ``1 - usage``; queue: the engine's
    waiting queue, ``(max - q) / (max - min)`` (1 when equal). Weights 2 : 1 : 1.
    """

    prefix_weight: float = 2.0
    kv_weight: float = 1.0
    queue_weight: float = 1.0
    name: str = field(default="llmd", init=False)

    def scores(self, ctx: RouteContext) -> list[float]:
        """Each candidate's weighted score."""
        cands = ctx.candidates
        hits = {w: ctx.overlap[w] for w in cands if ctx.overlap.get(w)}
        lo_hit, hi_hit = (min(hits.values()), max(hits.values())) if hits else (0, 0)
        queues = [ctx.loads.load(w).num_waiting for w in cands]
        lo_q, hi_q = min(queues), max(queues)
        out = []
        for w, q in zip(cands, queues, strict=True):
            if w not in hits:
                prefix = 0.0
            elif hi_hit == lo_hit:
                prefix = 1.0
            else:
                prefix = (hits[w] - lo_hit) / (hi_hit - lo_hit)
            queue = 1.0 if hi_q == lo_q else (hi_q - q) / (hi_q - lo_q)
            kv = 1.0 - ctx.loads.load(w).kv_usage
            out.append(
                self.prefix_weight * prefix + self.kv_weight * kv + self.queue_weight * queue
            )
        return out

    def choose(self, ctx: RouteContext) -> Worker:
        """The maximum score."""
        return _argmin_random_ties(ctx.candidates, [-s for s in self.scores(ctx)], ctx)


@dataclass
class MooncakeTTFT:
    """Mooncake Conductor: the worker with the least estimated TTFT.

    ``TTFT = queue time + prefill time``: the queue is the cost-model seconds of the
    prefill booked on the worker, the prefill is the cost model's time for the
    uncached part after the predicted hit (one step's fixed cost included). No KV
    transfer and no SLO rejection (Mooncake's global cache and 429s).
    """

    name: str = field(default="mooncake", init=False)

    def estimates(self, ctx: RouteContext) -> list[float]:
        """Each candidate's TTFT estimate in seconds."""
        prof = ctx.profile
        out = []
        for w in ctx.candidates:
            cached = ctx.cached_tokens(w)
            prefill = prof.step_s + prof.prefill_s(ctx.num_tokens - cached, cached)
            out.append(ctx.loads.load(w).prefill_s + prefill)
        return out

    def choose(self, ctx: RouteContext) -> Worker:
        """The minimum estimate; ties go to the first worker."""
        est = self.estimates(ctx)
        return ctx.candidates[est.index(min(est))]


class _Entry(NamedTuple):
    factory: Callable[..., RoutingPolicy]
    index_kind: str | None
    index_params: dict[str, Any]


POLICIES: dict[str, _Entry] = {
    "random": _Entry(Random, None, {}),
    "round_robin": _Entry(RoundRobin, None, {}),
    "pow2": _Entry(Pow2, None, {}),
    "least_outstanding": _Entry(LeastOutstanding, None, {}),
    "prefix_hash": _Entry(PrefixHash, None, {}),
    # Ray's and SGLang's routers learn from their own decisions; Ray never evicts by
    # default, SGLang's size cap (2**26 characters a worker) is never reached here.
    "ray_pca": _Entry(RayPrefixAffinity, "approx", {"ttl": None}),
    "sglang": _Entry(SGLangCacheAware, "approx", {"ttl": None}),
    "dynamo": _Entry(DynamoCost, "radix", {}),
    "llmd": _Entry(LlmdWeighted, "chained", {}),
    "mooncake": _Entry(MooncakeTTFT, "chained", {}),
}
"""Policy name -> (factory, default index, default index options)."""


def make_policy(spec: PolicySpec) -> RoutingPolicy:
    """The policy a spec names, with its parameters.

    Raises:
        UnknownPolicyError: an unknown name or parameter.
        ClusterSettingsError: a parameter out of range.
    """
    entry = POLICIES.get(spec.name)
    if entry is None:
        raise UnknownPolicyError(
            f"{spec.name!r} is not a routing policy; known: {', '.join(POLICIES)}"
        )
    accepted = [f.name for f in fields(entry.factory) if f.init]  # type: ignore[arg-type]
    unknown = sorted(set(spec.params) - set(accepted))
    if unknown:
        raise UnknownPolicyError(
            f"policy {spec.name!r} has no parameter {', '.join(unknown)}; "
            f"it takes: {', '.join(accepted) or 'none'}"
        )
    return entry.factory(**spec.params)


def policy_index(spec: PolicySpec) -> tuple[str | None, dict[str, Any]]:
    """The index kind a spec's policy reads and its options (spec overrides defaults)."""
    entry = POLICIES.get(spec.name)
    default_kind = entry.index_kind if entry is not None else None
    kind = spec.index_kind or default_kind
    if kind is None:
        return None, {}
    params = dict(entry.index_params) if entry is not None and kind == default_kind else {}
    params.update(spec.index_params)
    return kind, params


def make_cluster_index(spec: PolicySpec, scheme: HashScheme) -> ClusterIndex | None:
    """The cluster index a policy spec reads (``None`` for load-only policies).

    Raises:
        UnknownPolicyError: index parameters the index does not take.
    """
    kind, params = policy_index(spec)
    if kind is None:
        return None
    if kind == "approx":
        return ApproxIndex(**params)
    if params:
        raise UnknownPolicyError(f"{spec.text!r}: {kind} index takes no {', '.join(params)}")
    return ChainedHashIndex(scheme) if kind == "chained" else RadixBlockIndex(scheme)
