"""The build under test is the one ``make test`` says it runs, and the compiled build's
script falls back to pure Python, saying so once, where it cannot compile.

``make test`` runs the suite twice: on the pure-Python package
(``PREFIXKV_EXPECT_BUILD="pure Python"``) and on the compiled modules laid out by
``.ci/build_compiled.py --site`` first on ``PYTHONPATH``
(``PREFIXKV_EXPECT_BUILD=compiled``); a plain ``pytest`` names no build.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefixkv.indexes.buildinfo import build_kind, compiled_modules

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "build_compiled.py"
EXPECTED = os.environ.get("PREFIXKV_EXPECT_BUILD")


def listed_modules() -> list[str]:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["prefixkv"]["mypyc"]["modules"])


@pytest.mark.skipif(EXPECTED is None, reason="make test names the build it runs")
def test_the_build_under_test_is_the_one_make_test_names() -> None:
    modules = listed_modules()
    for name in modules:
        importlib.import_module(name)
    assert build_kind() == EXPECTED
    if EXPECTED == "compiled":
        assert set(modules) <= set(compiled_modules())
    else:
        assert compiled_modules() == []


def test_the_listed_modules_exist_and_the_core_is_listed() -> None:
    modules = listed_modules()
    for name in modules:
        importlib.import_module(name)
    assert {"prefixkv.indexes.hash_chain", "prefixkv.indexes.radix"} <= set(modules)


def test_without_a_c_compiler_the_build_says_so_once_and_builds_nothing(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "CC": "no-such-c-compiler"}
    cmd = [sys.executable, str(SCRIPT), "--site", str(tmp_path / "site")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("no C compiler (no-such-c-compiler not found)") == 1
    assert "pure Python only" in done.stderr
    assert not (tmp_path / "site").exists()
    required = subprocess.run([*cmd, "--require"], env=env, capture_output=True, timeout=120)
    assert required.returncode == 1
