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
    "prefixkv.indexes.tokens:key_error(value)": "the value a message names",
    "prefixkv.storage.allocator:check_owner(value)": "a check of any value",
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


# ------------------------------------------- what compiled code checks on entry
#
# mypyc checks a parameter's declared type when a compiled function is called from
# Python (a bare TypeError, True read as 1) unless that type compiles to ``object``: an
# abstract collection (Iterable, Sequence, Hashable), a Protocol, a callable, ``type[...]``
# or ``Any``, or a union with one of them. Every other public parameter of a compiled
# module is checked by its function itself, with a named error, and listed in
# ``[tool.prefixkv.mypyc.checked]`` (compiled ``object``, so the body's check comes
# first), or is exempt below, for a reason.

# The builtins mypyc compiles to a checked type (its mapper's primitives), and None.
PRIMITIVE = {
    "int", "float", "bool", "str", "bytes", "bytearray", "list", "dict", "set",
    "frozenset", "tuple", "range", "None",
}  # fmt: skip

# Public parameters with a precise type their function does not check: only where the
# callers are prefixkv's own code on a per-block or per-token path, where a check (and
# the boxing an int declared ``object`` costs a compiled caller) would be paid at every
# step. A key names a module, a function or class (``module:Name``) or one parameter.
UNCHECKED = {
    "prefixkv.indexes.validation": "the checks themselves: the name, bound and error class "
    "are the calling code's literals",
    "prefixkv.indexes.tokens:key_error(name)": "a message's label: a literal",
    "prefixkv.storage.allocator:check_owner": "the check's name and owners: literals",
    "prefixkv.indexes.tokens:checked_tokens(offset)": "the token check itself, on every "
    "admit and append: the offset only numbers a message's positions (boxed if widened)",
    "prefixkv.indexes.tokens:as_token_array(offset)": "as checked_tokens(offset)",
    "prefixkv.indexes.tokens:common_prefix_len": "the radix walk's compare, once per node a "
    "match passes, on the tree's own arrays and offsets",
    "prefixkv.indexes.tokens:ChainHasher": "a Protocol: its methods have no body",
    "prefixkv.indexes.hashing:BlockHasher.extend": "TokenKey.block_hashes' hash loop over "
    "its own memo and checked namespace: widened, `hashes` is cast at every block",
    "prefixkv.indexes.records": "an index's answers (PrefixMatch, InsertResult), made by "
    "the index at every match and insert from values it computed",
    "prefixkv.indexes.block_map": "the hash chain's table of its own CachedBlocks, at "
    "every block registered, hit or evicted",
    "prefixkv.indexes.free_queue": "the hash chain's free queue of its own CachedBlocks, "
    "at every block locked, released or evicted",
    "prefixkv.indexes.hash_chain:HashChainIndex.match_prefix(key)": "the engine class's "
    "lookup with its own TokenKey: declared object, the compiled lookup costs about 45 "
    "instructions more a call and 2 a hit block (callgrind, 63 hit blocks: +190)",
    "prefixkv.indexes.hash_chain:HashChainIndex.insert(key)": "the engine class's "
    "registration with its own TokenKey, as match_prefix(key)",
    "prefixkv.indexes.hash_chain:HashChainIndex.extend_locked(key)": "the engine class's "
    "registration of each decoded block with its own TokenKey (about 50 instructions a "
    "call declared object)",
    "prefixkv.indexes.radix:RadixIndex.match_prefix(key)": "the engine class's lookup with "
    "its own TokenKey: declared object, 10 to 19 instructions more a call (0.1-0.5%, "
    "benchmarks/match_profile.py)",
    "prefixkv.indexes.radix:RadixIndex.insert(key)": "the engine class's insert with its "
    "own TokenKey, as match_prefix(key)",
    "prefixkv.storage.allocator:BlockAllocator.check_held(what)": "a message's label, as "
    "the checks' own name",
    "prefixkv.adapters.manager:CacheManager.step_if_running(num_tokens)": "vLLM's engine "
    "class asks it at every decode step with an int it has checked: widened, the int "
    "would be boxed every step (a heap allocation past 256)",
    "prefixkv.adapters.vllm.engine_types": "stand-ins for vLLM's own KVCacheBlock, "
    "KVCacheBlocks, PrefixCacheStats and managers, with vLLM's signatures and, as vLLM's, "
    "no checks; the engine class makes a KVCacheBlock per block",
    "prefixkv.adapters.manager:Lookup": "CacheManager.match's answer, made at every lookup "
    "from the key it checked and its index's PrefixMatch; callers read it and hand it back",
    "prefixkv.adapters.sglang.prefix_cache:PrefixNode": "the cache's own record of a "
    "prefix, made at every match; callers read it",
    "prefixkv.adapters.sglang.page_rows:PageRows.append_page": "alloc_for_decode's call "
    "at every token at page size 1: widened, both ints would be boxed every token",
    "prefixkv.adapters.lab.sim.decode_loops": "the simulator's decode loops, called by the "
    "lab's replay with the requests and engine classes it made, once per token",
}


