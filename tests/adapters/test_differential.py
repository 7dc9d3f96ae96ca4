"""The same random operation sequences give the same result at every step on the
pure-Python package and on the compiled build (``tests/adapters/differential.py`` runs them and
prints every result, error and state; see there for what it covers).

``make test-compiled`` runs this on the installed wheel, with ``PREFIXKV_PURE_PYTHON``
naming this checkout's pure-Python environment; a plain ``pytest`` skips it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

PURE = os.environ.get("PREFIXKV_PURE_PYTHON")
DRIVER = Path(__file__).with_name("differential.py")
STEPS = 1500  # per backend; with the engine classes' trace, about 11,000 lines a seed


def run(python: str, seed: int) -> list[str]:
    # One hash seed for both (the engine classes' events carry hashes); the driver's helpers
    # and the recorders' K-live loop on the path (PYTHONSAFEPATH keeps a script's folder
    # off it).
    path = [ROOT / "tests", ROOT / "tests" / "engines" / "recorders"]
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join(map(str, path))}
    cmd = [python, str(DRIVER), str(seed), str(STEPS)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.skipif(PURE is None, reason="make test-compiled runs it (PREFIXKV_PURE_PYTHON)")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_both_builds_give_the_same_result_at_every_step(seed: int) -> None:
    assert PURE is not None
    compiled, pure = run(sys.executable, seed), run(PURE, seed)
    assert (compiled.pop(0), pure.pop(0)) == ("compiled", "pure Python")  # the builds
    # The sequences reach what they are for: admissions, refusals, evictions, events.
    text = "\n".join(pure)
    for seen in ("Admission(", "PrefixKVError: ", "InvalidTokenError: ", "BlockRemoved("):
        assert seen in text, seen
    first = next((i for i, (c, p) in enumerate(zip(compiled, pure, strict=False)) if c != p), None)
    assert first is None, f"line {first}:\ncompiled: {compiled[first]}\npure:     {pure[first]}"
    assert len(compiled) == len(pure)
