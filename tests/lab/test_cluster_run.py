"""Cluster runs in the deterministic mode: every policy, the bounds, every fault.

A small multi-turn workload (sessions sharing a system prompt) over 4 replicas with
small caches, so eviction, queueing and cache-aware routing all happen. Every run
checks its invariants (no lost request, no decision or completion for a dead replica,
no hit on blocks the replica never announced, the router's view equal to each
replica's cache after the run); each fault also has its own assertion.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Callable

import pytest

from prefixkv.adapters.lab.cluster import driver, experiment
from prefixkv.adapters.lab.cluster.experiment import plan_experiment, run_experiment
from prefixkv.adapters.lab.cluster.faults import parse_faults
from prefixkv.adapters.lab.cluster.metrics import ClusterResult
from prefixkv.adapters.lab.cluster.run import ClusterSettings, run_cluster
from prefixkv.adapters.lab.sim.arrivals import sim_requests
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.workloads import make_workload
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.adapters.router.policies import POLICIES
from prefixkv.adapters.router.routing import parse_policies

CFG = ClusterSettings(
    num_replicas=4,
    capacity_tokens=4096,
    block_size=16,
    check=True,
    buffer_steps=32,
    reservation_ttl=20.0,
)
T = 25.0  # seconds into the ~60 s workload


@pytest.fixture(scope="module")
def requests() -> list[SimRequest]:
    w = make_workload("multi_turn", num_sessions=40, turns=(2, 6), system_len=64, seed=1)
    return list(sim_requests(w, request_rate=3.0, seed=0))


def rows(res: ClusterResult) -> list[tuple[object, ...]]:
    """What a run decided and measured, wall-clock timings left out."""
    return [
        (
            r.request_id,
            r.replica,
            r.routes,
            r.predicted_hit_tokens,
            r.hit_tokens,
            r.first_token_s,
            r.finish_s,
        )
        for r in res.requests
    ]


def summary(res: ClusterResult) -> dict[str, object]:
    d = dataclasses.asdict(res.run)
    for k in (
        "decision_p50_us",
        "decision_p99_us",
        "decision_cpu_p99_us",
        "hash_p50_us",
        "hash_p99_us",
    ):
        del d[k]
    return d


EVERY = [
    *POLICIES,
    "pooled",
    "infinite",
    "dynamo@chained",
    "llmd@radix",
    "sglang@radix",
    "mooncake@approx",
]


@pytest.mark.parametrize("policy", EVERY)
def test_every_policy_routes_every_request_and_holds_its_invariants(
    policy: str, requests: list[SimRequest]
) -> None:
    res = run_cluster(requests, policy, CFG)
    res.check_invariants()
    assert res.run.num_requests == len(requests)
    assert 0 < res.run.hit_ratio < 1
    assert res.labels["policy"] == policy
    if res.labels["index"] != "none":
        assert res.run.overlap_predictions == len(requests)


def test_bounds_and_cache_aware_routing_order(requests: list[SimRequest]) -> None:
    hit = {
        p: run_cluster(requests, p, CFG).run.hit_ratio
        for p in ("round_robin", "dynamo", "pooled", "infinite")
    }
    assert hit["infinite"] >= hit["pooled"] > hit["dynamo"] > hit["round_robin"]


def test_a_routed_row_holds_the_promise_in_tokens_beside_the_hit(
    requests: list[SimRequest],
) -> None:
    # Fault-free, an exact event-fed index promises what the replica then hits: the
    # row's predicted_hit_tokens is in tokens (whole blocks), comparable to hit_tokens.
    res = run_cluster(requests, "dynamo", CFG)
    promised = [r for r in res.requests if r.predicted_hit_tokens]
    assert promised and all(r.replica is not None and r.routes >= 1 for r in res.requests)
    assert all(r.predicted_hit_tokens % CFG.block_size == 0 for r in promised)
    assert sum(r.predicted_hit_tokens == r.hit_tokens for r in promised) > len(promised) // 2
    assert all("predicted_hit_tokens" in r.as_row() for r in res.requests)


@pytest.mark.parametrize(
    ("policy", "faults"),
    [
        ("random", ""),
        ("dynamo", ""),
        ("sglang", "drop=0.2,delay=0.3,jitter=1"),
        ("llmd", "kill=1@25,drop_removals=0.5"),
        ("mooncake@radix", "restart=2@20,router_restart@30:dump"),
    ],
)
def test_deterministic_mode_gives_identical_results(
    policy: str, faults: str, requests: list[SimRequest]
) -> None:
    a = run_cluster(requests, policy, CFG, faults)
    b = run_cluster(requests, policy, CFG, faults)
    assert rows(a) == rows(b)
    assert summary(a) == summary(b)
    c = run_cluster(requests, policy, dataclasses.replace(CFG, seed=7), faults)
    if policy == "random":  # seeded choices: another seed, other decisions
        assert rows(c) != rows(a)


# ---------------------------------------------------------------- faults

Check = Callable[[ClusterResult, ClusterResult], None]


def _event_fed(res: ClusterResult) -> bool:
    return res.labels["index"] in ("chained", "radix")


def _dropped(res: ClusterResult, base: ClusterResult) -> None:
    assert res.stats["dropped_batches"] > 0
    if _event_fed(res):
        assert res.stats["gaps"] > 0 and res.stats["replays"] >= res.stats["gaps"]


def _phantoms(res: ClusterResult, base: ClusterResult) -> None:
    if _event_fed(res):  # the cost: the router believes blocks that are gone
        assert res.invariants.phantom_blocks > 0


def _reordered(res: ClusterResult, base: ClusterResult) -> None:
    if _event_fed(res):
        assert res.stats["gaps"] > 0 and res.stats["duplicates"] > 0


def _killed(res: ClusterResult, base: ClusterResult) -> None:
    assert all(r.finish_s <= T for r in res.requests if r.replica == 1)
    assert res.invariants.routed_to_dead == 0


def _restarted(res: ClusterResult, base: ClusterResult) -> None:
    if _event_fed(res) and any(r.replica == 1 and r.arrival_s < T for r in base.requests):
        assert res.stats["restarts"] == 1  # seen in the stream: its sequence went back to 0
    late = [r for r in res.requests if r.replica == 1 and r.finish_s > T]
    assert all(r.first_scheduled_s >= T for r in late)


def _cleared(res: ClusterResult, base: ClusterResult) -> None:
    if _event_fed(res):
        assert res.stats["index_cleared"] >= 1


def _warm(mode: str) -> Check:
    def check(res: ClusterResult, base: ClusterResult) -> None:
        (w,) = res.stats["warmups"]
        assert w["mode"] == mode and w["at_s"] == T
        if res.labels["index"] in ("chained", "radix"):
            assert w["dumps"] == (4 if mode == "dump" else w["dumps"])
            assert w["batches_replayed"] > 0 or w["dumps"] > 0

    return check


def _gap(res: ClusterResult, base: ClusterResult) -> None:
    if _event_fed(res) and res.stats["dropped_batches"] > CFG.buffer_steps:
        assert res.stats["resyncs"] >= 1  # the replay window could not bridge it


def _mismatch(kind: str) -> Check:
    def check(res: ClusterResult, base: ClusterResult) -> None:
        incompatible = res.stats.get("incompatible", {})
        if res.labels["index"] == "chained" or (
            kind == "block_size" and res.labels["index"] == "radix"
        ):
            assert 3 in incompatible and kind.split("_")[0] in incompatible[3]
        elif res.labels["index"] == "radix":  # keyed by content: another seed is followed
            assert incompatible == {}
            assert any(r.replica == 3 and r.predicted_hit_tokens for r in res.requests)

    return check


def _scaled(res: ClusterResult, base: ClusterResult) -> None:
    assert 4 in [s.replica for s in res.replicas]  # the new replica joined
    assert all(r.arrival_s <= 40 for r in res.requests if r.replica == 0)


def _swept(res: ClusterResult, base: ClusterResult) -> None:
    assert res.stats["lost_completions"] > 0 and res.run.swept_reservations > 0


FAULTS: list[tuple[str, Check]] = [
    ("drop=0.3", _dropped),
    ("drop_removals", _phantoms),
    ("delay=0.5,jitter=2", _reordered),
    ("kill=1@25", _killed),
    ("restart=1@25", _restarted),
    ("clear=2@25", _cleared),
    ("router_restart@25", _warm("replay")),
    ("router_restart@25:dump", _warm("dump")),
    ("late_join@25", _warm("replay")),
    ("late_join@25:dump", _warm("dump")),
    ("gap=0@25", _gap),
    ("mismatch=3:block_size", _mismatch("block_size")),
    ("mismatch=3:hash", _mismatch("hash")),
    ("scale_up@20,scale_down=0@40", _scaled),
    ("lose_completions=0.3", _swept),
]


@pytest.fixture(scope="module")
def fault_free(requests: list[SimRequest]) -> dict[str, ClusterResult]:
    return {p: run_cluster(requests, p, CFG) for p in ("dynamo", "llmd", "sglang")}


@pytest.mark.parametrize("policy", ["dynamo", "llmd", "sglang"])
@pytest.mark.parametrize(("faults", "check"), FAULTS, ids=[f for f, _ in FAULTS])
def test_fault_invariants(
    policy: str,
    faults: str,
    check: Check,
    requests: list[SimRequest],
    fault_free: dict[str, ClusterResult],
) -> None:
    base = fault_free[policy]
    res = run_cluster(requests, policy, CFG, faults)
    res.check_invariants()  # stale information may cost hits, never correctness
    assert res.run.num_requests == len(requests)
    check(res, base)


def test_relative_fault_times_must_be_resolved(requests: list[SimRequest]) -> None:
    with pytest.raises(ClusterSettingsError):
        run_cluster(requests, "dynamo", CFG, "kill=1@50%")
    plan = parse_faults("kill=1@50%").resolve(50.0)
    assert plan.scheduled[0].at == 25.0
    run_cluster(requests, "dynamo", CFG, plan).check_invariants()


def test_a_broken_invariant_is_reported(
    requests: list[SimRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver that forgets a dead replica's requests loses them; check() says so.
    monkeypatch.setattr(driver.ClusterDriver, "_void_after", lambda self, replica, t: [])
    res = run_cluster(requests, "dynamo", CFG, "kill=1@25")
    assert res.invariants.lost_requests
    with pytest.raises(AssertionError, match="lost requests"):
        res.check_invariants()


def _experiment(
    requests: list[SimRequest], **kwargs: object
) -> tuple[list[ClusterResult], list[str]]:
    skipped: list[str] = []
    specs = parse_policies("round_robin,llmd,pooled", tuple(POLICIES))
    plan = plan_experiment(specs, CFG, replicas=[2, 4])
    results = run_experiment(lambda cfg: requests, plan,
                             on_skip=lambda run: skipped.append(run.describe()),
                             **kwargs)  # type: ignore[arg-type]  # fmt: skip
    return results, skipped


def test_an_experiment_starts_no_run_after_its_deadline(
    requests: list[SimRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = iter(range(100))  # each check of the deadline is one second later
    monkeypatch.setattr(experiment.time, "monotonic", lambda: float(next(clock)))
    results, skipped = _experiment(requests, deadline=2.5)
    assert [r.labels["policy"] for r in results] == ["round_robin", "llmd", "pooled"]
    assert skipped == [
        "round_robin N=4 capacity=4,096",
        "llmd N=4 capacity=4,096",
        "pooled N=4 capacity=4,096",
    ]


def test_ctrl_c_keeps_an_experiments_finished_runs(
    requests: list[SimRequest], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = experiment.run_cluster
    calls = [0]

    def run(*args: object, **kwargs: object) -> ClusterResult:
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(experiment, "run_cluster", run)
    with pytest.raises(experiment.ClusterInterrupted) as stop:
        _experiment(requests)
    assert [r.labels["policy"] for r in stop.value.results] == ["round_robin", "llmd"]
    assert stop.value.planned == 6


def _engine_usage(seat: object) -> float:
    """The usage each engine reports, written from its own source over the seat's sizes."""
    from prefixkv.adapters.lab.sim.seats import SglangSeat, VllmSeat

    if isinstance(seat, VllmSeat):
        # vLLM 0.33 BlockPool.get_usage: 1.0 - get_num_free_blocks() / (num_gpu_blocks - 1),
        # its free queue holding the evictable cached blocks
        pool = seat.kv.manager.allocator
        free = pool.num_free_blocks + seat.index.stats().num_evictable_blocks
        return 1.0 - free / (pool.num_blocks - 1)
    assert isinstance(seat, SglangSeat)
    # SGLang 0.5.23 _get_token_info: num_used = max_total_num_tokens - (available_size +
    # evictable_size); token_usage = num_used / max_total_num_tokens
    page = seat.block_size
    max_total_num_tokens = seat.cache.pool.num_blocks * page
    available = seat.cache.pool.num_free_blocks * page
    evictable = seat.index.stats().num_evictable_blocks * page
    return (max_total_num_tokens - (available + evictable)) / max_total_num_tokens


