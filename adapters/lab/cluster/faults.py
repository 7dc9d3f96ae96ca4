"""Faults a cluster run injects, and the lossy channel between replicas and the router.

``--faults`` is a comma list (the lab's README has the table) of stream faults
(``drop=P``, ``delay=S`` ...), scheduled ones (``kill=R@T``, ``router_restart@T:dump`` ...)
and ``mismatch=R:block_size|hash``; times are seconds or ``P%`` of the arrival span.
"""

from __future__ import annotations

import heapq
import itertools
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from prefixkv.adapters.router.errors import ClusterError
from prefixkv.adapters.router.stream_tracker import SeqBatch

from .config import MAX_REPLICAS

__all__ = ["EventChannel", "FaultPlan", "FaultSpecError", "ScheduledFault", "parse_faults"]

SCHEDULED_FAULTS = (
    "kill",
    "restart",
    "clear",
    "gap",
    "scale_up",
    "scale_down",
    "router_restart",
    "late_join",
)
MAX_FAULT_SECONDS = 1e9

_RATES = ("drop", "drop_removals", "lose_completions")
_SECONDS = ("delay", "jitter")
_WARMUPS = ("replay", "dump")
_MISMATCHES = ("block_size", "hash")
_DECIMAL = re.compile(  # what float() takes, less nan, inf, signs and _
    r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
)


class FaultSpecError(ClusterError):
    """A ``--faults`` entry cannot be parsed or names a replica that does not exist."""


class ScheduledFault(NamedTuple):
    """A fault at a time: ``at`` seconds, or a fraction of the arrival span (``relative``);
    ``replica`` ``None`` for router faults and scale up; ``mode`` a router's warm-up."""

    kind: str
    at: float
    replica: int | None = None
    mode: str = "replay"
    relative: bool = False


@dataclass(frozen=True)
class FaultPlan:
    """Every fault of one run (the default: none): rates, seconds, the scheduled faults,
    the mismatched replicas and the spec as given (``text``)."""

    drop: float = 0.0
    drop_removals: float = 0.0
    delay: float = 0.0
    jitter: float = 0.0
    lose_completions: float = 0.0
    scheduled: tuple[ScheduledFault, ...] = ()
    mismatch: dict[int, str] = field(default_factory=dict)
    text: str = ""

    def __post_init__(self) -> None:
        for name in (*_RATES, *_SECONDS):
            _check_number(getattr(self, name), name, rate=name in _RATES)
        if not isinstance(self.scheduled, tuple):
            raise FaultSpecError(
                f"scheduled must be a tuple of ScheduledFault, got {self.scheduled!r:.80}"
            )
        for f in self.scheduled:
            _check_scheduled(f)
        if not isinstance(self.mismatch, dict):
            raise FaultSpecError(f"mismatch must be a dict, got {self.mismatch!r:.80}")
        for r, kind in self.mismatch.items():
            if not _is_replica(r) or kind not in _MISMATCHES:
                raise FaultSpecError(
                    f"mismatch maps a replica (an int in [0, {MAX_REPLICAS - 1}]) to block_size "
                    f"or hash, got {r!r:.40}: {kind!r:.40}"
                )

    @property
    def any(self) -> bool:
        """Whether anything is injected."""
        numbers = (getattr(self, name) for name in (*_RATES, *_SECONDS))
        return any(numbers) or bool(self.scheduled or self.mismatch)

    @property
    def needs_relative(self) -> bool:
        """Whether some time is a fraction of the arrival span."""
        return any(f.relative for f in self.scheduled)

    def resolve(self, span_s: float) -> FaultPlan:
        """The plan with fractional times turned into seconds of a ``span_s`` run."""
        scheduled = tuple(
            f._replace(at=f.at * span_s, relative=False) if f.relative else f
            for f in self.scheduled
        )
        return replace(self, scheduled=tuple(sorted(scheduled, key=lambda f: f.at)))

    def check(self, num_replicas: int) -> None:
        """Raise :class:`FaultSpecError` for a replica out of ``0 .. num_replicas - 1``."""
        named = [(f"fault {f.kind}", f.replica) for f in self.scheduled if f.replica is not None]
        for who, r in named + [("mismatch", r) for r in self.mismatch]:
            if not 0 <= r < num_replicas:
                raise FaultSpecError(f"{who} names replica {r}; replicas are 0..{num_replicas - 1}")


def _is_replica(value: object) -> bool:
    return type(value) is int and 0 <= value < MAX_REPLICAS


def _what(rate: bool) -> str:
    return "a rate in [0, 1]" if rate else f"seconds in [0, {MAX_FAULT_SECONDS:g}]"


def _check_number(value: object, where: str, *, rate: bool) -> float:
    top = 1.0 if rate else MAX_FAULT_SECONDS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
        raise FaultSpecError(f"{where}: must be {_what(rate)}, got {value!r:.60}")  # NaN too
    return float(value)


def _check_scheduled(f: object) -> None:
    if not isinstance(f, ScheduledFault):
        raise FaultSpecError(f"a scheduled fault must be a ScheduledFault, got {f!r:.80}")
    where = f"{f.kind}@{f.at!r:.40}"
    if f.kind not in SCHEDULED_FAULTS:
        raise FaultSpecError(
            f"unknown scheduled fault {f.kind!r}; known: {', '.join(SCHEDULED_FAULTS)}"
        )
    if type(f.relative) is not bool:
        raise FaultSpecError(f"{where}: relative must be a bool, got {f.relative!r}")
    _check_number(f.at, where, rate=f.relative)  # a fraction of the span, or seconds
    if f.replica is not None and not _is_replica(f.replica):
        raise FaultSpecError(
            f"{where}: replica must be None or an int in [0, {MAX_REPLICAS - 1}], "
            f"got {f.replica!r:.40}"
        )
    if f.mode not in _WARMUPS:
        raise FaultSpecError(f"{where}: warm-up {f.mode!r} is not replay or dump")


