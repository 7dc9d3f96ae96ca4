"""Routing policies decide by their published rules; specs and bookings parse and add up.

Each policy is given a hand-made context (overlaps, bookings, gauges) where its
rule, and only its rule, picks a known worker.
"""

from __future__ import annotations

import math
import random
from array import array

import pytest

from prefixkv.adapters.lab.cluster.faults import FaultSpecError, parse_faults
from prefixkv.adapters.lab.sim.profile import load_profile
from prefixkv.adapters.router.approx import ApproxIndex
from prefixkv.adapters.router.errors import ClusterSettingsError, UnknownPolicyError
from prefixkv.adapters.router.keys import HashScheme, RouteKeys, Worker
from prefixkv.adapters.router.load import LoadTracker
from prefixkv.adapters.router.policies import (
    POLICIES,
    DynamoCost,
    LeastOutstanding,
    LlmdWeighted,
    MooncakeTTFT,
    Pow2,
    PrefixHash,
    Random,
    RayPrefixAffinity,
    RoundRobin,
    SGLangCacheAware,
    make_policy,
    policy_index,
)
from prefixkv.adapters.router.routing import RouteContext, RoutingPolicy, parse_policy

BS = 16
W = [Worker(i) for i in range(4)]
SCHEME = HashScheme.prefixkv(BS, seed=0)
KNOWN = tuple(POLICIES)


def ctx(
    overlap: dict[Worker, int] | None = None,
    *,
    loads: LoadTracker | None = None,
    num_tokens: int = 160,
    index: ApproxIndex | None = None,
    seed: int = 0,
) -> RouteContext:
    tokens = array("I", range(1, num_tokens + 1))
    return RouteContext(
        now=0.0,
        request_id="q",
        keys=RouteKeys(tokens, SCHEME),
        num_tokens=num_tokens,
        output_len=10,
        candidates=list(W),
        overlap=overlap or {},
        loads=loads or LoadTracker(),
        cluster_index=index,
        block_size=BS,
        profile=load_profile(),
        rng=random.Random(seed),
    )


def book(loads: LoadTracker, worker: Worker, n: int, tokens: int = 0) -> None:
    for i in range(n):
        loads.reserve(
            f"{worker.replica}-{i}-{tokens}",
            worker,
            prefill_tokens=tokens,
            prefill_s=tokens * 1e-3,
            decode_blocks=1,
            now=0.0,
        )


def test_every_policy_is_a_routing_policy() -> None:
    for name in POLICIES:
        policy = make_policy(parse_policy(name, KNOWN))
        assert isinstance(policy, RoutingPolicy)
        assert policy.choose(ctx()) in W


def test_round_robin_random_pow2() -> None:
    rr = RoundRobin()
    assert [rr.choose(ctx()) for _ in range(6)] == W + W[:2]
    picks = {Random().choose(ctx(seed=s)) for s in range(40)}
    assert picks == set(W)
    loads = LoadTracker()
    for w in W[1:]:
        book(loads, w, 3)
    # worker 0 is idle: whenever it is one of the two sampled, it wins
    wins = sum(Pow2().choose(ctx(loads=loads, seed=s)) == W[0] for s in range(200))
    assert 80 < wins < 120  # P(sampled) = 1/2


def test_least_outstanding_by_requests_or_tokens() -> None:
    loads = LoadTracker()
    book(loads, W[0], 1, tokens=1000)
    book(loads, W[1], 2, tokens=10)
    book(loads, W[2], 2, tokens=10)
    book(loads, W[3], 3, tokens=10)
    assert LeastOutstanding().choose(ctx(loads=loads)) == W[0]
    assert LeastOutstanding(by="tokens").choose(ctx(loads=loads)) == W[1]
    idle = LeastOutstanding()  # ties taken in turn: an idle fleet is spread
    assert [idle.choose(ctx()) for _ in range(5)] == [*W, W[0]]
    with pytest.raises(ClusterSettingsError):
        LeastOutstanding(by="blocks")


def test_prefix_hash_is_sticky_until_overloaded() -> None:
    policy = PrefixHash()
    home = policy.choose(ctx())
    assert all(policy.choose(ctx(seed=s)) == home for s in range(5))
    loads = LoadTracker()
    book(loads, home, 4)  # mean with this request: 5/4; cap 1.5625 < 4
    other = policy.choose(ctx(loads=loads))
    assert other != home
    for w in W:  # everyone overloaded alike: the ring's worker anyway
        if w != home:
            book(loads, w, 4)
    assert policy.choose(ctx(loads=loads)) == home


