"""The README's Python examples run as written (and print what the README says)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

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
