"""The layers' import rules: dependencies point down, and what an engine or a router
embeds never loads the measuring bench, ZeroMQ, torch, or an engine it does not run in.

``indexes`` <- ``storage`` <- ``adapters`` (``router`` among them) <- ``adapters/lab``;
the modules that import vLLM or SGLang (``adapters/vllm/scheduler.py``, the SGLang
plug-in) load only when an engine loads them; the events transport (ZeroMQ) loads only
when something publishes or subscribes.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


HEAVY = ("zmq", "torch", "vllm", "sglang", "matplotlib")
"""What an engine-facing module must not load: a socket library, the tensor library,
an engine it may not run in, the plotting library."""


def _heavy(mods: set[str]) -> set[str]:
    return {m for m in mods if m.split(".")[0] in HEAVY or m.startswith("prefixkv.adapters.lab")}


def test_the_indexes_import_nothing_above_them_and_no_torch() -> None:
    mods = _modules_after("import prefixkv.indexes, prefixkv.indexes.testing")
    assert "torch" not in mods
    assert not {m for m in mods if m.startswith(("prefixkv.storage", "prefixkv.adapters"))}


def test_the_engine_facing_adapters_do_not_import_the_lab() -> None:
    mods = _modules_after(
        "import prefixkv.adapters, prefixkv.adapters.manager, prefixkv.adapters.vllm, "
        "prefixkv.adapters.sglang, prefixkv.adapters.accounting, prefixkv.adapters.events"
    )
    assert not {m for m in mods if m.startswith("prefixkv.adapters.lab")}
    assert not {m for m in mods if m.split(".")[0] in ("vllm", "sglang", "matplotlib")}
    assert "prefixkv.adapters.vllm.scheduler" not in mods
    assert "prefixkv.adapters.sglang.plugin" not in mods


def test_sglangs_prefix_cache_imports_neither_sglang_torch_nor_the_lab() -> None:
    # The class SGLang loads is importable (and tested) without SGLang; only its
    # registration, plugin.py, imports the engine, when SGLang loads it. Its
    # scheduler-side steps (simulated.py) drive it engine-free without the lab.
    mods = _modules_after(
        "import prefixkv.adapters.sglang, prefixkv.adapters.sglang.simulated; "
        "prefixkv.adapters.sglang.PrefixCache"
    )
    assert not {m for m in mods if m.split(".")[0] in ("sglang", "torch")}
    assert not {m for m in mods if m.startswith("prefixkv.adapters.lab")}
    assert "prefixkv.adapters.sglang.plugin" not in mods


@pytest.mark.parametrize(
    "statement",
    [
        "import prefixkv.adapters",
        "import prefixkv.adapters.manager",
        "import prefixkv.adapters.events",
        "import prefixkv.adapters.events.codec, prefixkv.adapters.events.wire",
        "import prefixkv.adapters.router",
    ],
)
def test_the_manager_event_codec_and_router_load_no_zmq_torch_lab_or_engine(statement: str) -> None:
    assert not _heavy(_modules_after(statement))


def _package(name: str, *modules: str) -> set[str]:
    return {name, *(f"{name}.{m}" for m in modules)}


_LIFECYCLE = {
    "prefixkv",
    *_package("prefixkv.indexes", "base", "errors", "lazy", "records", "tokens", "validation"),
    *_package("prefixkv.storage", "allocator", "block_table", "errors"),
    *_package("prefixkv.adapters", "observer", "totals"),
    *_package("prefixkv.adapters.events", "dialects", "wire"),
}
_HASH_CHAIN = {
    f"prefixkv.indexes.{m}"
    for m in ("block_map", "free_queue", "hash_chain", "hashing", "vllm_hashing")
}
ENGINE_PATHS = {
    "prefixkv.adapters.manager": {*_LIFECYCLE, *_HASH_CHAIN, "prefixkv.adapters.manager"},
    "prefixkv.adapters.vllm": {
        *_LIFECYCLE,
        *_HASH_CHAIN,
        "prefixkv.indexes.registry",
        "prefixkv.adapters.manager",
        "prefixkv.adapters.requests",
        "prefixkv.adapters.errors",  # UnsupportedEngineFeatureError: inputs not modelled
        *_package("prefixkv.adapters.vllm", "engine_types", "kv_cache_manager"),
    },
    "prefixkv.adapters.sglang": {
        *_LIFECYCLE,
        "prefixkv.indexes.registry",
        "prefixkv.adapters.requests",
        *_package("prefixkv.adapters.sglang", "_mypyc", "page_rows", "pools", "prefix_cache"),
    },
}
"""Every prefixkv module importing an engine-facing package may load: the request
lifecycle (the manager or engine class, the index contract and storage beneath it, the
observer hooks, the totals, the event structs and the dialect table). The backends and
the event recorders load when an engine first names them. A module added to a path must
be added here, on purpose."""

OFF_THE_ENGINE_PATH = (
    "prefixkv.adapters.events.files",
    "prefixkv.adapters.events.index",
    "prefixkv.adapters.events.transport",
    "prefixkv.adapters.outputs",
    "prefixkv.adapters.accounting",
    "prefixkv.adapters.router",
    "prefixkv.adapters.lab",
    "zmq",
)
"""What an engine author's import never loads: event files, the consumer index, the
report-file rule, the boundary tracker, the router, the lab, ZeroMQ."""


@pytest.mark.parametrize("module", sorted(ENGINE_PATHS))
def test_the_engine_path_loads_only_the_request_lifecycle(module: str) -> None:
    mods = _modules_after(f"import {module}")
    loaded = {m for m in mods if m == "prefixkv" or m.startswith("prefixkv.")}
    assert module in loaded
    beyond = loaded - ENGINE_PATHS[module]
    assert not beyond
    off = {m for m in mods for o in OFF_THE_ENGINE_PATH if m == o or m.startswith(f"{o}.")}
    assert not off
    assert "importlib.metadata" not in mods  # the registry reads entry points when asked


_OTHER_ENGINE = {
    "vllm": ("radix", "sglang_hashing", "sglang_recorder", "sglang_wire", "codec"),
    "sglang": ("hash_chain", "block_map", "free_queue", "vllm_hashing", "events.recorder"),
}
"""Modules of the other engine's backend and events that a run of one never loads."""


