"""A comparison from Python: :class:`CompareOptions` (plain values, as a notebook writes
them, resolved when the comparison runs) and :func:`compare_backends`, which runs it and
returns the tidy tables (see the lab's README)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..admission import AdmissionRule, admit, length_rule
from ..backends import MAX_POOL_BLOCKS, CompareError, parse_backends
from ..progress import progress
from ..sim import ArrivalProcess, Batching, CostProfile, QueueOrder, load_profile
from ..sim.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from ..sim.errors import SimSettingsError
from ..sim.load import Slo
from ..traces import ReadSettings
from ..workloads import Workload, load_workloads
from .plan import CompareSettings, Scheduler, TimeSettings, plan_comparison
from .run import ComparisonTables, run_comparison

__all__ = ["CompareOptions", "compare_backends"]


@dataclass(frozen=True)
class CompareOptions:
    """What to compare, as plain values (resolved when the comparison runs).

    A field means what the ``prefixkv compare`` flag of its name does (``indexes`` is
    ``--index``, ``capacity_tokens`` one or several capacities, ``rate_sweep`` the rates after
    ``--request-rate``'s first, ``schedulers`` ``--scheduler``, ``slo`` the ``--slo-*`` flags,
    ``on_long_request`` ``"reject"`` or ``"abort"``); arrival-time runs need
    ``request_rate``, ``time_scale`` or ``rate_sweep="auto"``.

    Attributes:
        workloads: built-in workload names (default: the CLI's default set without a trace).
        index_options: per registry name, options for ``make_index``.
        capacity_sweep: also sweep capacities (default: when several are given, or for the
            default set).
        capacity_search: find each backend's working set and knee (default: on for built-in
            workloads, off for a trace).
        boundary_accounting: BB-8 accounting (default: off for hash-id traces).
        queue_order: force ``"fcfs"`` or ``"lpm"`` (default: each engine's own).
        closed_loop: sessions replay closed loop (default); ``False``: open loop.
        profile: a cost profile, a shipped profile's name or a profile file.
        progress_bars: show progress bars on stderr.
    """

    workloads: Sequence[str] | None = None
    trace: str | os.PathLike[str] | None = None
    indexes: str = "hash_chain,radix,none"
    block_size: int = DEFAULT_BLOCK_SIZE
    page_size: int = 1
    index_options: Mapping[str, Mapping[str, Any]] | None = None
    capacity_tokens: int | Sequence[int] | None = None
    capacity_sweep: bool | None = None
    capacity_search: bool | None = None
    max_pool_blocks: int = MAX_POOL_BLOCKS
    concurrency: int = 1
    timing_repeats: int = 1
    boundary_accounting: bool | None = None
    request_rate: float | None = None
    rate_sweep: Sequence[float] | str | None = None
    slo: Slo | None = None
    time_scale: float | None = None
    arrival: ArrivalProcess = "poisson"
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    queue_order: QueueOrder | None = None
    batching: Batching | None = None
    schedulers: Sequence[Scheduler] = ("vllm",)
    closed_loop: bool = True
    profile: str | os.PathLike[str] | CostProfile | None = None
    max_requests: int | None = None
    tokens_per_id: int | None = None
    max_model_len: int | None = None
    on_long_request: Literal["reject", "abort"] = "reject"
    seed: int = 0
    progress_bars: bool = False

    def time_settings(self) -> TimeSettings | None:
        """The arrival-time settings, or ``None`` without a rate or a scale.

        Raises:
            SimSettingsError: a value out of range.
            ProfileError: a profile that cannot be read.
        """
        sweep = self.rate_sweep
        auto = sweep == "auto"
        if isinstance(sweep, str) and not auto:
            raise SimSettingsError(f"rate_sweep is rates or 'auto', got {sweep!r}")
        if self.request_rate is None and self.time_scale is None and not auto:
            return None
        return TimeSettings(
            **{name: getattr(self, name) for name in _TIME_FIELDS},
            profile=self._profile() or load_profile(),
            schedulers=tuple(self.schedulers),
            rates=() if sweep is None or isinstance(sweep, str) else tuple(sweep),
            auto_rates=auto,
        )

    def _profile(self) -> CostProfile | None:
        profile = self.profile
        if profile is None or isinstance(profile, CostProfile):
            return profile
        return load_profile(profile)

    def load_workloads(self) -> list[Workload]:
        """The workloads (or the trace), scanned for their sizes.

        Raises:
            PrefixKVError: an unknown workload, an unreadable trace (a named subclass).
        """
        return load_workloads(
            list(self.workloads) if self.workloads else None,
            None if self.trace is None else os.fspath(self.trace),
            max_requests=self.max_requests,
            tokens_per_id=self.tokens_per_id,
            seed=self.seed,
            settings=ReadSettings(seed=self.seed),
            quiet=not self.progress_bars,
        )

    def settings(self, workloads: Sequence[Workload]) -> CompareSettings:
        """The resolved settings for ``workloads`` (backends parsed and checked).

        Raises:
            CompareError: a bad backend, option, capacity or count.
        """
        caps = self.capacity_tokens
        if caps is not None:
            caps = (caps,) if isinstance(caps, int) else tuple(caps)
        sweep = self.capacity_sweep
        if sweep is None:
            default_set = not self.workloads and self.trace is None
            sweep = (caps is not None and len(caps) > 1) or default_set
        time = self.time_settings()
        backends = parse_backends(
            self.indexes,
            block_size=self.block_size,
            page_size=self.page_size,
            options=self.index_options,
        )
        accounting, search = self.boundary_accounting, self.capacity_search
        return CompareSettings(
            tuple(backends),
            caps,
            sweep,
            self.concurrency,
            self.timing_repeats,
            all(w.tokens_per_id is None for w in workloads) if accounting is None else accounting,
            time,
            self.max_pool_blocks,
            self._profile() if time is None else time.profile,
            self.trace is None if search is None else search,
        )

    def admitted(self, workloads: Sequence[Workload], settings: CompareSettings) -> list[Workload]:
        """``workloads`` without the requests :meth:`length_rule` refuses, counted in each
        workload's ``rejected_requests``.

        Raises:
            CompareError: a bad ``max_model_len`` or ``on_long_request``.
            CapacityError: ``on_long_request="abort"`` and a request is too long, or every
                request is.
        """
        if self.on_long_request not in ("reject", "abort"):
            raise CompareError(
                f"on_long_request must be 'reject' or 'abort', got {self.on_long_request!r:.60}"
            )
        rule = self.length_rule(settings)
        if rule is None:
            return list(workloads)
        return [admit(w, rule, abort=self.on_long_request == "abort")[0] for w in workloads]

    def length_rule(self, settings: CompareSettings) -> AdmissionRule | None:
        """``max_model_len`` and the table's capacity alone, in the backends' coarsest
        block (``None``: no bound).

        Raises:
            CompareError: a bad ``max_model_len``.
        """
        return length_rule(
            self.max_model_len,
            settings.capacities[0] if settings.capacities else None,
            block_size=max(b.block_size for b in settings.backends),
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


_FIELDS = frozenset(f.name for f in dataclasses.fields(CompareOptions))
# The fields TimeSettings takes as they are; its profile and schedulers are resolved.
_TIME_FIELDS = _FIELDS & {f.name for f in dataclasses.fields(TimeSettings)}
_TIME_FIELDS -= {"profile", "schedulers"}


def compare_backends(options: CompareOptions | None = None, /, **changes: Any) -> ComparisonTables:
    """Compare backends as ``prefixkv compare`` does, ``options`` (default:
    ``CompareOptions()``) with the fields in ``changes`` changed; return the tidy tables.

    Raises:
        CompareError: a field :class:`CompareOptions` does not have.
        PrefixKVError: a bad option, workload, trace or capacity (a named subclass).
        KeyboardInterrupt: Ctrl-C.
    """
    unknown = sorted(set(changes) - _FIELDS)
    if unknown:
        raise CompareError(
            f"CompareOptions has no {', '.join(unknown)}; it has: {', '.join(sorted(_FIELDS))}"
        )
    options = dataclasses.replace(options or CompareOptions(), **changes)
    loaded = options.load_workloads()
    settings = options.settings(loaded)
    plans = plan_comparison(options.admitted(loaded, settings), settings)
    quiet = not options.progress_bars

    def bars(desc: str, total: int) -> Any:
        return progress(total, desc, quiet=quiet, unit="tok")

    comparison = run_comparison(plans, settings, bars=bars)
    if comparison.partial:
        raise KeyboardInterrupt("comparison interrupted")
    return comparison.tables()
