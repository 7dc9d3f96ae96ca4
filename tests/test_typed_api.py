"""Callers see precise types: ``mypy --strict`` accepts a typed caller of the public API
(``tests/data/typed_caller.py``, results checked with ``assert_type``) and rejects each
wrong call in ``tests/data/typed_caller_wrong.py`` (constructors included), although the
compiled build compiles the parameters a function checks itself declared ``object``
(pyproject.toml's ``[tool.prefixkv.mypyc.checked]``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


@pytest.fixture(scope="module")
def mypy_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    # The source tree as the package mypy reads (the installed one may be an editable
    # path hook, or a compiled wheel with no sources).
    tmp = tmp_path_factory.mktemp("mypy")
    package = tmp / "path" / "prefixkv"
    package.mkdir(parents=True)
    for part in ("indexes", "storage", "adapters"):
        (package / part).symlink_to(ROOT / part)
    files = [DATA / "typed_caller.py", DATA / "typed_caller_wrong.py"]
    argv = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
            "--cache-dir", str(tmp / "cache"), "--no-error-summary", "--show-error-codes",
            *map(str, files)]  # fmt: skip
    env = {"MYPYPATH": str(tmp / "path"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    report: dict[str, list[str]] = {f.name: [] for f in files}
    for line in proc.stdout.splitlines():
        m = re.match(r"(.*?\.py):(\d+): error: (.*)", line)
        if m:
            report[Path(m.group(1)).name].append(f"{m.group(2)}: {m.group(3)}")
    return report


def test_a_typed_caller_type_checks(mypy_report: dict[str, list[str]]) -> None:
    assert mypy_report["typed_caller.py"] == []


def test_each_wrong_call_is_rejected(mypy_report: dict[str, list[str]]) -> None:
    lines = (DATA / "typed_caller_wrong.py").read_text().splitlines()
    wrong = {i for i, line in enumerate(lines, 1) if line.endswith("# wrong")}
    flagged = {int(e.split(":")[0]) for e in mypy_report["typed_caller_wrong.py"]}
    assert len(wrong) == 16
    assert flagged == wrong, mypy_report["typed_caller_wrong.py"]
