"""``prefixkv cluster``: route a trace over N replicas with each policy; write a report.

The subcommand's flags and its run over the cluster simulation
(:mod:`prefixkv.adapters.lab.cluster`) live here: :mod:`.main` imports this module
when ``cluster`` is chosen, for :func:`add_arguments` and :func:`run`. The model,
length, rate-sweep and SLO flags are ``compare``'s (:mod:`.cluster_load`), and so are the
trace-input flags (:func:`.common.add_trace_flags`), ``--max-pool-blocks`` bounding each
replica's pool. Flags that
would be ignored are refused, ``--out`` is checked before the first run, ``--ray``
checks that the replica actors fit the Ray cluster's CPUs before starting them, and
Ctrl-C (or SIGTERM) writes the runs that finished, marked partial.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prefixkv.adapters.lab.sim.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    SimSettings,
)
from prefixkv.adapters.lab.sim.profile import DEFAULT_PROFILE, CostProfile, load_profile
from prefixkv.adapters.lab.sim.requests import SimRequest
from prefixkv.adapters.lab.traces import TraceRequest, TraceSource, open_trace, stats_of
from prefixkv.adapters.lab.workloads import WORKLOADS, Workload, make_workload, trace_workload
from prefixkv.adapters.outputs import check_output_folder
from prefixkv.adapters.router.policies import POLICIES
from prefixkv.adapters.router.routing import BOUNDS, PolicySpec, parse_policies

from ..backends import over_pool_limit
from ..cluster.config import DEFAULT_BUFFER_STEPS, MAX_REPLICAS
from ..cluster.errors import ClusterSettingsError
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
from ..cluster.run import ClusterSettings
from ..extras import require_extra
from ..outputs.cluster import OUTPUT_NAMES, write_report
from ..sim.arrivals import sim_requests
from .args import (
    CLIUsageError,
    int_arg,
    parse_capacity_tokens,
    parse_token_count,
    positive_float,
    positive_int,
)
from .cluster_load import Rates, admitted, fleet_capacities, rates_of
from .common import add_gpu_memory_utilization, add_no_plots, add_trace_flags, read_settings
from .load_flags import add_slo_flags, request_rates, slo_of
from .model_flags import add_model_flags, apply_model
from .signals import Interrupts

__all__ = ["add_arguments", "run"]

DEFAULT_POLICIES = ",".join((*POLICIES, *BOUNDS))


def _replica_counts(text: str) -> list[int]:
    """``--replicas``: every value checked here, before anything runs."""
    try:
        values = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want positive ints like 1,2,4,8, got {text!r}") from None
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"want distinct positive ints like 1,2,4,8, got {text!r}")
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
    src.add_argument("--trace", metavar="PATH", help="a trace (any format compare reads)")
    src.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="multi_turn",
        help="a built-in workload when no trace is given (default %(default)s)",
    )
    add_trace_flags(p)
    _add_fleet_flags(p)
    _add_router_flags(p)
    _add_runner_flags(p)
    add_model_flags(p)


def _add_fleet_flags(p: argparse.ArgumentParser) -> None:
    """The replicas: how many, their capacity, index, scheduler and costs."""
    f = p.add_argument_group("fleet")
    f.add_argument("--replicas", type=_replica_counts, default=[8], metavar="N[,N...]",
                   help="replicas; several sweep the fleet size (default 8)")  # fmt: skip
    f.add_argument(
        "--capacity-tokens",
        type=parse_capacity_tokens,
        metavar="T[,T...]|auto",
        help="KV capacity per replica in tokens (1m = 10**6, 1M = 2**20); several sweep it; "
        "auto: the pool vLLM sizes on the profile's hardware, or on --model-config and "
        "--gpu-memory (default 3m, Mooncake's per-node local cache)",
    )
    add_gpu_memory_utilization(f)
    f.add_argument(
        "--block-size",
        type=positive_int,
        metavar="N",
        help="tokens per block (default: the hash-id trace's tokens per id, else "
        f"{DEFAULT_BLOCK_SIZE})",
    )
    f.add_argument(
        "--index",
        default="hash_chain",
        metavar="NAME",
        help="each replica's prefix index (default %(default)s)",
    )
    f.add_argument("--max-num-seqs", type=positive_int, default=DEFAULT_MAX_NUM_SEQS, metavar="N")
    f.add_argument(
        "--max-num-batched-tokens",
        type=parse_token_count,
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        metavar="N",
    )
    f.add_argument(
        "--profile", default=DEFAULT_PROFILE, help="cost profile: a shipped name or a file"
    )
    f.add_argument(
        "--buffer-steps",
        type=positive_int,
        default=DEFAULT_BUFFER_STEPS,
        metavar="N",
        help=f"event batches each replica keeps for replay (vLLM's {DEFAULT_BUFFER_STEPS})",
    )
    f.add_argument("--prefill-only", action="store_true",
                   help="one output token per request (Mooncake's prefill pool)")  # fmt: skip
    f.add_argument("--open-loop", action="store_true",
                   help="send every request at its own arrival, even a session's next turn "
                   "before the previous one finished (default: sessions replay closed loop, "
                   "each turn after the previous answer plus its think time)")  # fmt: skip


def _add_router_flags(p: argparse.ArgumentParser) -> None:
    """Arrivals, the routing policies and the faults."""
    arrivals = p.add_argument_group("arrivals")
    a = arrivals.add_mutually_exclusive_group()
    a.add_argument(
        "--request-rate",
        type=request_rates,
        metavar="R[,R...]|auto",
        help="Poisson, R requests/s; several (1,2,4,8) run the experiment at the first and "
        "sweep every policy over the rest on the first fleet size and capacity; auto starts "
        "where the fleet has room and doubles until each policy is overloaded (at most 10 "
        "rates), as compare --request-rate",
    )
    a.add_argument("--time-scale", type=positive_float, metavar="S",
                   help="the trace's timestamps x S (< 1: more load)")  # fmt: skip
    add_slo_flags(arrivals)
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
        help="routing policies, each name[@chained|radix|approx][:key=value...]; pooled and "
        "infinite are the bounds (default: %(default)s)",
    )
    r.add_argument(
        "--faults",
        metavar="SPEC[,SPEC...]",
        help="also run every policy with these faults, e.g. drop=0.05,kill=1@50%%,"
        "router_restart@60%%:dump (see the README)",
    )


def _add_runner_flags(p: argparse.ArgumentParser) -> None:
    """Where the replicas run (in-process or Ray), the seed and the outputs."""
    x = p.add_argument_group("runner")
    x.add_argument(
        "--ray",
        action="store_true",
        help="one Ray actor per replica (pip install 'prefixkv[cluster]')",
    )
    x.add_argument(
        "--ray-address", metavar="ADDR", help="join this Ray cluster (default: start a local one)"
    )
    x.add_argument("--ray-cpus", type=positive_float, metavar="C",
                   help="CPUs each replica actor asks for; refused when the actors do not "
                   "fit the cluster's free CPUs (default 1, lowered to fit)")  # fmt: skip
    x.add_argument(
        "--seed", type=int_arg, default=0, help="router, faults, arrivals and workload seed"
    )
    x.add_argument("--no-requests-table", action="store_true", help="skip requests.csv")
    add_no_plots(x)
    x.add_argument("--out", "-o", default="prefixkv-cluster", metavar="DIR", help="output folder")
    x.add_argument("--quiet", "-q", action="store_true", help="no progress lines")


def _source(args: argparse.Namespace) -> tuple[Iterable[TraceRequest], str, int | None]:
    """Trace requests (re-iterable; a trace opened, not yet read), a description, and
    tokens per hash id."""
    if args.trace is None:
        w = make_workload(args.workload, seed=args.seed)[: args.max_requests]
        return w, f"built-in workload {args.workload} ({len(w)} requests)", None
    opts = dataclasses.replace(
        read_settings(args),
        tokens_per_id=args.tokens_per_id,
        output=not args.prefill_only,
        sorted_arrivals=args.request_rate is None,  # replayed at the trace's own times
    )
    source = open_trace(
        args.trace, args.trace_format, max_requests=args.max_requests, settings=opts
    )
    name = os.path.basename(args.trace)
    return source, f"{name} ({source.format})", source.tokens_per_id


def _workload(
    args: argparse.Namespace, requests: Iterable[TraceRequest], description: str
) -> Workload:
    """The requests with their sizes: a trace is scanned once (every request checked)."""
    if isinstance(requests, TraceSource):
        return trace_workload(requests, args.trace, quiet=args.quiet)
    listed = list(requests)
    return Workload(args.workload, description, listed, stats_of(listed))


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
        for flag, default in _trace_only_defaults().items():
            if getattr(args, flag) != default:
                raise CLIUsageError(f"--{flag.replace('_', '-')} needs --trace")
    if not args.ray:
        for flag in ("ray_address", "ray_cpus"):
            if getattr(args, flag) is not None:
                raise CLIUsageError(f"--{flag.replace('_', '-')} needs --ray")


def _trace_only_defaults() -> dict[str, Any]:
    """The trace-input flags a built-in workload ignores, with their defaults: all but
    ``--max-requests`` (the first N of a workload too) and ``--max-pool-blocks``."""
    p = argparse.ArgumentParser(add_help=False)
    add_trace_flags(p)
    defaults = vars(p.parse_args([]))
    return {k: v for k, v in defaults.items() if k not in ("max_requests", "max_pool_blocks")}


def run(args: argparse.Namespace, argv: Sequence[str], interrupts: Interrupts | None = None) -> int:
    """Run ``prefixkv cluster``; returns the exit status (errors raise; 130 or 143:
    interrupted, the finished runs written and marked partial)."""
    interrupts = interrupts or Interrupts()
    _check_flags(args)
    plan = parse_faults(args.faults) if args.faults else None  # before the trace is opened
    if plan is not None:
        plan.check(args.replicas[0])
    given = [f for f in (args.profile, args.model_config) if f and os.path.exists(f)]
    check_output_folder(args.out, OUTPUT_NAMES, [args.trace, *given])
    profile, model = apply_model(args, load_profile(args.profile))
    capacities = fleet_capacities(args, profile, model)
    requests, description, per_id = _source(args)
    specs = parse_policies(args.policies, tuple(POLICIES))
    config = _cluster_settings(args, capacities[0], per_id, profile, faults=plan is not None)
    # Every run's settings, built now: a bad value anywhere in a sweep (--replicas,
    # --capacity-tokens) is refused before the trace is read or the first run starts.
    plan_experiment(specs, config, replicas=args.replicas, capacities=capacities)
    _check_pools(capacities, config.block_size, args.max_pool_blocks)
    workload, settings = admitted(
        args, _workload(args, requests, description), model, config.block_size,
        min(capacities), profile,
    )  # fmt: skip
    rates = rates_of(args, workload, profile)
    settings["slo"] = None if config.slo is None else config.slo.describe()
    stream = _arrivals(args, workload.requests)
    if plan is not None and plan.needs_relative:
        plan = plan.resolve(arrival_span(stream(None, rates.first)))
    t0 = time.perf_counter()
    results, partial = _run_all(args, stream, specs, config, rates, capacities, plan, interrupts)
    interrupts.hold()  # what finished is written whole, whatever arrives now
    if not results:
        print(f"prefixkv: {interrupts.name()} before any run finished; nothing written",
              file=sys.stderr)  # fmt: skip
        return interrupts.status()
    timing = rates.describe(args.seed, args.time_scale)
    files = write_report(
        results,
        args.out,
        command="prefixkv " + shlex.join(argv),
        source=f"{description}; arrivals: {timing}; "
        f"{'prefill only' if args.prefill_only else 'full outputs'}",
        requests_table=not args.no_requests_table,
        plots=not args.no_plots,
        partial=partial,
        notes=workload.notes,
        settings=settings,
    )
    if not args.quiet or partial:
        wall = time.perf_counter() - t0
        what = f"partial results ({partial})" if partial else f"{len(results)} runs"
        print(f"{what} in {wall:.1f} s; wrote {len(files)} files to {args.out}")
    return _exit_status(results, partial, interrupts)


def _check_pools(capacities: Iterable[int], block_size: int, max_pool_blocks: int) -> None:
    """Refuse a replica pool of more blocks than ``--max-pool-blocks``, the limit
    ``compare`` and ``replay`` put on a pool.

    Raises:
        ClusterSettingsError: naming the capacity, its blocks and the limit.
    """
    for capacity in capacities:
        over = over_pool_limit(capacity, block_size, max_pool_blocks, "a replica")
        if over:
            raise ClusterSettingsError(over)


def _cluster_settings(
    args: argparse.Namespace,
    capacity_tokens: int,
    per_id: int | None,
    profile: CostProfile,
    *,
    faults: bool,
) -> ClusterSettings:
    """The first run's settings, from the flags (a fault run keeps its token ids)."""
    return ClusterSettings(
        num_replicas=args.replicas[0],
        capacity_tokens=capacity_tokens,
        backend=args.index,
        block_size=args.block_size or per_id or DEFAULT_BLOCK_SIZE,
        sim=SimSettings(
            max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens
        ),
        profile=profile,
        buffer_steps=args.buffer_steps,
        seed=args.seed,
        keep_tokens=faults,
        slo=slo_of(args),
    )


