"""``prefixkv cluster``: route a trace over N replicas with each policy; write a report.
Flags that would be ignored are refused, every value of a sweep is checked before the
first run, and a stopping signal writes the runs that finished, marked partial."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from prefixkv.adapters.outputs import check_output_folder
from prefixkv.adapters.router.errors import ClusterSettingsError
from prefixkv.adapters.router.policies import POLICIES
from prefixkv.adapters.router.routing import BOUNDS, PolicySpec, parse_policies

from ..admission import admit, length_rule
from ..backends import over_pool_limit
from ..cluster.config import DEFAULT_BUFFER_STEPS, MAX_REPLICAS, ClusterSettings
from ..cluster.experiment import (
    ClusterInterrupted,
    arrival_span,
    plan_experiment,
    run_experiment,
    run_rate_sweep,
)
from ..cluster.faults import FaultPlan, parse_faults
from ..cluster.fleet import Fleet
from ..cluster.metrics import ClusterResult
from ..extras import require_extra
from ..outputs.cluster import OUTPUT_NAMES, write_report
from ..sim.arrivals import sim_requests
from ..sim.config import (
    DEFAULT_BLOCK_SIZE,
    SimSettings,
)
from ..sim.model_config import ModelConfig
from ..sim.profile import CostProfile, load_profile
from ..sim.rate_sweep import rate_schedule, start_rate
from ..sim.requests import SimRequest
from ..traces import TraceRequest, open_trace, stats_of
from ..workloads import Workload, make_workload, trace_workload
from . import common, flags
from .args import (
    CLIUsageError,
    distinct,
    positive_float,
    positive_int,
)
from .signals import Interrupts

DEFAULT_POLICIES = ",".join((*POLICIES, *BOUNDS))
DEFAULT_CAPACITY = 3_000_000
"""Each replica's KV tokens when none is given: Mooncake's per-node local cache."""


def _replica_counts(text: str) -> list[int]:
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want positive ints like 1,2,4,8, got {text!r}") from None
    distinct(values, text, "distinct positive ints like 1,2,4,8", ok=all(v >= 1 for v in values))
    if max(values) > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_REPLICAS:,} replicas (each one a simulated engine), got {max(values):,}"
        )
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Give the ``cluster`` subcommand's parser its description and flags."""
    p.description = (
        "Simulate N engine replicas (each an arrival-time replica with its own "
        "prefix cache and the cost model) behind a KV-aware router fed by their KV events, "
        "once per routing policy, and write tables, plots and report.md. Deterministic "
        "in-process by default; --ray runs one Ray actor per replica."
    )
    src = p.add_mutually_exclusive_group()
    flags.add_trace(src)
    flags.add_workload(src, default="multi_turn")
    flags.add_trace_flags(p)
    _add_fleet_flags(p)
    _add_router_flags(p)
    flags.add_model_flags(p)


def _add_fleet_flags(p: argparse.ArgumentParser) -> None:
    f = p.add_argument_group("fleet")
    f.add_argument(
        "--replicas",
        type=_replica_counts,
        default=[8],
        metavar="N[,N...]",
        help="replicas; several sweep the fleet size (default 8)",
    )
    flags.add_capacity_tokens(
        f,
        per=", each replica's",
        sweep="every policy running at each on every fleet size",
        default="3m, Mooncake's per-node local cache",
    )
    flags.add_gpu_memory_utilization(f)
    flags.add_block_size(f, of="every replica's index and the router", given_only=True)
    flags.add_index(f, default="hash_chain", per_replica=True)
    flags.add_engine_limits(f)
    flags.add_profile(
        f,
        sizes="--capacity-tokens auto, and with --model-config or --gpu-memory capacities "
        "beyond it warn",
    )
    f.add_argument(
        "--buffer-steps",
        type=positive_int,
        default=DEFAULT_BUFFER_STEPS,
        metavar="N",
        help=f"event batches each replica keeps for replay (vLLM's {DEFAULT_BUFFER_STEPS})",
    )
    f.add_argument(
        "--prefill-only",
        action="store_true",
        help="one output token per request (Mooncake's prefill pool)",
    )
    flags.add_open_loop(f)