def test_ray_prefix_affinity_threshold_and_smallest_tree() -> None:
    policy = RayPrefixAffinity()
    # 2 of 10 blocks (0.2 >= 0.1): the longest match
    assert policy.choose(ctx({W[2]: 2, W[1]: 1})) == W[2]
    # under the threshold: the smallest cache (worker 3 holds nothing)
    index = ApproxIndex(ttl=None)
    for w in W[:3]:
        index.on_routed(w, RouteKeys(array("I", range(1000, 1100)), SCHEME), 0.0)
    assert policy.choose(ctx({W[2]: 0}, num_tokens=16000, index=index)) == W[3]
    # imbalance (check off by default): power of two over all, so the busy holder of
    # the match never wins: any other worker it is sampled against has a shorter queue
    loads = LoadTracker()
    book(loads, W[2], 50)
    assert RayPrefixAffinity().choose(ctx({W[2]: 5}, loads=loads)) == W[2]
    picks = {
        RayPrefixAffinity(imbalanced_threshold=10).choose(ctx({W[2]: 5}, loads=loads, seed=s))
        for s in range(20)
    }
    assert W[2] not in picks and len(picks) > 1


def test_sglang_cache_aware_branches() -> None:
    policy = SGLangCacheAware()
    assert policy.choose(ctx({W[1]: 6, W[3]: 2})) == W[1]  # match 0.6 > 0.3
    index = ApproxIndex(ttl=None)
    for w in (W[0], W[1], W[3]):
        index.on_routed(w, RouteKeys(array("I", range(5000, 5032)), SCHEME), 0.0)
    assert policy.choose(ctx({W[1]: 2}, index=index)) == W[2]  # 0.2: smallest tree
    loads = LoadTracker()
    book(loads, W[1], 100)
    for w in (W[0], W[2]):
        book(loads, w, 45)
    book(loads, W[3], 40)  # 100 - 40 <= 64: balanced, the cache wins
    assert policy.choose(ctx({W[1]: 6}, loads=loads)) == W[1]
    book(loads, W[1], 10, tokens=1)  # 110 - 40 > 64 and 110 > 60: least loaded
    assert policy.choose(ctx({W[1]: 6}, loads=loads)) == W[3]


def test_dynamo_cost_formula_and_temperature() -> None:
    loads = LoadTracker()
    book(loads, W[0], 1, tokens=320)  # 20 booked prefill blocks
    policy = DynamoCost()
    costs = policy.costs(ctx({W[0]: 10, W[1]: 4}, loads=loads))
    # max((booked + 160) / 16 - overlap, 0) + decode blocks
    assert costs == [30 - 10 + 1, 10 - 4, 10, 10]
    assert policy.choose(ctx({W[0]: 10, W[1]: 4}, loads=loads)) == W[1]
    assert DynamoCost(overlap_score_credit=0).choose(ctx({W[1]: 9}, seed=3)) in W[1:]
    # costs 2, 10, 10, 10 normalize to 0, 1, 1, 1: P(worker 1) = 1 / (1 + 3 / e) = 0.475
    hot = DynamoCost(temperature=1.0)
    picks = [hot.choose(ctx({W[1]: 8}, seed=s)) for s in range(400)]
    assert 160 < picks.count(W[1]) < 220 and set(picks) == set(W)


def test_llmd_scorers() -> None:
    loads = LoadTracker()
    loads.report(W[0], 0.0, num_waiting=4, num_running=1, kv_usage=0.9)
    loads.report(W[1], 0.0, num_waiting=0, num_running=1, kv_usage=0.5)
    loads.report(W[2], 0.0, num_waiting=2, num_running=1, kv_usage=0.0)
    loads.report(W[3], 0.0, num_waiting=0, num_running=1, kv_usage=0.0)
    scores = LlmdWeighted().scores(ctx({W[0]: 8, W[1]: 4}, loads=loads))
    # prefix 2*(min-max over holders) + kv (1 - usage) + queue (max - q) / (max - min)
    assert scores == pytest.approx([2 * 1 + 0.1 + 0, 2 * 0 + 0.5 + 1, 0 + 1 + 0.5, 0 + 1 + 1])
    assert LlmdWeighted().choose(ctx({W[0]: 8, W[1]: 4}, loads=loads)) == W[0]


def test_mooncake_minimum_estimated_ttft() -> None:
    loads = LoadTracker()
    book(loads, W[1], 1, tokens=10_000)
    policy = MooncakeTTFT()
    est = policy.estimates(ctx({W[1]: 9, W[2]: 5}, loads=loads))
    prof = load_profile()
    assert est[2] == pytest.approx(prof.step_s + prof.prefill_s(160 - 80, 80))
    assert est[1] > est[2] < est[0]
    assert policy.choose(ctx({W[1]: 9, W[2]: 5}, loads=loads)) == W[2]