@pytest.mark.parametrize("batching", ["mixed", "prefill_first"])
def test_a_replica_reports_its_engines_own_kv_usage_at_every_step(
    requests: list[SimRequest], batching: str
) -> None:
    # One definition per engine, the one its engine class answers: a router reads what
    # each replica's engine reports, to the last bit (1 - 7 / 10 != 3 / 10: a router
    # breaks ties on it).
    from prefixkv.adapters.lab.cluster.fleet import ReplicaSpec
    from prefixkv.adapters.lab.cluster.sim_replica import SimReplica
    from prefixkv.adapters.lab.sim.profile import load_profile

    sim = dataclasses.replace(CFG.sim, batching=batching)
    cfg = dataclasses.replace(CFG, capacity_tokens=1600, check=False, sim=sim)  # 100 blocks
    replica = SimReplica(ReplicaSpec(cfg, load_profile()), 0)
    seat = replica.seat
    assert seat.num_blocks == 100
    for r in requests[:12]:
        replica.add(r, sent=0.0)
    held, evictable = set(), set()
    while replica.has_unfinished():
        replica.step()
        assert seat.usage == _engine_usage(seat)
        assert replica.advance(replica.now).kv_usage == seat.usage  # reports, steps none
        held.add(seat.num_held_blocks())
        evictable.add(seat.index.stats().num_evictable_blocks)
    assert len(held) > 5 and max(evictable) > 0  # the pool filled and drained, blocks cached


