"""The engine plug-ins stay optional: nothing outside them imports vLLM or SGLang."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_adapters_import_no_engine_and_no_plugin() -> None:
    mods = _modules_after("import prefixkv.adapters, prefixkv.adapters.plugins")
    assert not {m for m in mods if m.split(".")[0] in ("vllm", "sglang")}
    assert "prefixkv.adapters.plugins.vllm" not in mods
    assert "prefixkv.adapters.plugins.sglang" not in mods


def test_plugin_errors_are_prefixkv_errors() -> None:
    from prefixkv.adapters.plugins.errors import UnsupportedEngineFeatureError
    from prefixkv.indexes.errors import PrefixKVError

    assert issubclass(UnsupportedEngineFeatureError, PrefixKVError)
