"""The README's Python examples run as written (and print what the README says)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


def test_readme_examples_run() -> None:
    scope: dict[str, object] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in BLOCKS:
            exec(compile(block, "README.md", "exec"), scope)
    lines = out.getvalue().splitlines()
    assert "hash_chain 0 16 64" in lines and "radix 0 30 79" in lines
    engine_lines = [line for line in lines if line.startswith(("none", "hash_chain [", "radix ["))]
    outputs = {line.split(" [", 1)[1].rsplit("]", 1)[0] for line in engine_lines}
    assert len(engine_lines) == 3 and len(outputs) == 1  # identical tokens for all three


def test_readme_dataframe_example_is_five_lines_and_gives_dataframes() -> None:
    pandas = pytest.importorskip("pandas")
    (block,) = [b for b in BLOCKS if "compare_backends" in b]
    assert len([line for line in block.splitlines() if line.strip()]) == 5
    scope: dict[str, Any] = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), scope)
    t = scope["t"]
    assert isinstance(t.requests, pandas.DataFrame) and isinstance(t.runs, pandas.DataFrame)
    assert set(scope["timed"]["engine"]) == {"vllm"}  # one scheduler: only the index varies
    assert len(t.requests) == 2 * 2 * 60  # k_live and arrival, two backends, 60 requests
    printed = out.getvalue()
    assert "ttft_p50_s" in printed and "k_live" in printed and "arrival" in printed
