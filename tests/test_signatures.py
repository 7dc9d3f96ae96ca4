"""The compiled modules' source says what each public function takes: no parameter
declared ``object`` (but the few that take any value), no ``@overload`` twin; the
parameters a function checks itself are listed once, in pyproject.toml's
``[tool.prefixkv.mypyc.checked]``, which the build backend compiles declared ``object``
(``tests/adapters/test_checked_parameters.py`` runs the wrong types on both builds)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from test_build import backend

ROOT = Path(__file__).resolve().parent.parent

# Parameters that take any value by design, so ``object`` is their precise type.
ANY_VALUE = {
    # the checks themselves: they name what a wrong value is
    **{
        f"prefixkv.indexes.validation:{fn}({p})": "a check of any value"
        for fn, p in [
            ("check_count", "value"),
            ("check_positive", "value"),
            ("check_bool", "value"),
            ("check_block_ids", "block_ids"),
            ("check_sequence", "value"),
            ("check_enough_block_ids", "block_ids"),
        ]
    },
    "prefixkv.indexes.tokens:normalize_extra_key(extra_key)": "a check of any value",
    "prefixkv.indexes.tokens:TokenKey.index_memo(owner)": "an identity, compared with is",
    "prefixkv.indexes.tokens:TokenKey.set_index_memo(owner)": "an identity, compared with is",
    "prefixkv.indexes.tokens:TokenKey.set_index_memo(value)": "the index's own memo",
    "prefixkv.indexes.records:PrefixMatch.__init__(handle)": "the index's own handle",
    "prefixkv.indexes.records:InsertResult.__init__(handle)": "the index's own handle",
    "prefixkv.adapters.vllm.engine_types:SingleTypeManager.__init__(kv_cache_spec)": "vLLM's, kept",
    "prefixkv.adapters.vllm.engine_types:Coordinator.__init__(kv_cache_spec)": "vLLM's, kept",
    "prefixkv.adapters.vllm.kv_cache_manager:KVCacheManager.__init__(kv_cache_spec)": "kept",
    "prefixkv.adapters.vllm.kv_cache_manager:KVCacheManager.__init__(kv_cache_config)": "kept",
    "prefixkv.adapters.vllm.kv_cache_manager:KVCacheManager.allocate_slots(new_computed_blocks)": (
        "vLLM's KVCacheBlocks or prefixkv's: read by duck typing"
    ),
}


def config() -> dict[str, Any]:
    return dict(backend().load_config())


def sources() -> dict[str, Path]:
    """The compiled modules' source files by module name."""
    b = backend()
    cfg = config()
    dirs = b.package_dirs(cfg)
    return {m: b.module_file(m, dirs) for m in cfg["tool"]["prefixkv"]["mypyc"]["modules"]}


def public_functions(path: Path) -> list[tuple[str, ast.FunctionDef]]:
    """The public functions and methods (constructors included) of public classes."""
    return [
        (name, fn)
        for name, fn in backend().functions(ast.parse(path.read_text()).body)
        if all(not part.startswith("_") or part == "__init__" for part in name.split("."))
    ]


def parameters(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def test_no_public_parameter_is_declared_object() -> None:
    found = []
    for module, path in sources().items():
        for name, fn in public_functions(path):
            for arg in parameters(fn):
                note = arg.annotation
                if note is not None and ast.unparse(note) == "object":
                    found.append(f"{module}:{name}({arg.arg})")
    assert sorted(set(found) - set(ANY_VALUE)) == []
    assert sorted(set(ANY_VALUE) - set(found)) == []  # the list stays current


def test_no_function_has_an_overload_twin() -> None:
    found = []
    for module, path in sources().items():
        for name, fn in backend().functions(ast.parse(path.read_text()).body):
            if any(ast.unparse(d).endswith("overload") for d in fn.decorator_list):
                found.append(f"{module}:{name}")
    assert found == []


def test_the_checked_table_widens_exactly_its_parameters() -> None:
    b = backend()
    cfg = config()
    table = b.checked_parameters(cfg)
    copies = b.widen_checked(cfg)
    assert set(copies) == set(table)
    for module, text in copies.items():
        source = sources()[module].read_text()
        assert len(text.splitlines()) == len(source.splitlines())  # tracebacks still point
        widened = {
            f"{name}({arg.arg})"
            for (name, fn), (_, old) in zip(
                b.functions(ast.parse(text).body),
                b.functions(ast.parse(source).body),
                strict=True,
            )
            for arg, was in zip(parameters(fn), parameters(old), strict=True)
            if ast.dump(arg) != ast.dump(was)
        }
        listed = {f"{name}({p})" for name, params in table[module].items() for p in params}
        assert widened == listed, module
        for entry in listed:  # each one declared object in the copy, precisely in the source
            name, _, p = entry[:-1].partition("(")
            fn = dict(b.functions(ast.parse(text).body))[name]
            (arg,) = [a for a in parameters(fn) if a.arg == p]
            assert arg.annotation is not None and ast.unparse(arg.annotation) == "object"


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ({"prefixkv.storage.allocator": ["BlockAllocator.allocate(no_such)"]}, "no_such"),
        ({"prefixkv.storage.allocator": ["BlockAllocator.gone(num_blocks)"]}, "gone"),
        ({"prefixkv.storage.allocator": ["BlockAllocator.allocate"]}, "bad entry"),
        ({"prefixkv.adapters.lab.replay": ["replay(trace)"]}, "not a compiled module"),
        ({"prefixkv.indexes.validation": ["check_bool(value)"]}, "declared object"),
    ],
)
def test_a_wrong_table_entry_fails_the_build_naming_it(
    entries: dict[str, list[str]], error: str
) -> None:
    b = backend()
    cfg = config()
    cfg["tool"]["prefixkv"]["mypyc"]["checked"] = entries
    with pytest.raises(b.BuildError, match=error):
        b.widen_checked(cfg)


def test_an_overload_twin_fails_the_build() -> None:
    b = backend()
    text = (
        "from typing import overload\n"
        "@overload\n"
        "def f(n: int) -> int: ...\n"
        "def f(n: int) -> int:\n"
        "    return n\n"
    )
    with pytest.raises(b.BuildError, match="overload"):
        b.widened(text, {"f": ["n"]}, "x.py")