@pytest.mark.parametrize("gap", [0.5, 5.0])
def test_a_cluster_replica_pays_the_wake_after_an_idle_as_a_lone_replica_does(gap: float) -> None:
    # A request sent to a replica that has idled wake_after_s or longer pays wake_s in its
    # first step, in a cluster as in simulate(); one sent sooner does not.
    from prefixkv.adapters.lab.cluster.fleet import ReplicaSpec
    from prefixkv.adapters.lab.cluster.sim_replica import SimReplica
    from prefixkv.adapters.lab.sim.profile import load_profile

    def second_ttft(wake_s: float) -> float:
        profile = dataclasses.replace(load_profile(), wake_s=wake_s, wake_after_s=1.0)
        replica = SimReplica(ReplicaSpec(dataclasses.replace(CFG, check=False), profile), 0)
        first = replica.add(SimRequest("a", array("I", range(40)), 2, arrival=0.0))
        replica.advance(float("inf"))
        assert first.finish_s is not None
        sent = first.finish_s + gap
        second = replica.add(SimRequest("b", array("I", range(100, 140)), 2, arrival=sent))
        replica.advance(float("inf"))
        assert second.first_token_s is not None
        return second.first_token_s - sent

    paid = second_ttft(0.25) - second_ttft(0.0)
    assert paid == pytest.approx(0.25 if gap >= 1.0 else 0.0, abs=1e-9)
