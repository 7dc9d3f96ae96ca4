"""The ``prefixkv`` parser, its argument types and exit codes (standard library and
prefixkv's errors only). Sizes are tokens with vLLM's suffixes (``1k`` = 1,000, ``1K`` =
1,024). A bad argument raises :class:`CLIUsageError`, printed as one line."""

from __future__ import annotations

import argparse
import importlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from prefixkv.indexes.errors import PrefixKVError

T = TypeVar("T")

EXIT_ERROR = 2
EXIT_INTERNAL = 1
MAX_TOKEN_COUNT = 2**48
"""No size flag takes more: beyond it a value is a typo."""

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class CLIUsageError(PrefixKVError):
    """A command-line argument is missing, malformed or out of range."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise CLIUsageError(f"{message} (see {self.prog} --help)")


class CommandParser(Parser):
    """A subcommand's parser: its ``module`` (full name) is imported, and its
    ``add_arguments(parser)`` adds the flags, the first time it parses."""

    def __init__(self, *args: Any, module: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.module = module
        self._has_flags = False

    def add_flags(self) -> CommandParser:
        """Import the subcommand's module and add its flags (once); returns ``self``."""
        if not self._has_flags:
            self._has_flags = True
            importlib.import_module(self.module).add_arguments(self)
        return self

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self.add_flags()
        return super().parse_known_args(args, namespace)


def parse_token_count(text: str) -> int:
    """A token count as vLLM's size flags read it (``1000``, ``25.6k``, ``1K``, ``2m``,
    ``1M``, ``_`` separators); else :class:`argparse.ArgumentTypeError`."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", text.strip().replace("_", ""))
    if m is None:
        raise argparse.ArgumentTypeError(
            f"want a positive token count like 65536, 512K or 1m, got {text!r}"
        )
    number, suffix = m.groups()
    if suffix in _BINARY and "." in number:
        raise argparse.ArgumentTypeError(
            f"decimals are not allowed with binary suffixes like {suffix} "
            f"(did you mean {number}{suffix.lower()}?), got {text!r}"
        )
    if not suffix and "." in number:
        raise argparse.ArgumentTypeError(f"a token count is whole, got {text!r}")
    if suffix in _DECIMAL:
        count = int(float(number) * _DECIMAL[suffix])
    else:
        count = int(number) * _BINARY.get(suffix, 1)
    if not 1 <= count <= MAX_TOKEN_COUNT:
        raise argparse.ArgumentTypeError(
            f"want a token count from 1 to 2**48, got {text!r} = {count:,}"
        )
    return count


def token_count_text(count: int) -> str:
    """``2097152`` -> ``"2M = 2,097,152"`` (in full alone when no binary unit divides it)."""
    for suffix, size in reversed(_BINARY.items()):
        if count >= size and count % size == 0:
            return f"{count // size}{suffix} = {count:,}"
    return f"{count:,}"


def distinct(values: list[T], text: str, want: str, *, ok: bool = True) -> list[T]:
    """``values``, read from the comma list ``text``; when empty, with a duplicate or not
    ``ok``, :class:`argparse.ArgumentTypeError` "want ``want``, got ``text``"."""
    if not ok or not values or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"want {want}, got {text!r}")
    return values


def parse_token_counts(text: str) -> list[int]:
    """Distinct token counts, comma-separated (``1M,3M,10M``)."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"want one or more token counts, got {text!r}")
    counts = [parse_token_count(p) for p in parts]
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"a capacity is listed twice in {text!r}")
    return counts


def parse_capacity_tokens(text: str) -> list[int] | str:
    """``auto``, or token counts as :func:`parse_token_counts` reads them."""
    return "auto" if text.strip().lower() == "auto" else parse_token_counts(text)


def gib_list(text: str) -> list[float]:
    """Distinct sizes in GiB, comma-separated (``12.5,40``)."""
    values = [positive_float(p) for p in text.split(",") if p.strip()]
    return distinct(values, text, "distinct sizes in GiB like 12.5,40")


def request_rates(text: str) -> list[float] | str:
    """``auto``, or distinct rates > 0, comma-separated."""
    if text.strip().lower() == "auto":
        return "auto"
    rates = [positive_float(p.strip()) for p in text.split(",") if p.strip()]
    return distinct(rates, text, "distinct request rates > 0 like 1,2,4,8, or auto")


def milliseconds(text: str) -> float:
    """``500`` or ``500ms`` (as vllm bench serve --goodput) or ``0.5s``, in seconds."""
    value = text.strip().lower()
    if value.endswith("ms"):
        return positive_float(value[:-2]) * 1e-3
    if value.endswith("s"):
        return positive_float(value[:-1])
    return positive_float(value) * 1e-3


def utilization(text: str) -> float:
    """A share in (0, 1], as vLLM's ``--gpu-memory-utilization``."""
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


N = TypeVar("N", int, float)


def number_arg(
    text: str, cast: Callable[[str], N], want: str, bound: str, ok: Callable[[N], bool]
) -> N:
    """``text`` read by ``cast``, refused as not ``want`` when unreadable and as not
    ``bound`` when ``ok`` says no."""
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    bound = "a positive int up to 2**48"
    return number_arg(text, int, "a positive int", bound, lambda v: 1 <= v <= MAX_TOKEN_COUNT)


def positive_float(text: str) -> float:
    return number_arg(
        text, float, "a number > 0", "a finite number > 0", lambda v: v > 0 and math.isfinite(v)
    )


def int_arg(text: str) -> int:
    return number_arg(text, int, "an int", "an int within 2**63", lambda v: abs(v) <= 2**63)


def index_option(text: str) -> tuple[str, str, Any]:
    """``BACKEND.KEY=VALUE`` -> ``(backend, key, value)``; true/false/ints are typed."""
    m = re.fullmatch(r"([A-Za-z0-9_]+)\.([A-Za-z_][A-Za-z0-9_]*)=(.*)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"want BACKEND.KEY=VALUE (e.g. hash_chain.verify=true), got {text!r}"
        )
    backend, key, raw = m.groups()
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    elif re.fullmatch(r"-?\d{1,18}", raw):
        value = int(raw)
    return backend, key, value
