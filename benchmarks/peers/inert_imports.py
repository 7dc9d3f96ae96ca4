"""Serve named packages as inert placeholders, so SGLang's cache modules import without them.

SGLang 0.5.23's radix-cache import chain reaches model configs that ``import
torchvision`` at module level and only bind its names (default arguments, type
hints); the radix cache never calls them. PyPI's torchvision wheels for Linux pull a
CUDA torch, so the recording scripts install this finder instead. Anything that
really used a placeholder would fail loudly or produce nonsense, which the fixture
checks would catch.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class Placeholder:
    """Accepts any use at import time: attributes, calls, subscripts, subclassing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:
        return Placeholder()

    def __getattr__(self, name: str) -> Placeholder:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder()

    def __getitem__(self, item: Any) -> Placeholder:
        return Placeholder()

    def __iter__(self) -> Any:
        return iter(())

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (Placeholder,)


class _InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder()


class _InertFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        self.prefixes = prefixes

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.prefixes:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _InertModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0"  # transformers parses the version of what it finds
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install(prefixes: tuple[str, ...] = ("torchvision",)) -> None:
    """Serve every module under ``prefixes`` (top-level names) as an inert placeholder."""
    if not any(isinstance(f, _InertFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _InertFinder(prefixes))