def _run_all(
    args: argparse.Namespace,
    stream: Callable[[ClusterSettings | None, float | None], Iterator[SimRequest]],
    specs: Sequence[PolicySpec],
    config: ClusterSettings,
    rates: Rates,
    capacities: list[int],
    plan: FaultPlan | None,
    interrupts: Interrupts,
) -> tuple[list[ClusterResult], str]:
    """The experiment's runs, then the rate sweep's; returns the runs that finished
    and, when interrupted, what stopped them (else ``""``)."""
    partial = ""
    actors = _peak_actors(args, plan) if any(not s.is_bound for s in specs) else 0
    results: list[ClusterResult] = []
    on_run = None if args.quiet else _print_run
    try:
        with _fleet(args, actors) as fleet_factory:
            runs = plan_experiment(
                specs, config, replicas=args.replicas, capacities=capacities, faults=plan
            )
            results += run_experiment(
                lambda cfg: stream(cfg, rates.first), runs, fleet=fleet_factory, on_run=on_run,
                labels={"request_rate": rates.first, "role": "table"},
            )  # fmt: skip
            if rates.sweep:
                run_rate_sweep(
                    stream, specs, config, rates.sweep, auto=rates.auto, fleet=fleet_factory,
                    on_run=on_run, into=results,
                )  # fmt: skip
    except ClusterInterrupted as stop:
        results = stop.results
        partial = f"{interrupts.name()} after {len(results)} of {stop.planned} runs"
    except KeyboardInterrupt:  # during the rate sweep: the runs that finished are kept
        partial = f"{interrupts.name()} during the rate sweep, after {len(results)} runs"
    return results, partial


