"""Faults a cluster run injects, and the lossy channel between replicas and router.

Stream faults act on every batch in flight (:class:`EventChannel`): ``drop=P`` loses a
batch with probability P (a full high-water mark), ``delay=S`` and ``jitter=S`` hold it
for S plus up to S seconds (later batches overtake earlier ones), ``gap=R@T`` loses
replica R's next ``buffer_steps + 1`` batches from T (more than replay can bridge).
``drop_removals=P`` makes replicas lose each ``BlockRemoved`` before it is published
(replay cannot bring it back: only a dump can); ``lose_completions=P`` loses a
request's completion on its way back to the router (the reservation stays open
until swept). Scheduled faults act on replicas and the router: ``kill=R@T``,
``restart=R@T`` (same replica, sequence back at 0, cache empty), ``clear=R@T``
(``AllBlocksCleared``), ``scale_up@T``, ``scale_down=R@T``, ``router_restart@T`` and
``late_join@T`` (warm-up ``:replay`` from sequence 0, the default, or ``:dump``), and
``mismatch=R:block_size`` or ``mismatch=R:hash`` configures replica R unlike the rest.
Times are seconds, or ``P%`` of the run's arrival span.

Every number is checked where it enters, by :func:`parse_faults` and by
:class:`FaultPlan` itself: rates are in ``[0, 1]``, seconds finite and at most
:data:`MAX_FAULT_SECONDS`, percentages in ``[0, 100]`` (NaN and infinity nowhere).
On the command line a number is ASCII digits with an optional point and exponent
(no sign, ``_``, ``nan`` or ``inf``), and a fault given twice is refused rather than
the last one silently kept.
"""

from __future__ import annotations

import heapq
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from prefixkv.adapters.router.stream_tracker import SeqBatch

from .config import MAX_REPLICAS
from .errors import FaultSpecError

__all__ = [
    "MAX_FAULT_SECONDS",
    "SCHEDULED_FAULTS",
    "EventChannel",
    "FaultPlan",
    "ScheduledFault",
    "parse_faults",
]

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
"""The latest fault time and the longest delay or jitter, in seconds (about 32 years):
beyond any run, and finite, so no fault is accepted that could never happen."""

_RATES = ("drop", "drop_removals", "lose_completions")
_SECONDS = ("delay", "jitter")
_WARMUPS = ("replay", "dump")


class ScheduledFault(NamedTuple):
    """A fault at a time.

    Attributes:
        kind: one of :data:`SCHEDULED_FAULTS`.
        at: seconds (after :meth:`FaultPlan.resolve`), or a fraction of the span.
        replica: the replica it hits (``None`` for router faults and scale up).
        mode: ``"replay"`` or ``"dump"`` for router warm-ups.
        relative: ``at`` is a fraction of the arrival span.
    """

    kind: str
    at: float
    replica: int | None = None
    mode: str = "replay"
    relative: bool = False


@dataclass(frozen=True)
class FaultPlan:
    """Every fault of one run (the default: none).

    Attributes:
        drop: probability each batch is lost in transit.
        drop_removals: probability each ``BlockRemoved`` is never published.
        delay: seconds every batch takes.
        jitter: up to this many more seconds, uniformly (reorders).
        lose_completions: probability a completion never reaches the router.
        scheduled: faults at given times.
        mismatch: replica -> ``"block_size"`` or ``"hash"``.
        text: the spec as given.
    """

    drop: float = 0.0
    drop_removals: float = 0.0
    delay: float = 0.0
    jitter: float = 0.0
    lose_completions: float = 0.0
    scheduled: tuple[ScheduledFault, ...] = ()
    mismatch: dict[int, str] = field(default_factory=dict)
    text: str = ""

    def __post_init__(self) -> None:
        for name in _RATES:
            _check_number(getattr(self, name), name, rate=True)
        for name in _SECONDS:
            _check_number(getattr(self, name), name, rate=False)
        if not isinstance(self.scheduled, tuple):
            raise FaultSpecError(
                f"scheduled must be a tuple of ScheduledFault, got {self.scheduled!r:.80}"
            )
        for f in self.scheduled:
            _check_scheduled(f)
        if not isinstance(self.mismatch, dict):
            raise FaultSpecError(f"mismatch must be a dict, got {self.mismatch!r:.80}")
        for r, kind in self.mismatch.items():
            if (
                type(r) is not int
                or not 0 <= r < MAX_REPLICAS
                or kind not in ("block_size", "hash")
            ):
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
        """Reject faults naming replicas that do not exist.

        Raises:
            FaultSpecError: a replica id out of ``0 .. num_replicas - 1``.
        """
        for f in self.scheduled:
            if f.replica is not None and not 0 <= f.replica < num_replicas:
                raise FaultSpecError(
                    f"fault {f.kind} names replica {f.replica}; replicas are 0..{num_replicas - 1}"
                )
        for r in self.mismatch:
            if not 0 <= r < num_replicas:
                raise FaultSpecError(
                    f"mismatch names replica {r}; replicas are 0..{num_replicas - 1}"
                )


