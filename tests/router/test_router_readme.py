"""The router README's examples run as written."""

from __future__ import annotations

import re

from helpers import ROOT

README = ROOT / "adapters" / "router" / "README.md"


def test_the_router_readme_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        scope: dict[str, object] = {}
        exec(compile(block, str(README), "exec"), scope)
        assert scope["decision"] is not None
