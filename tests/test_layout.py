"""The layers' import rules: dependencies point down, and what an engine embeds never
loads the measuring bench or an engine it does not run in.

``indexes`` <- ``storage`` <- ``adapters`` <- ``adapters/lab``; the plug-ins import
vLLM or SGLang only when an engine loads them.
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
    assert "prefixkv.adapters.sglang.plugin" not in mods


def test_sglangs_prefix_cache_imports_neither_sglang_torch_nor_the_lab() -> None:
    # The class SGLang loads is importable (and tested) without SGLang; only its
    # registration, plugin.py, imports the engine, when SGLang loads it.
    mods = _modules_after("import prefixkv.adapters.sglang; prefixkv.adapters.sglang.PrefixCache")
    assert not {m for m in mods if m.split(".")[0] in ("sglang", "torch")}
    assert not {m for m in mods if m.startswith("prefixkv.adapters.lab")}
    assert "prefixkv.adapters.sglang.plugin" not in mods


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


def test_plugin_errors_are_prefixkv_errors() -> None:
    from prefixkv.adapters.plugins.errors import UnsupportedEngineFeatureError
    from prefixkv.indexes.errors import PrefixKVError

    assert issubclass(UnsupportedEngineFeatureError, PrefixKVError)