@pytest.mark.parametrize(
    ("engine", "statement"),
    [
        (
            "vllm",
            "from prefixkv.adapters.vllm import KVCacheManager; "
            "m = KVCacheManager('hash_chain', 9, 4, enable_kv_cache_events=True); "
            "m.take_events()",
        ),
        (
            "sglang",
            "from prefixkv.adapters.sglang import PrefixCache; "
            "c = PrefixCache.create_simulated('radix', capacity_tokens=64, page_size=1, "
            "enable_kv_cache_events=True); c.take_events()",
        ),
    ],
)
def test_an_engine_running_its_backend_never_loads_the_other_engines(
    engine: str, statement: str
) -> None:
    mods = _modules_after(statement)
    ours = {m for m in mods if m.startswith("prefixkv.")}
    assert not {m for m in ours for o in _OTHER_ENGINE[engine] if m.endswith(o)}


def test_the_events_face_names_each_name_from_its_home_module() -> None:
    import prefixkv.adapters.events as events

    homes = events._HOMES
    assert sorted(homes) == sorted(events.__all__)
    for name, home in homes.items():
        module = importlib.import_module(f"prefixkv.adapters.events.{home}")
        assert getattr(events, name) is getattr(module, name), name
    namespace: dict[str, object] = {}
    exec("from prefixkv.adapters.events import *", namespace)
    assert set(events.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        events.Nope  # noqa: B018


def test_the_event_transport_loads_on_first_use() -> None:
    mods = _modules_after("import prefixkv.adapters.events as e; e.ZmqEventSubscriber; e.END_SEQ")
    assert {"zmq", "prefixkv.adapters.events.transport"} <= mods


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        ("indexes", r"prefixkv\.(storage|adapters)|^\s*import torch|^\s*from torch"),
        ("storage", r"prefixkv\.adapters"),
        ("adapters", r"prefixkv\.adapters\.lab|from \.+lab\b|from \.lab\b"),
        ("adapters/router", r"prefixkv\.adapters\.(lab|engine)|from \.\.(lab|engine)\b|import zmq"),
    ],
)
def test_no_module_imports_upward(folder: str, forbidden: str) -> None:
    pattern = re.compile(forbidden, re.M)
    paths = sorted((ROOT / folder).rglob("*.py"))
    assert paths, f"{folder} has no modules"
    for path in paths:
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
    assert not _heavy(mods)  # no vLLM, lab, ZeroMQ or torch
    assert "prefixkv.adapters.vllm.scheduler" not in mods