def test_specs_parse_and_pick_indexes() -> None:
    spec = parse_policy("dynamo@chained:temperature=0.5:overlap_score_credit=2", KNOWN)
    assert policy_index(spec) == ("chained", {})
    policy = make_policy(spec)
    assert isinstance(policy, DynamoCost) and policy.temperature == 0.5
    assert policy_index(parse_policy("sglang", KNOWN)) == ("approx", {"ttl": None})
    assert policy_index(parse_policy("dynamo@approx:ttl=30", KNOWN)) == ("approx", {"ttl": 30})
    assert policy_index(parse_policy("random", KNOWN)) == (None, {})
    assert parse_policy("pooled", KNOWN).is_bound
    assert parse_policy("ray_pca:imbalanced_threshold=inf", KNOWN).params == {
        "imbalanced_threshold": math.inf
    }
    for bad in ("nope", "dynamo@tree", "dynamo:temperature", "dynamo:bogus=1"):
        with pytest.raises(UnknownPolicyError):
            make_policy(parse_policy(bad, KNOWN))


def test_load_tracker_books_releases_and_sweeps() -> None:
    loads = LoadTracker(ttl=10)
    w = W[0]
    loads.reserve("a", w, prefill_tokens=100, prefill_s=0.5, decode_blocks=7, now=0.0)
    loads.reserve("b", w, prefill_tokens=50, prefill_s=0.25, decode_blocks=3, now=5.0)
    load = loads.load(w)
    assert (load.active_requests, load.prefill_tokens, load.decode_blocks) == (2, 150, 10)
    loads.prefill_complete("a")
    loads.prefill_complete("a")  # once only
    assert (load.prefill_tokens, load.prefill_s) == (50, 0.25)
    assert loads.free("b") and not loads.free("b")
    assert (load.active_requests, load.prefill_tokens, load.prefill_s) == (1, 0, 0.0)
    assert loads.sweep(9.9) == 0
    assert loads.sweep(10.0) == 1 and loads.num_swept == 1
    assert (load.active_requests, load.decode_blocks) == (0, 0)
    loads.reserve("c", w, prefill_tokens=1, prefill_s=0.1, decode_blocks=1, now=20.0)
    loads.reserve("c", W[1], prefill_tokens=1, prefill_s=0.1, decode_blocks=1, now=21.0)
    assert loads.load(w).active_requests == 0  # routed again: moved
    assert loads.remove_worker(W[1]) == ["c"] and loads.open_requests() == 0
    with pytest.raises(ClusterSettingsError):
        LoadTracker(ttl=0)


def test_fault_specs() -> None:
    plan = parse_faults(
        "drop=0.1,drop_removals,delay=0.5,jitter=1,kill=2@10,restart=1@50%,"
        "router_restart@20:dump,late_join@5,scale_up@30,scale_down=0@40,gap=3@1,"
        "clear=1@2,mismatch=3:hash,lose_completions=0.2"
    )
    assert (plan.drop, plan.drop_removals, plan.delay, plan.jitter) == (0.1, 1.0, 0.5, 1.0)
    assert plan.mismatch == {3: "hash"} and plan.needs_relative
    resolved = plan.resolve(200.0)
    kinds = [(f.kind, f.at, f.replica, f.mode) for f in resolved.scheduled]
    assert ("restart", 100.0, 1, "replay") in kinds
    assert ("router_restart", 20.0, None, "dump") in kinds
    assert [f.at for f in resolved.scheduled] == sorted(f.at for f in resolved.scheduled)
    for bad in (
        "explode=1",
        "drop=2",
        "kill=x@1",
        "kill@3",
        "scale_up=1@3",
        "restart=1",
        "late_join@5:warm",
        "mismatch=1:color",
        "kill=1@150%",
    ):
        with pytest.raises(FaultSpecError):
            parse_faults(bad)
    with pytest.raises(FaultSpecError):
        parse_faults("kill=9@1").check(4)


@pytest.mark.parametrize(
    "bad",
    [
        "dynamo:temperature=-1",
        "dynamo:overlap_score_credit=nan",
        "dynamo:prefill_load_scale=inf",
        "llmd:kv_weight=true",
        "prefix_hash:prefix_tokens=0",
        "prefix_hash:virtual_nodes=2.5",
        "sglang:cache_threshold=abc",
    ],
)
def test_bad_policy_parameters_are_named(bad: str) -> None:
    with pytest.raises(ClusterSettingsError, match=bad.split(":")[1].split("=")[0]):
        make_policy(parse_policy(bad, KNOWN))
    assert make_policy(parse_policy("ray_pca:imbalanced_threshold=inf", KNOWN))
    assert make_policy(parse_policy("sglang:balance_abs_threshold=inf", KNOWN))
