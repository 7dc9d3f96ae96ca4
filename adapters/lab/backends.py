"""The backends a lab run replays: their specs, how a list of them is parsed
(``"hash_chain,radix:16,none"``), the capacities that fit them, the errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefixkv.indexes.base import PrefixIndex
from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.registry import describe_index, make_index, pool_owned_options

from .progress import Progress
from .replay import DRIVERS, Driver
from .sim.config import DEFAULT_BLOCK_SIZE

if TYPE_CHECKING:
    from .traces import TraceStats

__all__ = [
    "MAX_POOL_BLOCKS",
    "BackendSpec",
    "Bars",
    "CapacityError",
    "CompareError",
    "Scalar",
    "check_pool",
    "check_positive",
    "min_capacity",
    "over_pool_limit",
    "parse_backends",
    "roomy_capacity",
]

Scalar = str | int | float | bool | None
"""A table cell: rows hold only these, so every format has one column per field."""

_NATURAL_DRIVERS: dict[str | None, Driver] = {"vllm": "vllm", "sglang": "sglang"}  # else manager

MAX_POOL_BLOCKS = 2**24
"""Default bound on one replay's pool in blocks; larger is refused up front."""

Bars = Callable[[str, int], Progress]
"""Makes one progress bar: ``bars(description, total prompt tokens)``."""


class CompareError(PrefixKVError):
    """A comparison option is invalid (backend spec, workload name, capacity)."""


class CapacityError(CompareError):
    """The KV capacity asked for cannot hold the requests even after evicting."""


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """One backend of a comparison: its label in tables (``radix:16``), registry name,
    hit granularity in tokens, replay driver and ``make_index`` options."""

    label: str
    index: str
    block_size: int
    driver: Driver
    options: tuple[tuple[str, Any], ...] = ()

    def make(self) -> PrefixIndex:
        """A fresh index for one replay."""
        opts = {**pool_owned_options(self.index), **dict(self.options)}
        return make_index(self.index, self.block_size, **opts)

    def num_blocks(self, capacity_tokens: int) -> int:
        """Blocks of ``block_size`` that fit in ``capacity_tokens``."""
        return capacity_tokens // self.block_size

    def run_labels(
        self, workload: str, schedule: str, role: str, capacity_tokens: int, *, options: bool = True
    ) -> dict[str, Scalar]:
        """The leading columns of a run's row (a K-live sweep point's leave ``options`` out)."""
        num_blocks = self.num_blocks(capacity_tokens)
        return {
            "workload": workload,
            "schedule": schedule,
            "role": role,
            "backend": self.label,
            "index": self.index,
            "block_size": self.block_size,
            **({"options": ",".join(f"{k}={v}" for k, v in self.options)} if options else {}),
            "capacity_tokens": capacity_tokens,
            "num_blocks": num_blocks,
            "pool_tokens": num_blocks * self.block_size,
        }

    def describe(self) -> str:
        """``"hash_chain (vllm driver, 16-token blocks)"``."""
        unit = describe_index(self.index).unit
        plural = "" if self.block_size == 1 else "s"
        opts = "".join(f", {k}={v}" for k, v in self.options)
        return f"{self.label} ({self.driver} driver, {self.block_size}-token {unit}{plural}{opts})"


def check_positive(name: str, value: object) -> int:
    """``value``, refused (:class:`CompareError`) unless it is a positive int."""
    if type(value) is not int or value < 1:
        raise CompareError(f"{name} must be a positive int, got {value!r:.60}")
    return value


def parse_backends(
    text: str,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    page_size: int = 1,
    driver: Driver | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[BackendSpec]:
    """Parse ``"hash_chain,radix,none"``; ``NAME:SIZE`` sets one backend's granularity,
    else ``block_size`` (a block's unit) or ``page_size`` (a page's). ``driver`` forces
    one driver on all; ``options`` are ``make_index``'s, by registry name.

    Raises:
        CompareError: an empty list, a bad size, a repeated backend or driver, an
            option a backend does not take or a bad option value.
        UnknownIndexError: a name nobody registered (the message lists the names).
    """
    check_positive("block size", block_size)
    check_positive("page size", page_size)
    if driver is not None and driver not in DRIVERS:
        raise CompareError(f"unknown driver {driver!r}; known: {', '.join(DRIVERS)}")
    opts = options or {}
    specs: list[BackendSpec] = []
    for label in filter(None, (part.strip() for part in text.split(","))):
        name, _, size_text = label.partition(":")
        if not size_text:
            size = page_size if describe_index(name).unit == "page" else block_size
        elif not size_text.isdigit() or int(size_text) < 1:
            raise CompareError(f"bad size in backend {label!r}: want NAME:POSITIVE_INT")
        else:
            size = int(size_text)
        if any(s.label == label for s in specs):
            raise CompareError(f"backend {label!r} is listed twice")
        chosen = tuple(sorted(opts.get(name, {}).items()))
        natural = driver or _NATURAL_DRIVERS.get(describe_index(name).models, "manager")
        spec = BackendSpec(label, name, size, natural, chosen)
        try:  # an unknown option fails here, before anything runs
            spec.make()
        except ValueError as exc:
            if isinstance(exc, PrefixKVError):
                raise
            raise CompareError(f"backend {label!r}: bad option in {dict(chosen)}: {exc}") from None
        specs.append(spec)
    if not specs:
        raise CompareError(f"no backend named in {text!r}")
    unused = set(opts) - {s.index for s in specs}
    if unused:
        raise CompareError(f"options given for backends not compared: {sorted(unused)}")
    return specs


def _spare(backends: Sequence[BackendSpec]) -> int:
    # a spare block each end of a request: a partial last block, SGLang's page over-estimate
    return 2 * max(b.block_size for b in backends)


def roomy_capacity(stats: TraceStats, backends: Sequence[BackendSpec]) -> int:
    """Tokens that hold every request's KV at once: no backend ever evicts."""
    return stats.prompt_tokens + stats.output_tokens + _spare(backends) * stats.num_requests


def min_capacity(stats: TraceStats, backends: Sequence[BackendSpec], concurrency: int) -> int:
    """Tokens for the ``concurrency`` largest requests live at once: the tight end."""
    largest = stats.largest[:concurrency]
    return sum(largest) + _spare(backends) * len(largest)


def check_pool(
    capacity_tokens: int, backends: Sequence[BackendSpec], max_pool_blocks: int = MAX_POOL_BLOCKS
) -> None:
    """Refuse (:class:`CapacityError`) a capacity that holds no block, or more blocks
    than ``max_pool_blocks``."""
    for b in backends:
        if b.num_blocks(capacity_tokens) < 1:
            raise CapacityError(
                f"capacity {capacity_tokens:,} tokens holds no {b.block_size}-token block "
                f"of {b.label}"
            )
        over = over_pool_limit(capacity_tokens, b.block_size, max_pool_blocks, f"for {b.label}")
        if over:
            raise CapacityError(over)


def over_pool_limit(capacity_tokens: int, block_size: int, max_pool_blocks: int, whose: str) -> str:
    """Why a pool of ``capacity_tokens`` is refused (``whose``: ``"for radix"``, ``"a
    replica"``), or ``""`` within ``max_pool_blocks``."""
    blocks = capacity_tokens // block_size
    if blocks <= max_pool_blocks:
        return ""
    return (
        f"capacity {capacity_tokens:,} tokens is {blocks:,} blocks of {block_size} tokens "
        f"{whose}, over the limit of {max_pool_blocks:,} blocks a pool (--max-pool-blocks); "
        "give a smaller --capacity-tokens"
    )
