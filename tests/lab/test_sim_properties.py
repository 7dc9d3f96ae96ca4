"""Properties of the simulator over drawn traces, settings and profiles: the prefill
GPU time a run computes only goes down when every request hits more, and computed
plus saved prefill is exactly the cost of the prompts without a cache."""

from __future__ import annotations

import itertools
import math
from array import array

from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim import CostProfile, SimRequest, SimResult, SimSettings, simulate
from prefixkv.indexes import make_index


@st.composite
def traces(draw: st.DrawFn) -> list[SimRequest]:
    """Requests branching off a few shared prefixes, cut at unaligned lengths."""
    roots = draw(st.lists(st.integers(1, 48), min_size=1, max_size=3))
    n = draw(st.integers(1, 14))
    t = 0.0
    out = []
    for i in range(n):
        root = draw(st.integers(0, len(roots) - 1))
        shared = draw(st.integers(0, roots[root]))
        own = draw(st.integers(0 if shared else 1, 24))
        prompt = array("I", [1000 * root + k + 1 for k in range(shared)])
        prompt.extend(500_000 + 100 * i + k for k in range(own))
        t += draw(st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.5]))
        out.append(SimRequest(f"r{i}", prompt, draw(st.integers(1, 6)), t))
    return out


coefficient = st.floats(1e-9, 1e-2, allow_nan=False, allow_infinity=False)
profiles = st.builds(
    CostProfile,
    st.just("drawn"),
    st.just("m"),
    st.just("d"),
    coefficient,
    coefficient,
    coefficient,
    coefficient,
    coefficient,
)
configs = st.builds(
    SimSettings,
    max_num_seqs=st.integers(1, 8),
    max_num_batched_tokens=st.integers(8, 128),
    queue_order=st.sampled_from(["fcfs", "lpm"]),
    batching=st.sampled_from(["mixed", "prefill_first"]),
)


def run(trace: list[SimRequest], name: str, bs: int, cfg: SimSettings, p: CostProfile) -> SimResult:
    # A pool that holds every token of the trace: no eviction, no preemption.
    roomy = sum(len(r.prompt) + r.output_len for r in trace) + 64 * bs
    res = simulate(trace, lambda: make_index(name, bs), roomy, cfg, p)
    assert res.run.num_preemptions == 0
    return res


@given(traces(), configs, profiles, st.sampled_from([1, 2, 4, 16]))
def test_more_hits_for_every_request_never_cost_more_prefill(
    trace: list[SimRequest], cfg: SimSettings, profile: CostProfile, bs: int
) -> None:
    backends = [("none", bs), ("hash_chain", bs), ("radix", 1), ("radix", bs)]
    runs = [run(trace, name, size, cfg, profile) for name, size in backends]
    compared = 0
    for a, b in itertools.permutations(runs, 2):
        if all(x.hit_tokens >= y.hit_tokens for x, y in zip(a.requests, b.requests, strict=True)):
            compared += 1
            assert a.run.prefill_gpu_s <= b.run.prefill_gpu_s * (1 + 1e-12), (a.labels, b.labels)
            assert a.run.hit_tokens >= b.run.hit_tokens
    assert compared >= 3  # every caching backend against "none", at least
    no_cache = math.fsum(profile.prefill_s(len(r.prompt)) for r in trace)
    for res in runs:
        total = res.run.prefill_gpu_s + res.run.saved_gpu_s
        assert math.isclose(total, no_cache, rel_tol=1e-9), res.labels
        assert res.run.computed_prefill_tokens == res.run.uncached_prefill_tokens
