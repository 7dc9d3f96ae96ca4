"""Tests of the synthetic workloads: determinism, sizes, and each one's sharing structure."""

from __future__ import annotations

import itertools
from array import array
from collections import defaultdict
from collections.abc import Callable

import pytest
from helpers import common_prefix

from prefixkv.adapters.lab.traces import TraceRequest
from prefixkv.adapters.lab.workloads import (
    WORKLOADS,
    UnknownWorkloadError,
    WorkloadError,
    few_shot,
    long_document,
    make_workload,
    multi_turn,
    no_sharing,
    shared_system_prompt,
    tree_of_thought,
)
from prefixkv.indexes.errors import PrefixKVError

Generator = Callable[..., list[TraceRequest]]


def test_registry_names_and_immutability() -> None:
    assert sorted(WORKLOADS) == sorted(
        [
            "shared_system_prompt",
            "multi_turn",
            "few_shot",
            "tree_of_thought",
            "no_sharing",
            "long_document",
        ]
    )
    with pytest.raises(TypeError):
        WORKLOADS["x"] = no_sharing  # type: ignore[index]


def test_unknown_workload_lists_names() -> None:
    with pytest.raises(UnknownWorkloadError, match=r"'nope'.*few_shot.*tree_of_thought"):
        make_workload("nope")
    assert issubclass(UnknownWorkloadError, PrefixKVError)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_defaults_are_small_valid_and_deterministic(name: str) -> None:
    requests = make_workload(name)
    assert 100 <= len(requests) <= 500
    assert len({r.id for r in requests}) == len(requests)
    assert all(1 <= len(r.tokens) <= 2600 for r in requests)
    assert all(1 <= t < 32000 for r in requests for t in r.tokens + r.output)
    assert make_workload(name) == requests
    assert make_workload(name, seed=1) != requests


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_small_vocab_and_seed_knob(name: str) -> None:
    requests = make_workload(name, vocab_size=5, seed=3)
    assert all(1 <= t < 5 for r in requests for t in r.tokens + r.output)


@pytest.mark.parametrize(
    ("generator", "knobs"),
    [
        (shared_system_prompt, {"num_requests": 0}),
        (shared_system_prompt, {"user_len": (5, 4)}),
        (multi_turn, {"turns": (0, 3)}),
        (few_shot, {"num_templates": 1.5}),
        (tree_of_thought, {"thought_len": (1, 4)}),
        (tree_of_thought, {"unaligned_to": 0}),
        (no_sharing, {"prompt_len": 7}),
        (long_document, {"vocab_size": 1}),
    ],
)
def test_bad_knobs(generator: Generator, knobs: dict[str, object]) -> None:
    with pytest.raises(WorkloadError) as info:
        generator(**knobs)
    assert repr(next(iter(knobs.values()))) in str(info.value)


def test_shared_system_prompt_shares_exactly_the_system_prompt() -> None:
    requests = shared_system_prompt(50, system_len=100, user_len=(10, 20), seed=4)
    system = requests[0].tokens[:100]
    for a, b in itertools.combinations(requests, 2):
        assert common_prefix(a.tokens, b.tokens) == 100
    assert all(r.tokens[:100] == system and 110 <= len(r.tokens) <= 120 for r in requests)
    assert all(5 <= len(r.output) <= 80 for r in requests)


def test_multi_turn_prompt_extends_previous_turn() -> None:
    requests = multi_turn(12, turns=(3, 6), system_len=20, seed=5)
    by_session: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in requests:
        _, session, turn = r.id.split("-")
        by_session[session].append(r)
        assert int(turn) == len(by_session[session]) - 1  # turns arrive in order
    assert len(by_session) == 12
    for turns in by_session.values():
        assert 3 <= len(turns) <= 6
        for prev, nxt in itertools.pairwise(turns):
            history = prev.tokens + prev.output
            assert nxt.tokens[: len(history)] == history
            assert len(nxt.tokens) > len(history)
    firsts = [turns[0] for turns in by_session.values()]
    for a, b in itertools.combinations(firsts, 2):
        assert common_prefix(a.tokens, b.tokens) == 20  # only the system prompt
    sessions_in_order = [r.id.split("-")[1] for r in requests]
    assert sessions_in_order != sorted(sessions_in_order, key=int)  # interleaved


