"""``pip install .`` without torch: the package's face imports and runs, and the parts
that need torch (the ``torch`` extra) fail in one line naming it.

Each check runs in a fresh interpreter whose import system cannot find torch: a finder
first on ``sys.meta_path`` records every lookup of ``torch`` (an import or a probe)
and answers it as an install without torch would (``ModuleNotFoundError``). The face
must not even look for torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "tests" / "data" / "fidelity" / "mooncake_conversation_head.jsonl"

BLOCKER = """
import sys

LOOKED = []

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            LOOKED.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTorch())
"""

FACE = [
    "prefixkv.indexes",
    "prefixkv.storage",
    "prefixkv.adapters",
    "prefixkv.adapters.manager",
    "prefixkv.adapters.vllm",
    "prefixkv.adapters.vllm.kv_cache_manager",
    "prefixkv.adapters.sglang",
    "prefixkv.adapters.events",
    "prefixkv.adapters.events.transport",
    "prefixkv.adapters.router",
    "prefixkv.adapters.lab",
    "prefixkv.adapters.lab.cli",
    "prefixkv.adapters.lab.sim",
]


def without_torch(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after the blocker, in a fresh interpreter from the repository root."""
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code],
        capture_output=True,
        text=True,
        timeout=300,  # a hang guard only: the runs take seconds
        cwd=ROOT,
        check=False,
    )


def test_the_face_imports_and_replays_without_looking_for_torch(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    code = "\n".join(f"import {m}" for m in FACE) + (
        "\nfrom prefixkv.adapters.lab.cli import main\n"
        f"status = main(['replay', {str(MOONCAKE)!r}, '--index', 'radix', '--max-requests', "
        f"'20', '-q', '--out', {str(out)!r}])\n"
        "assert status == 0, status\n"
        "assert not LOOKED, LOOKED\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    done = without_torch(code)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
    assert out.stat().st_size > 0


@pytest.mark.parametrize(
    ("statement", "what"),
    [
        ("from prefixkv.storage import PagedKVCache", "prefixkv.storage.PagedKVCache"),
        ("import prefixkv.storage.paged_kv", "prefixkv.storage.PagedKVCache"),
        ("from prefixkv.adapters.engine import Engine", "prefixkv.adapters.engine"),
        ("import prefixkv.adapters.engine.scheduler", "prefixkv.adapters.engine"),
        ("import prefixkv.adapters.engine.testing", "prefixkv.adapters.engine"),
        (
            "from prefixkv.adapters.lab.sim.calibration import calibrate; calibrate()",
            "the reference engine's calibration",
        ),
    ],
)
def test_what_needs_torch_fails_in_one_line_naming_the_extra(statement: str, what: str) -> None:
    code = (
        "from prefixkv.storage.extras import ExtraNotInstalledError\n"
        "try:\n"
        f"    {statement}\n"
        "except ExtraNotInstalledError as exc:\n"
        "    assert isinstance(exc, ImportError) and exc.__cause__ is None\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('imported without torch')\n"
    )
    done = without_torch(code)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = done.stdout.splitlines()
    assert line.startswith(what) and line.endswith(
        ": torch is not installed; pip install 'prefixkv[torch]'"
    ), line


def test_an_uncaught_import_ends_with_the_one_line() -> None:
    done = without_torch("import prefixkv.adapters.engine\n")
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "prefixkv.storage.extras.ExtraNotInstalledError: prefixkv.adapters.engine (the reference "
        "engine): torch is not installed; pip install 'prefixkv[torch]'"
    )


def test_calibrate_of_the_reference_engine_says_so_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code = (
        "from prefixkv.adapters.lab.cli import main\n"
        f"raise SystemExit(main(['calibrate', '--quick', '--out', {str(out)!r}]))\n"
    )
    done = without_torch(code)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        "prefixkv: error: prefixkv calibrate (the reference engine): torch is not installed; "
        "pip install 'prefixkv[torch]' or calibrate from a served engine: --server URL or "
        "--from-vllm-bench FILE"
    ]
    assert not out.exists()


def test_a_missing_module_that_is_not_the_extras_is_not_renamed() -> None:
    code = (
        "from prefixkv.storage.extras import extra_imports\n"
        "try:\n"
        "    with extra_imports('torch', ('torch',), 'x'):\n"
        "        import torchvision_not_here\n"
        "except ModuleNotFoundError as exc:\n"
        "    assert type(exc) is ModuleNotFoundError, type(exc)\n"
        "    print(exc.name)\n"
    )
    done = without_torch(code)
    assert done.returncode == 0 and done.stdout.strip() == "torchvision_not_here", done.stderr
