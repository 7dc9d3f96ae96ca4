"""The one table writer and the JSON rule every report shares: a Markdown row has one
cell per column whatever the cell holds, aligned text lines up, and results.json is
standard JSON (no NaN) with every finite value kept."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.outputs.markdown import Column, definitions, markdown_table, text_table
from prefixkv.adapters.lab.outputs.tables import json_safe, write_json
from prefixkv.adapters.lab.sim.metrics import RequestRow, request_table

CELL = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=12)


def _cells(line: str) -> list[str]:
    # Split a Markdown row on the pipes that are not escaped, as a renderer does.
    cells = re.split(r"(?<!\\)\|", line)[1:-1]
    return [c[1:-1].replace("\\|", "|") for c in cells]


@given(st.integers(1, 5).flatmap(lambda n: st.lists(st.lists(CELL, min_size=n, max_size=n))))
def test_a_markdown_row_has_one_cell_per_column(rows: list[list[str]]) -> None:
    width = len(rows[0]) if rows else 2
    headers = [f"h{i}" for i in range(width)]
    lines = markdown_table(headers, rows, ">" * width).splitlines()
    assert len(lines) == 2 + len(rows)
    for line, row in zip(lines[2:], rows, strict=True):
        assert _cells(line) == row


@given(st.lists(st.tuples(CELL, CELL), min_size=1, max_size=6))
def test_aligned_text_lines_up(rows: list[tuple[str, str]]) -> None:
    columns: list[Column] = [("name", "<", "left"), ("value", ">", "right")]
    rows = [(a.strip() or "x", b.strip() or "y") for a, b in rows]
    lines = text_table(rows, columns).splitlines()
    width = max(len("name"), *(len(a) for a, _ in rows))
    right_edge = len(lines[1])  # the rule spans both columns
    for line, (a, b) in zip(lines[2:], rows, strict=True):
        assert line.startswith(a) and line[width + 2 :].rstrip().endswith(b)
        assert len(line) == right_edge  # right-aligned: every row ends where the rule does
    assert definitions(columns)[2] == "| name | left |"


FLOATS = st.sampled_from([math.nan, math.inf, -math.inf]) | st.floats(allow_nan=False)
TREES = st.recursive(
    FLOATS | st.integers() | st.text(max_size=4) | st.none(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


def _same_finite(a: Any, b: Any) -> bool:
    if isinstance(a, float) and not math.isfinite(a):
        return b is None
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_finite(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_finite(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(TREES)
def test_json_safe_makes_standard_json_and_keeps_every_finite_value(tree: Any) -> None:
    safe = json_safe(tree)
    text = json.dumps(safe, allow_nan=False)
    assert _same_finite(tree, json.loads(text))


def test_results_json_has_no_nan(tmp_path: Path) -> None:
    path = write_json(tmp_path / "results.json", {"runs": [{"tpot_s": math.nan, "n": 1}]})
    doc = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse)
    assert doc == {"runs": [{"tpot_s": None, "n": 1}]}


def _refuse(name: str) -> None:
    raise AssertionError(f"non-standard JSON constant {name}")


def test_request_rows_put_the_labels_first_in_the_order_asked() -> None:
    labels = {"backend": "radix", "policy": "llmd", "faults": ""}
    rows = [RequestRow("a", prompt_tokens=5), RequestRow("b", prompt_tokens=7)]
    first, _ = request_table(labels, rows, keys=("policy", "faults"), position=False)
    assert list(first)[:3] == ["policy", "faults", "request_id"]
    first, second = request_table(labels, rows)
    assert list(first)[:5] == ["backend", "policy", "faults", "position", "request_id"]
    assert (first["position"], second["position"]) == (0, 1)
    assert second["prompt_tokens"] == 7


LAB = Path(__file__).resolve().parents[2] / "adapters" / "lab"


def test_the_rule_row_says_each_columns_alignment() -> None:
    assert markdown_table(["a", "b"], [], "<>").splitlines()[1] == "| :--- | ---: |"
    assert markdown_table(["a", "b"], [], "--").splitlines()[1] == "|---|---|"
    assert definitions([("a", "<", "x|y")])[2] == "| a | x\\|y |"  # a cell's pipe escaped


def test_no_report_writes_a_markdown_table_by_hand() -> None:
    # A header rule outside the one writer is a second table writer.
    rule = re.compile(r"\|\s*:?-{3,}:?\s*\|")
    writer = LAB / "outputs" / "markdown.py"
    found = [
        f"{path.relative_to(LAB)}:{n}"
        for path in sorted(LAB.rglob("*.py"))
        if path != writer
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if rule.search(line)
    ]
    assert found == []