class Types:
    """What each name means in the compiled modules' annotations, read from the source
    of every prefixkv module they import: a class (a Protocol, a NamedTuple, a dict, or
    a native class of a compiled module), an alias, or an import."""

    def __init__(self) -> None:
        b = backend()
        cfg = config()
        self.compiled = set(cfg["tool"]["prefixkv"]["mypyc"]["modules"])
        files = b.imported_closure(sorted(self.compiled), b.package_dirs(cfg))
        self.trees = {m: ast.parse(p.read_text()) for m, p in files.items()}

    def checked(self, module: str, note: ast.expr) -> bool:
        """Whether mypyc compiles the annotation ``note`` of ``module`` to a type it
        checks on entry."""
        if isinstance(note, ast.Constant):
            if isinstance(note.value, str):  # a quoted annotation
                return self.checked(module, ast.parse(note.value, mode="eval").body)
            return note.value is None
        if isinstance(note, ast.BinOp) and isinstance(note.op, ast.BitOr):
            return self.checked(module, note.left) and self.checked(module, note.right)
        if isinstance(note, ast.Subscript):
            return self.checked(module, note.value)
        if isinstance(note, ast.Name):
            return self.name_checked(module, note.id)
        return False  # an attribute of an outside module (typing.Any, enum.Enum, ...)

    def name_checked(self, module: str, name: str) -> bool:
        tree = self.trees.get(module)
        for node in [] if tree is None else tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                bases = {ast.unparse(b).split("[")[0].rsplit(".", 1)[-1] for b in node.bases}
                if "Protocol" in bases:
                    return False
                if bases & {"NamedTuple", "dict"}:
                    return True  # a tuple, a dict
                return module in self.compiled  # a native class; else interpreted
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    assert node.value is not None
                    return self.checked(module, node.value)  # an alias
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self.resolve(module, node)
                        return source in self.trees and self.name_checked(source, alias.name)
        return name in PRIMITIVE

    def resolve(self, module: str, node: ast.ImportFrom) -> str:
        """The module an import names, relative imports resolved."""
        if not node.level:
            return node.module or ""
        package = module if self.trees[module] is None else module.rsplit(".", 1)[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        return ".".join([*base, node.module] if node.module else base)


def unchecked_parameters() -> list[str]:
    """Public parameters that compiled code checks on entry, less the ones the table
    lists: their functions do not check them."""
    table = backend().checked_parameters(config())
    types = Types()
    found = []
    for module, path in sources().items():
        listed = table.get(module, {})
        for name, fn in public_functions(path):
            for arg in parameters(fn):
                note = arg.annotation
                if arg.arg in listed.get(name, []) or note is None:
                    continue
                if types.checked(module, note):
                    found.append(f"{module}:{name}({arg.arg})")
    return found


def exemption(entry: str) -> str | None:
    """The key of ``UNCHECKED`` that exempts ``entry`` (module:Name.method(param))."""
    module, _, rest = entry.partition(":")
    name = rest.partition("(")[0]
    parts = name.split(".")
    keys = [entry, *(f"{module}:{'.'.join(parts[:i])}" for i in range(len(parts), 0, -1))]
    return next((k for k in [*keys, module] if k in UNCHECKED), None)


def test_every_public_parameter_compiled_code_checks_is_checked_by_its_function() -> None:
    found = unchecked_parameters()
    assert [e for e in found if exemption(e) is None] == []
    used = {exemption(e) for e in found}
    assert sorted(set(UNCHECKED) - used) == []  # the exemptions stay current


def test_the_listing_knows_what_compiled_code_checks() -> None:
    types = Types()
    module = "prefixkv.adapters.vllm.kv_cache_manager"
    expect = {
        "int": True,
        "int | None": True,
        "'list[int]'": True,
        "tuple[Sequence[Any], ...]": True,
        "Hashable": False,
        "Iterable[int]": False,
        "RequestLike": False,  # a Protocol of an interpreted module
        "PrefixIndex | str": False,  # a Protocol in a union: object
        "Sequence[CacheObserver]": False,
        "Any": False,
        "TokenKey": True,  # a native class of a compiled module
        "Owner": True,
        "ExtraKey | None": True,  # an alias of a tuple
        "Lookup": True,  # a NamedTuple: a tuple
        "EngineTypes": True,
    }
    for text, checked in expect.items():
        assert types.checked(module, ast.parse(text, mode="eval").body) is checked, text