def _add_router_flags(p: argparse.ArgumentParser) -> None:
    """Arrivals, the routing policies, the faults and the runner."""
    arrivals = p.add_argument_group("arrivals")
    flags.add_rate_flags(
        arrivals,
        spacing="Poisson",
        sweep="run every fleet size, capacity and fault at the first and sweep every policy "
        "over the rest on the first fleet size and capacity",
        auto="the fleet has room and doubles until every policy is overloaded",
        default="2 for a built-in workload, a trace's own timestamps for a trace",
    )
    flags.add_slo_flags(arrivals)
    p.add_argument(
        "--load-per-replica",
        action="store_true",
        help="sweeping --replicas: keep each replica's load, arrivals N/first times as fast",
    )
    r = p.add_argument_group("router")
    r.add_argument(
        "--policies",
        default=DEFAULT_POLICIES,
        metavar="SPEC[,SPEC...]",
        help="routing policies, each name[@chained|radix|approx][:key=value...]; "
        "pooled and infinite are the bounds (default: %(default)s)",
    )
    r.add_argument(
        "--faults",
        metavar="SPEC[,SPEC...]",
        help="also run every policy with these faults, e.g. drop=0.05,kill=1@50%%,"
        "router_restart@60%%:dump (see the README)",
    )
    x = p.add_argument_group("runner")
    x.add_argument(
        "--ray",
        action="store_true",
        help="one Ray actor per replica (pip install 'prefixkv[cluster]')",
    )
    x.add_argument(
        "--ray-address", metavar="ADDR", help="join this Ray cluster (default: start a local one)"
    )
    x.add_argument(
        "--ray-cpus",
        type=positive_float,
        metavar="C",
        help="CPUs each replica actor asks for; refused when the actors do not "
        "fit the cluster's free CPUs (default 1, lowered to fit)",
    )
    flags.add_seed(
        x,
        seeds="the built-in workload, hash-id traces' tokens, Poisson arrivals, the router "
        "and the faults",
    )
    x.add_argument("--no-requests-table", action="store_true", help="skip requests.csv")
    flags.add_no_plots(x)
    flags.add_out(x, folder="prefixkv-cluster")
    flags.add_quiet(x, also=", no line per run, and no closing line unless interrupted")


