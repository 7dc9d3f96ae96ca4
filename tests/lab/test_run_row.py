"""The one run row: a run writes its labels, then the columns of the parts it filled, in
the schema's order (:data:`~prefixkv.adapters.lab.sim.runs.RUN_PARTS`)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.sim.load import LoadSummary
from prefixkv.adapters.lab.sim.metrics import RunMetrics
from prefixkv.adapters.lab.sim.runs import (
    RUN_PARTS,
    FleetSummary,
    IndexTimes,
    KLiveHits,
    RunChecks,
    RunPart,
    RunRow,
    SweepHit,
    run_table,
)


def _part(kind: type[RunPart], n: int) -> RunPart:
    """An instance of ``kind`` whose every number is ``n`` (or derived from it)."""
    if kind is KLiveHits:
        return KLiveHits(n, n, n, n / 7, True, n, n, n, n, n, n, n, n)
    if kind is IndexTimes:
        return IndexTimes(n, n, n, n, n, 1, True, 0.5, (0.25, 0.125), {"find": n, "admit": 1.0})
    if kind is SweepHit:
        return SweepHit(None, None) if n % 2 else SweepHit(n / 7, n)
    if kind is RunMetrics:
        return RunMetrics(n, *[n / 3] * 12, n, n, n, n, n / 7, n, n / 5, n / 5, n / 5, n, n, n)
    if kind is LoadSummary:
        return LoadSummary(n, n / 2, n / 3, n / 4, 0.1, n % 2 == 1, False, "TTFT <= 500 ms", n, 1.0)
    if kind is FleetSummary:
        return FleetSummary(n, 2, n / 7, n, n, *[n / 3] * 25)
    assert kind is RunChecks
    return RunChecks(True, n, {"batches": n, "note": "text", "rate": n / 2})


def _expected(labels: dict[str, Any], parts: list[RunPart]) -> dict[str, Any]:
    """The row the schema promises: the labels, then each part in RUN_PARTS' order."""
    row = dict(labels)
    for kind in RUN_PARTS:
        for p in parts:
            if type(p) is kind:
                row.update(p.as_row())
    return row


@given(
    chosen=st.lists(st.sampled_from(RUN_PARTS), unique=True, max_size=len(RUN_PARTS)),
    n=st.integers(0, 10**9),
    data=st.data(),
)
def test_a_run_row_writes_the_columns_of_the_parts_its_run_filled_in_the_schemas_order(
    chosen: list[type[RunPart]], n: int, data: st.DataObject
) -> None:
    labels = {"workload": "w", "backend": "radix", "capacity_tokens": n}
    parts = [_part(kind, n) for kind in chosen]
    given_order = data.draw(st.permutations(parts))
    row = RunRow(labels, tuple(given_order))
    flat = row.as_row()
    expected = _expected(labels, parts)
    assert list(flat) == list(expected)  # the same columns, in the same order
    assert all(flat[k] == v or v != v for k, v in expected.items())
    assert [type(p) for p in row.parts] == [k for k in RUN_PARTS if k in chosen]
    # Nothing of a part the run did not fill: every column is a label's or a filled part's.
    filled = set(labels).union(*(p.as_row() for p in parts))
    assert set(flat) <= filled
    assert run_table([row, row]) == [flat, flat]


def test_each_part_writes_its_fields_in_their_order() -> None:
    hits = _part(KLiveHits, 3)
    assert list(hits.as_row())[:4] == ["num_requests", "prompt_tokens", "hit_tokens", "hit_ratio"]
    times = IndexTimes(1.0, 2.0, 1.5, 0.5, 0.9, 2, True, 0.3, (0.4, 0.2), {"z": 1.0, "a": 2.0})
    assert list(times.as_row())[-3:] == [
        "wall_seconds_timed_min",
        "index_seconds_a",
        "index_seconds_z",
    ]
    assert times.as_row()["wall_seconds_timed_min"] == 0.2
    empty = IndexTimes(1.0, 2.0, 1.5, 0.5, 0.9, 0, True, 0.3, (), {})
    assert math.isnan(empty.as_row()["wall_seconds_timed_min"])
    assert SweepHit(None, None).as_row() == {
        "fits": False,
        "hit_ratio": None,
        "evicted_blocks": None,
    }
    checks = RunChecks(False, 4, {"batches": 3, "name": "x"}).as_row()
    assert checks == {"invariants_hold": False, "phantom_blocks": 4, "stat_batches": 3}


def test_a_column_named_twice_keeps_its_first_place_and_the_later_value() -> None:
    # An arrival-time run: its labels carry the settings' SLO text, its load part too.
    clock = _part(RunMetrics, 5)
    load = LoadSummary(9, 1.0, 1.0, 1.0, 0.0, False, slo="TTFT <= 1 s")
    flat = RunRow({"backend": "radix", "slo": ""}, (load, clock)).as_row()
    assert list(flat)[:3] == ["backend", "slo", "num_requests"]
    assert flat["slo"] == "TTFT <= 1 s" and flat["num_requests"] == 5
    assert list(flat)[-len(load.as_row()) + 1 :] == [k for k in load.as_row() if k != "slo"]


def test_a_part_given_twice_or_of_no_kind_is_refused() -> None:
    with pytest.raises(TypeError, match="at most one each"):
        RunRow({}, (SweepHit(0.5, 1), SweepHit(0.25, 2)))
    with pytest.raises(TypeError, match="at most one each"):
        RunRow({}, ({"hit_ratio": 1.0},))  # type: ignore[arg-type]
    row = RunRow({"backend": "radix"}, (SweepHit(0.5, 1),))
    assert row.part(SweepHit).hit_ratio == 0.5
    with pytest.raises(KeyError, match="radix has no KLiveHits"):
        row.part(KLiveHits)
