"""What a run records as a whole: its labels, then the parts it filled (:data:`RUN_PARTS`),
so one writer serves every runs table. A column two parts both name keeps the first
one's place and the later one's value.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol, TypeVar

from .load import LoadSummary, Slo
from .metrics import RequestRow, RunMetrics, request_table

__all__ = [
    "RUN_PARTS",
    "FleetSummary",
    "IndexTimes",
    "KLiveHits",
    "RunChecks",
    "RunPart",
    "RunRow",
    "SweepHit",
    "run_table",
]


class RunPart(Protocol):
    """A part of a run's row: its columns, flat."""

    def as_row(self) -> Mapping[str, Any]:
        """The part's columns, in its fields' order."""
        ...


P = TypeVar("P", bound=RunPart)


@dataclass(frozen=True, slots=True)
class KLiveHits:
    """A K-live replay's cache accounting (SPEC BB-8 columns when measured), what its
    index evicted, the most it held and its structures' size at that peak."""

    num_requests: int
    prompt_tokens: int
    hit_tokens: int
    hit_ratio: float
    boundary_accounting: bool
    matched_tokens: int
    boundary_lost_tokens: int
    cap_lost_tokens: int
    evicted_blocks: int
    evicted_tokens: int
    peak_cached_blocks: int
    peak_cached_tokens: int
    index_memory_bytes: int

    def as_row(self) -> dict[str, Any]:
        """Every field, flat."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class IndexTimes:
    """A K-live replay's index times (wall clock, the least over the timed replays); its
    two collections become ``wall_seconds_timed_min`` and ``index_seconds_<call>``."""

    index_us_p50: float
    index_us_p99: float
    index_us_mean: float
    admit_us_p50: float
    admit_us_p99: float
    timing_repeats: int
    timing_runs_agree: bool
    wall_seconds_tracked: float
    wall_seconds_timed: tuple[float, ...]
    seconds_by_call: Mapping[str, float]

    def as_row(self) -> dict[str, Any]:
        """The fields, the two collections folded."""
        row: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)[:-2]}
        row["wall_seconds_timed_min"] = min(self.wall_seconds_timed, default=math.nan)
        for call, seconds in sorted(self.seconds_by_call.items()):
            row[f"index_seconds_{call}"] = seconds
        return row


@dataclass(frozen=True, slots=True)
class SweepHit:
    """One point of the K-live capacity sweep (``None``s: the requests do not fit)."""

    hit_ratio: float | None
    evicted_blocks: int | None

    def as_row(self) -> dict[str, Any]:
        """``fits``, then the fields."""
        return {"fits": self.hit_ratio is not None, **asdict(self)}


@dataclass(frozen=True, slots=True)
class FleetSummary:
    """A cluster run's summary (every field a column): the fleet's requests folded as
    one replica's, the load figures as :func:`~.load.summarize_load` gives them, the
    load balance, the router's times and promises, reroutes and swept reservations."""

    num_requests: int
    num_replicas: int
    hit_ratio: float
    prompt_tokens: int
    hit_tokens: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    e2e_p50_s: float
    e2e_p99_s: float
    load_cv: float
    load_max_over_mean: float
    requests_cv: float
    prompt_tokens_cv: float
    decision_p50_us: float
    decision_p99_us: float
    decision_cpu_p99_us: float
    hash_p50_us: float
    hash_p99_us: float
    overlap_predictions: int
    overlap_mae_tokens: float
    phantom_rate: float
    missed_rate: float
    rerouted_requests: int
    swept_reservations: int
    prefill_gpu_s: float
    makespan_s: float
    offered_load: float
    ttft_growth: float
    offered_rate: float = math.nan
    achieved_rate: float = math.nan
    waiting_growth: float = math.nan
    overloaded: bool = False
    sent_rate: float = math.nan
    closed_loop: bool = False
    slo: str = ""
    good_requests: int | None = None
    goodput: float | None = None

    def load(self) -> LoadSummary:
        """The run's load figures as a :class:`~.load.LoadSummary`."""
        return LoadSummary(**{f.name: getattr(self, f.name) for f in fields(LoadSummary)})

    def as_row(self) -> dict[str, Any]:
        """Every field, flat."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class RunChecks:
    """What a cluster run checked and counted (numeric ``stats`` as ``stat_<name>``)."""

    invariants_hold: bool
    phantom_blocks: int
    stats: Mapping[str, Any]

    def as_row(self) -> dict[str, Any]:
        """The two checks, then each numeric counter."""
        return {
            "invariants_hold": self.invariants_hold,
            "phantom_blocks": self.phantom_blocks,
            **{f"stat_{k}": v for k, v in self.stats.items() if isinstance(v, (int, float))},
        }


RUN_PARTS: tuple[type[RunPart], ...] = (
    KLiveHits, IndexTimes, SweepHit, RunMetrics, LoadSummary, FleetSummary, RunChecks,
)  # fmt: skip
"""The parts of a run's row, in the order its columns are written."""


@dataclass(frozen=True, slots=True)
class RunRow:
    """A run: its labels, its parts (kept in :data:`RUN_PARTS`' order), its request
    records and the SLO they are judged by.

    Raises:
        TypeError: a part not of :data:`RUN_PARTS`, or one kind given twice.
    """

    labels: Mapping[str, Any]
    parts: tuple[RunPart, ...]
    requests: list[RequestRow] = field(default_factory=list, repr=False)
    slo: Slo | None = None

    def __post_init__(self) -> None:
        kinds = [type(p) for p in self.parts]
        if len(set(kinds)) != len(kinds) or any(k not in RUN_PARTS for k in kinds):
            raise TypeError(f"a run's parts are at most one each of {RUN_PARTS}, got {kinds}")
        ordered = tuple(sorted(self.parts, key=lambda p: RUN_PARTS.index(type(p))))
        object.__setattr__(self, "parts", ordered)

    def part(self, kind: type[P]) -> P:
        """The part of type ``kind`` (``KeyError``: not filled)."""
        for p in self.parts:
            if type(p) is kind:
                return p
        raise KeyError(f"{self.labels.get('backend', 'the run')} has no {kind.__name__}")

    def as_row(self) -> dict[str, Any]:
        """The labels, then each filled part's columns, in :data:`RUN_PARTS`' order."""
        row = dict(self.labels)
        for p in self.parts:
            row.update(p.as_row())
        return row

    def request_rows(self) -> list[dict[str, Any]]:
        """One flat record per request, with ``meets_slo`` under an objective."""
        rows = request_table(self.labels, self.requests)
        if self.slo is not None:
            for row, r in zip(rows, self.requests, strict=True):
                row["meets_slo"] = self.slo.met(r)
        return rows


def run_table(runs: Iterable[RunRow]) -> list[dict[str, Any]]:
    """The runs table: one row per run; a column missing from a run is empty."""
    return [r.as_row() for r in runs]
