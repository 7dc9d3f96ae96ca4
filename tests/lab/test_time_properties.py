"""Time you can trust, as properties over drawn traces, settings and profiles: the
same scheduler with equal hits gives equal TTFT, and closed-loop replay never sends
a turn before its predecessor finished (plus its think time)."""

from __future__ import annotations

from array import array

from hypothesis import given
from hypothesis import strategies as st
from test_sim_properties import configs, profiles, traces

from prefixkv.adapters.lab.sim import CostProfile, SimRequest, SimResult, SimSettings, simulate
from prefixkv.indexes import make_index


def run(trace: list[SimRequest], name: str, bs: int, cfg: SimSettings, p: CostProfile) -> SimResult:
    roomy = sum(len(r.prompt) + r.output_len for r in trace) + 64 * bs
    return simulate(trace, lambda: make_index(name, bs), roomy, cfg, p)


@given(traces(), configs, profiles, st.sampled_from([1, 2, 4, 16]))
def test_the_same_scheduler_with_equal_hits_gives_equal_ttft(
    trace: list[SimRequest], cfg: SimSettings, profile: CostProfile, bs: int
) -> None:
    # The hash chain and a radix tree of the same page size hit the same tokens
    # (whole blocks, the last token recomputed); under one scheduler their TTFTs,
    # queueing and finishes must then be equal to the bit: the index's data
    # structure is not a cost.
    a = run(trace, "hash_chain", bs, cfg, profile)
    b = run(trace, "radix", bs, cfg, profile)
    hits_a = [r.hit_tokens for r in a.requests]
    assert hits_a == [r.hit_tokens for r in b.requests]
    assert [r.ttft_s for r in a.requests] == [r.ttft_s for r in b.requests]
    assert [r.finish_s for r in a.requests] == [r.finish_s for r in b.requests]
    assert a.run == b.run


@st.composite
def sessions(draw: st.DrawFn) -> list[SimRequest]:
    """Interleaved sessions whose turns grow by quoting the previous prompt, with
    arrivals that often come before the previous turn could have finished."""
    num = draw(st.integers(1, 4))
    turns = [draw(st.integers(1, 5)) for _ in range(num)]
    out: list[SimRequest] = []
    prompts: dict[int, array[int]] = {}
    last: dict[int, str] = {}
    t = 0.0
    order = [s for s in range(num) for _ in range(turns[s])]
    for s in draw(st.permutations(order)):
        t += draw(st.sampled_from([0.0, 0.001, 0.02, 0.3]))
        prompt = array("I", prompts.get(s, array("I", [s + 1])))
        prompt.extend(
            100_000 * (s + 1) + len(out) * 10 + k for k in range(draw(st.integers(1, 40)))
        )
        prompts[s] = prompt
        rid = f"s{s}-{len(out)}"
        think = draw(st.sampled_from([0.0, 0.01, 0.5]))
        out.append(SimRequest(rid, prompt, draw(st.integers(1, 6)), t, after=last.get(s),
                              think_s=think))  # fmt: skip
        last[s] = rid
    return out


@given(sessions(), configs, profiles, st.sampled_from(["hash_chain", "radix"]))
def test_closed_loop_never_sends_a_turn_before_its_predecessor_finished(
    trace: list[SimRequest], cfg: SimSettings, profile: CostProfile, name: str
) -> None:
    res = run(trace, name, 4, cfg, profile)
    by_id = {r.request_id: r for r in res.requests}
    assert len(by_id) == len(trace)
    for req in trace:
        sent = by_id[req.id].arrival_s
        assert req.arrival is not None and sent >= req.arrival
        if req.after is not None:
            before = by_id[req.after]
            assert sent >= before.finish_s + req.think_s
            # Sent as soon as allowed: at its arrival or right after the think time.
            assert sent in (req.arrival, before.finish_s + req.think_s)
        # Sent at the engine no earlier than it was sent.
        assert by_id[req.id].first_scheduled_s >= sent
    # Records come in the order requests were sent.
    sends = [r.arrival_s for r in res.requests]
    assert sends == sorted(sends)