def test_few_shot_requests_share_exactly_their_template() -> None:
    requests = few_shot(60, num_templates=3, seed=6)
    groups: dict[int, list[TraceRequest]] = defaultdict(list)
    for r in requests:
        groups[r.tokens[0]].append(r)
    assert len(groups) == 3
    for group in groups.values():
        prefix = min(common_prefix(a.tokens, b.tokens) for a, b in itertools.combinations(group, 2))
        assert prefix >= 4 * 40  # at least 4 examples of at least 40 tokens
        for a, b in itertools.combinations(group, 2):
            assert common_prefix(a.tokens, b.tokens) == prefix


def test_tree_of_thought_forks_at_unaligned_positions() -> None:
    requests = tree_of_thought(3, depth=3, branching=(2, 3), seed=7)
    trees: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in requests:
        trees[r.id.split("-")[1]].append(r)
    assert len(trees) == 3
    forks = set()
    for a, b in itertools.combinations(requests, 2):
        n = common_prefix(a.tokens, b.tokens)
        if a.id.split("-")[1] != b.id.split("-")[1]:
            assert n == 0
        else:
            assert n > 0 and n % 16 != 0, (a.id, b.id, n)
            forks.add(n)
    assert len(forks) > 10
    for tree in trees.values():
        root = tree[0]
        assert root.id.endswith("-r")
        assert all(common_prefix(root.tokens, r.tokens) >= len(root.tokens) // 2 for r in tree)
        assert max(r.id.count(".") for r in tree) == 2  # depth 3 below the root


def test_tree_of_thought_parent_prefix_property() -> None:
    requests = {r.id: r for r in tree_of_thought(2, depth=2, seed=8)}
    for rid, r in requests.items():
        tree, path = rid.split("-")[1:]
        if path == "r":
            continue
        parent = requests[f"tot-{tree}-{path.rpartition('.')[0] or 'r'}"]
        fork = common_prefix(parent.tokens, r.tokens)
        assert fork % 16 != 0
        assert r.tokens[:fork] == parent.tokens[:fork]
        assert len(r.tokens) >= fork + 48


def test_no_sharing_has_no_common_prefix() -> None:
    requests = no_sharing(300, seed=9)
    assert len({r.tokens[0] for r in requests}) == 300
    assert all(128 <= len(r.tokens) <= 2048 for r in requests)


def test_long_document_questions_follow_documents() -> None:
    requests = long_document(4, questions=(3, 5), document_len=(300, 400), seed=10)
    by_doc: dict[str, list[TraceRequest]] = defaultdict(list)
    for r in requests:
        by_doc[r.id.split("-")[1]].append(r)
    assert len(by_doc) == 4
    docs = {}
    for d, group in by_doc.items():
        assert 3 <= len(group) <= 5
        prefix = min(common_prefix(a.tokens, b.tokens) for a, b in itertools.combinations(group, 2))
        assert 300 <= prefix <= 400
        assert all(
            common_prefix(a.tokens, b.tokens) == prefix for a, b in itertools.combinations(group, 2)
        )
        docs[d] = group[0].tokens[:prefix]
    for a, b in itertools.combinations(docs.values(), 2):
        assert common_prefix(a, b) == 0
    order = [r.id.split("-")[1] for r in requests]
    assert order != sorted(order)  # shuffled across documents


def test_requests_do_not_alias() -> None:
    requests = shared_system_prompt(3)
    requests[0].tokens[0] = 0  # ids are drawn from [1, vocab): 0 marks the write
    assert requests[1].tokens[0] != 0


def test_requests_hold_compact_arrays_and_sessions() -> None:
    for name in WORKLOADS:
        for r in make_workload(name, seed=1)[:5]:
            assert isinstance(r.tokens, array) and r.tokens.typecode == "I", name
            assert isinstance(r.output, array) and r.output.typecode == "I", name
    chats = multi_turn(4, turns=(3, 3))
    by_session: dict[str | None, list[TraceRequest]] = defaultdict(list)
    for r in chats:
        by_session[r.session].append(r)
    assert len(by_session) == 4 and None not in by_session
    for turns in by_session.values():
        assert [t.turn for t in turns] == [1, 2, 3]
        assert [t.parent for t in turns] == [None, turns[0].id, turns[1].id]