def _exit_status(results: list[ClusterResult], partial: str, interrupts: Interrupts) -> int:
    """1 when a run broke an invariant; else 130 or 143 when interrupted; else 0."""
    broken = [r for r in results if r.invariants.broken()]
    if broken:
        print(f"prefixkv: {len(broken)} runs broke an invariant (see report.md)", file=sys.stderr)
        return 1
    return interrupts.status() if partial or interrupts.received else 0


def _peak_actors(args: argparse.Namespace, plan: FaultPlan | None) -> int:
    """The most replica actors alive at once: the largest fleet, plus the replicas
    ``scale_up`` faults add (fault runs use the first fleet size)."""
    ups = 0 if plan is None else sum(f.kind == "scale_up" for f in plan.scheduled)
    sizes: list[int] = args.replicas
    return max(max(sizes), sizes[0] + ups)


def _arrivals(
    args: argparse.Namespace, requests: Iterable[TraceRequest]
) -> Callable[[ClusterSettings | None, float | None], Iterator[SimRequest]]:
    """The requests with arrival times, for a fleet configuration and a Poisson rate
    (``None``: the trace's timestamps x ``--time-scale``), re-iterable."""
    first = args.replicas[0]

    def stream(cfg: ClusterSettings | None, request_rate: float | None) -> Iterator[SimRequest]:
        # --load-per-replica: N replicas see the arrivals of the first size, N/first faster
        k = first / cfg.num_replicas if cfg is not None and args.load_per_replica else 1.0
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

    return stream