def _source(args: argparse.Namespace) -> tuple[str, int | None, Callable[[], Workload]]:
    """A description, tokens per hash id, and the requests' reader (a trace opened, not read)."""
    if args.trace is None:
        listed = make_workload(args.workload, seed=args.seed)[: args.max_requests]
        description = f"built-in workload {args.workload} ({len(listed)} requests)"
        workload = Workload(args.workload, description, listed, stats_of(listed))
        return description, None, lambda: workload
    settings = dataclasses.replace(  # replayed at the trace's own times without a rate
        common.read_settings(args), tokens_per_id=args.tokens_per_id,
        output=not args.prefill_only, sorted_arrivals=args.request_rate is None,
    )  # fmt: skip
    source = open_trace(
        args.trace, args.trace_format, max_requests=args.max_requests, settings=settings
    )
    read = functools.partial(trace_workload, source, args.trace, quiet=args.quiet)
    return f"{os.path.basename(args.trace)} ({source.format})", source.tokens_per_id, read


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that would be silently ignored, and parts whose extra is missing."""
    if not args.no_plots:
        require_extra("report", "the cluster report's plots", ("matplotlib",),
                      instead="(or give --no-plots)")  # fmt: skip
    if args.ray:
        require_extra("cluster", "--ray", ("ray",))
    if args.trace is None:
        if args.time_scale is not None:
            raise CLIUsageError(
                "--time-scale stretches a trace's timestamps, and built-in workloads have "
                "none: give --request-rate R (default 2 requests/s) or a --trace"
            )
        # The trace-input flags a workload ignores: all but --max-requests and the pool's.
        trace_flags = argparse.ArgumentParser(add_help=False)
        flags.add_trace_flags(trace_flags)
        for flag, default in vars(trace_flags.parse_args([])).items():
            if flag not in ("max_requests", "max_pool_blocks") and getattr(args, flag) != default:
                raise CLIUsageError(f"--{flag.replace('_', '-')} needs --trace")
    if not args.ray:
        for flag in ("ray_address", "ray_cpus"):
            if getattr(args, flag) is not None:
                raise CLIUsageError(f"--{flag.replace('_', '-')} needs --ray")


def run(args: argparse.Namespace, argv: Sequence[str], interrupts: Interrupts | None = None) -> int:
    """Run ``prefixkv cluster``; returns the exit status (130 or 143: interrupted, partial)."""
    interrupts = interrupts or Interrupts()
    _check_flags(args)
    plan = parse_faults(args.faults) if args.faults else None  # before the trace is opened
    if plan is not None:
        plan.check(args.replicas[0])
    given = [f for f in (args.profile, args.model_config) if f and os.path.exists(f)]
    check_output_folder(args.out, OUTPUT_NAMES, [args.trace, *given])
    profile, model = common.apply_model(args, load_profile(args.profile))
    caps = common.capacities(args, profile) or [DEFAULT_CAPACITY]
    if sizing := common.model_line(args, profile, model):
        print(f"capacity: {sizing}")
        for line in common.capacity_warnings(sorted(set(caps)), profile, args):
            print(f"prefixkv: warning: {line}", file=sys.stderr)
    description, per_id, read = _source(args)
    specs = parse_policies(args.policies, tuple(POLICIES))
    config = _settings(args, specs, caps, per_id, profile, faults=plan is not None)
    workload, admission = _admitted(args, read(), model, min(caps), config.block_size)
    rates = _rates(args, workload, profile)
    slo = None if config.slo is None else config.slo.describe()
    settings = {"capacity_model": sizing, **admission, "slo": slo}
    stream = functools.partial(_arrivals, args, workload.requests)
    if plan is not None and plan.needs_relative:
        plan = plan.resolve(arrival_span(stream(None, rates.first)))
    t0 = time.perf_counter()
    results, partial = _run_all(args, stream, specs, config, rates, caps, plan, interrupts)
    interrupts.held = True  # what finished is written whole, whatever arrives now
    if not results:
        print(f"prefixkv: {interrupts.name()} before any run finished; nothing written",
              file=sys.stderr)  # fmt: skip
        return interrupts.status()
    outputs = "prefill only" if args.prefill_only else "full outputs"
    files = write_report(
        results,
        args.out,
        command="prefixkv " + shlex.join(argv),
        source=f"{description}; arrivals: {rates.text}; {outputs}",
        requests_table=not args.no_requests_table,
        plots=not args.no_plots,
        partial=partial,
        notes=workload.notes,
        settings=settings,
    )
    if not args.quiet or partial:
        what = f"partial results ({partial})" if partial else f"{len(results)} runs"
        print(f"{what} in {time.perf_counter() - t0:.1f} s; wrote {len(files)} files to {args.out}")
    if broken := [r for r in results if r.invariants.broken()]:
        print(f"prefixkv: {len(broken)} runs broke an invariant (see report.md)", file=sys.stderr)
        return 1
    return interrupts.status() if partial or interrupts.received else 0


def _settings(
    args: argparse.Namespace,
    specs: Sequence[PolicySpec],
    caps: list[int],
    per_id: int | None,
    profile: CostProfile,
    *,
    faults: bool,
) -> ClusterSettings:
    """The first run's settings (a fault run keeps its token ids); every run of the sweeps
    is planned, and every pool bounded, now: a bad value is refused before any work."""
    sim = SimSettings(
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
    )
    config = ClusterSettings(
        num_replicas=args.replicas[0], capacity_tokens=caps[0], backend=args.index,
        block_size=args.block_size or per_id or DEFAULT_BLOCK_SIZE, sim=sim, profile=profile,
        buffer_steps=args.buffer_steps, seed=args.seed, keep_tokens=faults,
        slo=common.slo_of(args),
    )  # fmt: skip
    plan_experiment(specs, config, replicas=args.replicas, capacities=caps)
    for capacity in caps:
        if over := over_pool_limit(capacity, config.block_size, args.max_pool_blocks, "a replica"):
            raise ClusterSettingsError(over)
    return config


def _admitted(
    args: argparse.Namespace,
    workload: Workload,
    model: ModelConfig | None,
    pool: int,
    block_size: int,
) -> tuple[Workload, dict[str, Any]]:
    """The requests every replica can take and the report's settings; prints the rejections."""
    max_len = common.max_model_len(args, model)
    rule = length_rule(
        max_len, pool, block_size=block_size, max_num_batched_tokens=args.max_num_batched_tokens
    )
    if rule is None:
        return workload, {}
    kept, rejected = admit(workload, rule, abort=args.on_long_request == "abort")
    if rejected.count:
        print(f"note: {rejected.note(workload.stats.num_requests)}")
    return kept, {"admission": rule.describe(), "rejected_requests": rejected.count}


class _Rates(NamedTuple):
    """The experiment's Poisson rate (``None``: the trace's timestamps), the sweep's
    (``auto``: doubling until each policy is overloaded), and the report's words."""

    first: float | None
    sweep: tuple[float, ...]
    auto: bool
    text: str


def _rates(args: argparse.Namespace, workload: Workload, profile: CostProfile) -> _Rates:
    """``--request-rate``: ``auto`` starts at the first fleet size times the rate one
    replica serves with room to spare; a built-in workload without one gets 2/s."""
    asked = args.request_rate
    if asked is None and args.trace is not None:
        return _Rates(None, (), False, f"trace timestamps x {args.time_scale or 1.0}")
    if asked == "auto":
        first = args.replicas[0] * start_rate(workload.stats, profile, args.max_num_batched_tokens)
        sweep = rate_schedule(first, auto=True)
        then = ", then doubling until each policy is overloaded"
    else:
        first = 2.0 if asked is None else asked[0]
        sweep = rate_schedule(first, asked[1:]) if asked and len(asked) > 1 else []
        then = f", swept at {', '.join(f'{r:g}' for r in sweep)} req/s" if sweep else ""
    return _Rates(
        first, tuple(sweep), asked == "auto", f"Poisson {first:g}/s (seed {args.seed}){then}"
    )


