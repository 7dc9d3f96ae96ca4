"""The layers' import rules: dependencies point down, and what an engine embeds never
loads the measuring bench or an engine it does not run in.

``indexes`` <- ``storage`` <- ``adapters`` <- ``adapters/lab``; the modules that import
vLLM or SGLang (``adapters/vllm/scheduler.py``, the SGLang plug-in) load only when an
engine loads them.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_indexes_import_nothing_above_them_and_no_torch() -> None:
    mods = _modules_after("import prefixkv.indexes, prefixkv.indexes.testing")
    assert "torch" not in mods
    assert not {m for m in mods if m.startswith(("prefixkv.storage", "prefixkv.adapters"))}


def test_the_engine_facing_adapters_do_not_import_the_lab() -> None:
    mods = _modules_after(
        "import prefixkv.adapters, prefixkv.adapters.manager, prefixkv.adapters.vllm, "
        "prefixkv.adapters.sglang, prefixkv.adapters.accounting, prefixkv.adapters.events, "
        "prefixkv.adapters.plugins"
    )
    assert not {m for m in mods if m.startswith("prefixkv.adapters.lab")}
    assert not {m for m in mods if m.split(".")[0] in ("vllm", "sglang", "matplotlib")}
    assert "prefixkv.adapters.plugins.vllm" not in mods
    assert "prefixkv.adapters.plugins.sglang" not in mods


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("indexes", r"prefixkv\.(storage|adapters)|^\s*import torch|^\s*from torch"),
        ("storage", r"prefixkv\.adapters"),
        ("adapters", r"prefixkv\.adapters\.lab|from \.+lab\b|from \.lab\b"),
    ],
)
def test_no_module_imports_upward(folder: str, forbidden: str) -> None:
    pattern = re.compile(forbidden, re.M)
    for path in sorted((ROOT / folder).rglob("*.py")):
        if folder == "adapters" and "lab" in path.relative_to(ROOT / folder).parts:
            continue
        imports = "\n".join(
            line for line in path.read_text().splitlines() if re.match(r"\s*(from|import) ", line)
        )
        assert not pattern.search(imports), f"{path.relative_to(ROOT)} imports upward"


@pytest.mark.parametrize(
    "module", ["prefixkv.adapters.vllm", "prefixkv.adapters.vllm.kv_cache_manager"]
)
def test_the_vllm_kv_cache_manager_imports_neither_vllm_nor_the_lab(module: str) -> None:
    # The class vLLM runs is engine-free: its scheduler module alone imports vLLM.
    mods = _modules_after(f"import {module}; {module}.KVCacheManager")
    assert not {m for m in mods if m.split(".")[0] == "vllm"}
    assert not {m for m in mods if m.startswith("prefixkv.adapters.lab")}
    assert "prefixkv.adapters.vllm.scheduler" not in mods


def test_plugin_errors_are_prefixkv_errors() -> None:
    from prefixkv.adapters.errors import UnsupportedEngineFeatureError
    from prefixkv.adapters.plugins.errors import UnsupportedEngineFeatureError as Old
    from prefixkv.indexes.errors import PrefixKVError

    assert issubclass(UnsupportedEngineFeatureError, PrefixKVError)
    assert Old is UnsupportedEngineFeatureError