def _check_number(value: object, where: str, *, rate: bool) -> float:
    """``value`` if it is a number in ``[0, 1]`` (a rate) or ``[0, MAX_FAULT_SECONDS]``."""
    top = 1.0 if rate else MAX_FAULT_SECONDS
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= top:
        what = "a rate in [0, 1]" if rate else f"seconds in [0, {MAX_FAULT_SECONDS:g}]"
        raise FaultSpecError(f"{where}: must be {what}, got {value!r:.60}")  # NaN: refused too
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
    if f.replica is not None and (type(f.replica) is not int or not 0 <= f.replica < MAX_REPLICAS):
        raise FaultSpecError(
            f"{where}: replica must be None or an int in [0, {MAX_REPLICAS - 1}], "
            f"got {f.replica!r:.40}"
        )
    if f.mode not in _WARMUPS:
        raise FaultSpecError(f"{where}: warm-up {f.mode!r} is not replay or dump")


_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
"""A number as ``--faults`` spells it. ``float`` alone would also take ``nan``,
``-inf``, ``1_000``, surrounding blanks and non-ASCII digits."""


def _time(text: str, where: str) -> tuple[float, bool]:
    relative = text.endswith("%")
    number = text[:-1] if relative else text
    if not _DECIMAL.fullmatch(number):
        raise FaultSpecError(f"{where}: time {text!r:.40} is not seconds or a percentage")
    value = float(number)  # 1e400 is inf: refused below
    top = 100.0 if relative else MAX_FAULT_SECONDS
    if not 0 <= value <= top:  # NaN and infinity too
        unit = "a percentage in [0, 100]" if relative else f"seconds in [0, {top:g}]"
        raise FaultSpecError(f"{where}: time {text!r} is not {unit}")
    return (value / 100, True) if relative else (value, False)


def _replica(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or int(text) >= MAX_REPLICAS:
        raise FaultSpecError(
            f"{where}: replica {text!r:.40} is not an int in [0, {MAX_REPLICAS - 1}]"
        )
    return int(text)


def _number(text: str, where: str, *, rate: bool) -> float:
    if not _DECIMAL.fullmatch(text):
        what = "a rate in [0, 1]" if rate else f"seconds in [0, {MAX_FAULT_SECONDS:g}]"
        raise FaultSpecError(f"{where}: {text!r:.40} is not a number; give {what}")
    return _check_number(float(text), where, rate=rate)


def parse_faults(text: str) -> FaultPlan:
    """Parse ``--faults``: comma-separated entries (see the module docstring).

    Raises:
        FaultSpecError: an unknown fault, a malformed entry or number, a number out of
            range, or a stream fault or mismatch given twice.
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
        if name in values or (name == "mismatch" and arg.partition(":")[0] in _names(mismatch)):
            raise FaultSpecError(f"{entry}: given twice in --faults {text!r:.80}")
        if name in _RATES or name in _SECONDS:
            values[name] = (
                1.0
                if not sep and name == "drop_removals"
                else _number(arg, entry, rate=name in _RATES)
            )
        elif name == "mismatch":
            who, _, kind = arg.partition(":")
            if kind not in ("block_size", "hash"):
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


def _names(mismatch: dict[int, str]) -> set[str]:
    return {str(r) for r in mismatch}


class EventChannel:
    """Batches in flight from replicas to the router, lost, delayed or reordered.

    Args:
        plan: the faults.
        seed: seeds the losses and delays.
    """

    def __init__(self, plan: FaultPlan, seed: int) -> None:
        self.plan = plan
        self._rng = random.Random(seed)
        self._heap: list[tuple[float, int, int, SeqBatch]] = []
        self._order = 0
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
        heapq.heappush(self._heap, (at, self._order, replica, batch))
        self._order += 1

    def due(self, until: float) -> list[tuple[float, int, SeqBatch]]:
        """``(time, replica, batch)`` arriving by ``until``, in arrival order."""
        out = []
        heap = self._heap
        while heap and heap[0][0] <= until:
            at, _, replica, batch = heapq.heappop(heap)
            out.append((at, replica, batch))
        return out

    def discard(self, replica: int, after: float) -> None:
        """Drop ``replica``'s batches published after ``after`` (it died before)."""
        self._heap = [e for e in self._heap if not (e[2] == replica and e[3].ts > after)]
        heapq.heapify(self._heap)