def _run_all(
    args: argparse.Namespace,
    stream: Callable[[ClusterSettings | None, float | None], Iterator[SimRequest]],
    specs: Sequence[PolicySpec],
    config: ClusterSettings,
    rates: _Rates,
    caps: list[int],
    plan: FaultPlan | None,
    interrupts: Interrupts,
) -> tuple[list[ClusterResult], str]:
    """The experiment's runs, then the rate sweep's, and what stopped them (``""``: nothing)."""
    partial = ""
    # The most replica actors alive at once: the largest fleet, or the first (the fault
    # runs') plus the replicas its scale_up faults add.
    ups = 0 if plan is None else sum(f.kind == "scale_up" for f in plan.scheduled)
    peak = max(max(args.replicas), args.replicas[0] + ups)
    results: list[ClusterResult] = []
    on_run = None if args.quiet else _print_run
    try:
        with _fleet(args, peak if any(not s.is_bound for s in specs) else 0) as fleet:
            runs = plan_experiment(
                specs, config, replicas=args.replicas, capacities=caps, faults=plan
            )
            results += run_experiment(
                lambda cfg: stream(cfg, rates.first), runs, fleet=fleet, on_run=on_run,
                labels={"request_rate": rates.first, "role": "table"},
            )  # fmt: skip
            if rates.sweep:
                run_rate_sweep(
                    stream,
                    specs,
                    config,
                    rates.sweep,
                    auto=rates.auto,
                    fleet=fleet,
                    on_run=on_run,
                    into=results,
                )
    except ClusterInterrupted as stop:
        results = stop.results
        partial = f"{interrupts.name()} after {len(results)} of {stop.planned} runs"
    except KeyboardInterrupt:  # during the rate sweep: the runs that finished are kept
        partial = f"{interrupts.name()} during the rate sweep, after {len(results)} runs"
    return results, partial


def _arrivals(
    args: argparse.Namespace,
    requests: Iterable[TraceRequest],
    cfg: ClusterSettings | None,
    request_rate: float | None,
) -> Iterator[SimRequest]:
    """The requests with arrival times for a fleet and a Poisson rate (``None``: the trace's)."""
    # --load-per-replica: N replicas see the arrivals of the first size, N/first faster
    k = args.replicas[0] / cfg.num_replicas if cfg and args.load_per_replica else 1.0
    rate = None if request_rate is None else request_rate / k
    scale = None if request_rate is not None else (args.time_scale or 1.0) * k
    return sim_requests(
        requests,
        prefill_only=args.prefill_only,
        request_rate=rate,
        time_scale=scale,
        seed=args.seed,
        closed_loop=not args.open_loop,
    )


def _print_run(res: ClusterResult) -> None:
    """A line per finished run: hit ratio, TTFT, load verdict and, under an SLO, goodput."""
    r, lab = res.run, res.labels
    ok = "ok" if not res.invariants.broken() else "INVARIANTS BROKEN"
    load = r.load()
    goodput = "" if load.goodput is None else f", goodput {load.goodput:.3g} req/s"
    print(
        f"{lab['policy']:<22} N={lab['num_replicas']:<3} cap={lab['capacity_tokens']:<10} "
        f"{lab['faults'] or '-':<20} hit {r.hit_ratio:.3f}  TTFT mean {r.ttft_mean_s:.3g} s  "
        f"load CV {r.load_cv:.3f}  decision p99 {r.decision_cpu_p99_us:.0f} us CPU  "
        f"[{lab['wall_s']:.1f} s wall] {ok}; {load.verdict()}{goodput}",
        flush=True,
    )


@contextlib.contextmanager
def _fleet(args: argparse.Namespace, actors: int) -> Iterator[Callable[[], Fleet] | None]:
    """With ``--ray``, a factory of Ray fleets whose ``actors`` fit the free CPUs (Ray started
    and shut down if it was not running); else ``None``, the in-process fleet."""
    if not args.ray:
        yield None
        return
    import ray as ray_module  # its extra checked with the flags

    from ..cluster.ray_fleet import RayFleet, actor_cpus, check_ray_address

    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        check_ray_address(address)
    started = not ray_module.is_initialized()
    if started:
        ray_module.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        resources = ray_module.available_resources()  # type: ignore[no-untyped-call]
        cpus, note = actor_cpus(actors, float(resources.get("CPU", 0.0)), args.ray_cpus)
        if note:
            print(f"prefixkv: --ray: {note}", file=sys.stderr, flush=True)
        yield lambda: RayFleet(num_cpus=cpus, init=False)
    finally:
        if started:
            ray_module.shutdown()