def test_plugin_errors_are_prefixkv_errors() -> None:
    from prefixkv.adapters.errors import UnsupportedEngineFeatureError
    from prefixkv.indexes.errors import PrefixKVError

    assert issubclass(UnsupportedEngineFeatureError, PrefixKVError)


PRODUCT_TESTS = (
    "test_engine_classes.py", "test_engine_class_fuzz.py", "test_engine_class_lookups.py",
    "test_isolation.py", "test_request_shapes.py", "test_decode_cost.py", "test_adversarial.py",
    "test_vllm_kv_cache_manager.py", "kv_event_drivers.py",
)  # fmt: skip
"""Tests of the engine classes: they drive the product, never the measuring bench."""


@pytest.mark.parametrize("name", PRODUCT_TESTS)
def test_the_engine_classes_tests_do_not_import_the_lab(name: str) -> None:
    (path,) = (ROOT / "tests").rglob(name)  # the tests live one folder per room
    text = path.read_text(encoding="utf-8")
    assert not re.search(r"prefixkv\.adapters\.lab\b", text), name


def test_the_lab_keeps_no_copy_of_an_engine_admission_rule() -> None:
    # "Room = free + evictable - the hit's own evictable" is the engine classes' to
    # answer (KVCacheManager.allocate_slots, PrefixCache's sizes under a lock): the
    # lab and the SGLang scheduler-side steps never count a hit's evictable blocks.
    places = [*sorted((ROOT / "adapters" / "lab").rglob("*.py")),
              ROOT / "adapters" / "sglang" / "simulated.py"]  # fmt: skip
    copies = [p.name for p in places if "count_evictable" in p.read_text(encoding="utf-8")]
    assert not copies


MAX_FUNCTION_LINES = 59
"""The longest a library function may be, docstring included (``def`` to last line)."""

LONG_FOR_NOW: set[str] = set()
"""Functions still over the limit, each to be split into named steps: the list only
shrinks (an entry that is no longer long fails the test until it is removed)."""


def _long_functions(folders: tuple[str, ...]) -> dict[str, int]:
    found: dict[str, int] = {}
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node, qualname in _functions(tree.body, ""):
                span = (node.end_lineno or node.lineno) - node.lineno + 1
                if span > MAX_FUNCTION_LINES:
                    found[f"{path.relative_to(ROOT).as_posix()}:{qualname}"] = span
    return found


def _functions(
    body: list[ast.stmt], prefix: str
) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, prefix + node.name
            yield from _functions(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node.body, f"{prefix}{node.name}.")
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from _functions(inner, prefix)


def test_no_library_function_is_60_lines_or_longer() -> None:
    found = _long_functions(("indexes", "storage", "adapters"))
    assert sorted(set(found) - LONG_FOR_NOW) == [], "split these into named steps"
    assert sorted(LONG_FOR_NOW - set(found)) == [], "no longer long: remove from LONG_FOR_NOW"