def _time(text: str, where: str) -> tuple[float, bool]:
    relative = text.endswith("%")
    number = text[:-1] if relative else text
    if not _DECIMAL.fullmatch(number):
        raise FaultSpecError(f"{where}: time {text!r:.40} is not seconds or a percentage")
    value = float(number)  # 1e400 is inf: refused below
    top = 100.0 if relative else MAX_FAULT_SECONDS
    if not 0 <= value <= top:
        unit = "a percentage in [0, 100]" if relative else f"seconds in [0, {top:g}]"
        raise FaultSpecError(f"{where}: time {text!r} is not {unit}")
    return (value / 100, True) if relative else (value, False)


def _replica(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) >= MAX_REPLICAS:
        raise FaultSpecError(
            f"{where}: replica {text!r:.40} is not an int in [0, {MAX_REPLICAS - 1}]"
        )
    return int(text)


def parse_faults(text: str) -> FaultPlan:
    """Parse ``--faults`` (see the module docstring).

    Raises:
        FaultSpecError: an unknown, malformed, out-of-range or repeated entry.
    """
    values: dict[str, Any] = {}  # the rates and seconds given (the others stay 0)
    scheduled: list[ScheduledFault] = []
    mismatch: dict[int, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, arg = entry.partition("=")
        if "@" in name:  # scale_up@T, router_restart@T[:mode]
            name, _, at_text = name.partition("@")
            arg, sep = f"@{at_text}", "="
        if name in values or (
            name == "mismatch" and arg.partition(":")[0] in {str(r) for r in mismatch}
        ):
            raise FaultSpecError(f"{entry}: given twice in --faults {text!r:.80}")
        if name in _RATES or name in _SECONDS:
            rate = name in _RATES
            if not sep and name == "drop_removals":
                values[name] = 1.0
            elif not _DECIMAL.fullmatch(arg):
                raise FaultSpecError(f"{entry}: {arg!r:.40} is not a number; give {_what(rate)}")
            else:
                values[name] = _check_number(float(arg), entry, rate=rate)
        elif name == "mismatch":
            who, _, kind = arg.partition(":")
            if kind not in _MISMATCHES:
                raise FaultSpecError(f"{entry}: mismatch is R:block_size or R:hash")
            mismatch[_replica(who, entry)] = kind
        elif name in SCHEDULED_FAULTS:
            who, _, when = arg.partition("@")
            when, _, mode = when.partition(":")
            if mode and mode not in _WARMUPS:
                raise FaultSpecError(f"{entry}: warm-up {mode!r} is not replay or dump")
            if not when:
                raise FaultSpecError(f"{entry}: give a time, e.g. {name}=1@50% or {name}@120")
            at, relative = _time(when, entry)
            needs_replica = name not in ("scale_up", "router_restart", "late_join")
            if needs_replica != bool(who):
                raise FaultSpecError(
                    f"{entry}: {name} {'needs' if needs_replica else 'takes no'} replica"
                )
            replica = _replica(who, entry) if who else None
            scheduled.append(ScheduledFault(name, at, replica, mode or "replay", relative))
        else:
            known = ", ".join((*_RATES, *_SECONDS, "mismatch", *SCHEDULED_FAULTS))
            raise FaultSpecError(f"unknown fault {name!r} in {entry!r}; known: {known}")
    ordered = tuple(sorted(scheduled, key=lambda f: f.at))
    return FaultPlan(**values, scheduled=ordered, mismatch=mismatch, text=text)


class EventChannel:
    """Batches in flight from replicas to the router, lost, delayed or reordered."""

    def __init__(self, plan: FaultPlan, seed: int) -> None:
        self.plan = plan
        self._rng = random.Random(seed)
        self._heap: list[tuple[float, int, int, SeqBatch]] = []
        self._order = itertools.count()
        self._blackout: dict[int, int] = {}  # replica -> batches still to lose
        self.num_dropped = 0

    @property
    def pending(self) -> int:
        """Batches in flight."""
        return len(self._heap)

    def blackout(self, replica: int, batches: int) -> None:
        """Lose ``replica``'s next ``batches`` batches (the ``gap`` fault)."""
        self._blackout[replica] = batches

    def send(self, replica: int, batch: SeqBatch) -> None:
        """A replica published ``batch``."""
        plan = self.plan
        left = self._blackout.get(replica, 0)
        if left:
            self._blackout[replica] = left - 1
            self.num_dropped += 1
            return
        if plan.drop and self._rng.random() < plan.drop:
            self.num_dropped += 1
            return
        at = batch.ts + plan.delay + (self._rng.uniform(0, plan.jitter) if plan.jitter else 0.0)
        heapq.heappush(self._heap, (at, next(self._order), replica, batch))

    def due(self, until: float) -> list[tuple[float, int, SeqBatch]]:
        """``(time, replica, batch)`` arriving by ``until``, in arrival order."""
        out = []
        while self._heap and self._heap[0][0] <= until:
            at, _, replica, batch = heapq.heappop(self._heap)
            out.append((at, replica, batch))
        return out

    def discard(self, replica: int, after: float) -> None:
        """Drop ``replica``'s batches published after ``after`` (it died before)."""
        self._heap = [e for e in self._heap if not (e[2] == replica and e[3].ts > after)]
        heapq.heapify(self._heap)