def _print_run(res: ClusterResult) -> None:
    """One progress line per finished run: its hit ratio, TTFT, load verdict (offered
    vs achieved rate, overloaded or not) and, under an SLO, goodput."""
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
    """With ``--ray``, a factory of Ray fleets whose ``actors`` replica actors fit the
    cluster's free CPUs (Ray is started, then shut down if this started it);
    otherwise ``None``, the in-process fleet.

    Raises:
        ClusterSettingsError: Ray unreachable, or ``--ray-cpus`` too large.
        ExtraNotInstalledError: Ray is not installed.
    """
    if not args.ray:
        yield None
        return
    require_extra("cluster", "--ray", ("ray",))
    import ray as ray_module

    from ..cluster.ray_fleet import RayFleet, actor_cpus, check_ray_address

    address = args.ray_address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        check_ray_address(address)
    started = not ray_module.is_initialized()
    if started:
        ray_module.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        resources = ray_module.available_resources()  # type: ignore[no-untyped-call]
        free = float(resources.get("CPU", 0.0))
        cpus, note = actor_cpus(actors, free, args.ray_cpus)
        if note:
            print(f"prefixkv: --ray: {note}", file=sys.stderr, flush=True)

        def fleet_factory() -> Fleet:
            return RayFleet(num_cpus=cpus, init=False)

        yield fleet_factory
    finally:
        if started:
            ray_module.shutdown()
