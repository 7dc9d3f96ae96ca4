"""An inert ``torchvision`` for SGLang 0.5.23 on a CPU-only torch.

SGLang's memory-pool modules import its model configs, whose multimodal helpers import
``torchvision`` at module level; PyPI's Linux torchvision wheels pin a CUDA torch, which
pip would install over the CPU one. Nothing on the prefix-cache, allocator or
scheduler-helper paths calls torchvision: its names are only bound at import time
(default arguments, type hints, base classes). ``install()`` serves every
``torchvision[.*]`` module as a stand-in whose attributes are inert classes; calling,
subscripting or subclassing them works, and iterating them yields nothing. Anything
that really used one would get nonsense, so keep it out of processes that run models.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

PREFIX = "torchvision"


class _InertMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{cls.__name__}.{name}")

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())


class _Inert(metaclass=_InertMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(name)()

    def __iter__(self) -> Any:
        return iter(())


def _inert(name: str) -> type:
    return _InertMeta(name.rsplit(".", 1)[-1], (_Inert,), {"__qualname__": name})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(f"{self.__name__}.{name}")


class _Loader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []  # a package, so submodule imports come back here
        module.__version__ = "0.0.0+inert"  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == PREFIX or fullname.startswith(PREFIX + "."):
            return importlib.machinery.ModuleSpec(fullname, _Loader(), is_package=True)
        return None


def install() -> None:
    """Serve ``torchvision`` from the stand-in (idempotent; a real one is left alone)."""
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    try:
        import torchvision  # noqa: F401  # a real torchvision wins
    except ImportError:
        sys.meta_path.insert(0, _Finder())
