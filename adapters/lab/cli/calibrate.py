"""``prefixkv calibrate``: fit a cost profile to a served engine (``--server``), to
``vllm bench serve`` results (``--from-vllm-bench``) or to the reference engine here
(the default, the only path that imports torch); ``--list`` shows the shipped profiles.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import check_output

from ..extras import require_extra
from ..progress import progress
from ..sim import CostProfile, available_profiles, load_profile, save_profile
from ..sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..sim.http_limits import RequestLimits
from ..sim.profile import DEFAULT_GPU_MEMORY_UTILIZATION
from ..sim.serving_path import BUSY_PER_REPEAT, IDLE_PAUSES_S
from . import flags
from .args import CLIUsageError, positive_float, positive_int
from .signals import Interrupts

__all__ = ["add_arguments", "run"]

_LIMITS = RequestLimits()  # the defaults the help states


def add_arguments(cal: argparse.ArgumentParser) -> None:
    """Give the ``calibrate`` subcommand's parser its description and flags."""
    cal.description = (
        "Fit the cost model's coefficients to a running OpenAI-compatible server "
        "(--server), to vllm bench serve results (--from-vllm-bench), or to the reference "
        "engine's forward pass timed here (the default), and write them as a profile that "
        "compare and cluster read (--profile FILE). --list shows the shipped profiles."
    )
    cal.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where to run (default: cuda when available, else cpu)",
    )
    cal.add_argument(
        "--dtype", choices=("float32", "float64"), default="float32", help="(default %(default)s)"
    )
    _add_model_flags(cal)
    cal.add_argument(
        "--repeats",
        type=positive_int,
        metavar="R",
        help="runs per shape: the reference engine keeps the least (default 5), a server "
        "the median (default 3)",
    )
    cal.add_argument(
        "--quick",
        action="store_true",
        help="8 small shapes instead of 22: a rough profile in seconds",
    )
    cal.add_argument("--name", metavar="NAME", help="the profile's name (default from the device)")
    flags.add_quiet(cal)
    flags.add_out(cal, file="the profile (JSON); required but with --list", required=False)
    _add_source_flags(cal)


def _add_model_flags(cal: argparse.ArgumentParser) -> None:
    m = cal.add_argument_group("the reference engine's model (its weights are random)")
    for flag, default, what in (
        ("--num-layers", 2, "layers"),
        ("--num-heads", 4, "attention heads, as many KV heads"),
        ("--head-dim", 32, "even"),
    ):
        m.add_argument(
            flag,
            type=positive_int,
            default=default,
            metavar="N",
            help=f"{what} (default %(default)s)",
        )


def _add_source_flags(cal: argparse.ArgumentParser) -> None:
    src = cal.add_argument_group("a served engine instead of the reference engine")
    what = src.add_mutually_exclusive_group()
    what.add_argument(
        "--server",
        metavar="URL",
        help="a running OpenAI-compatible server (vLLM: start it with "
        "--enable-prompt-tokens-details): sweep prompt lengths, cached fractions and batch "
        "sizes over HTTP and fit the profile to what the client measured",
    )
    what.add_argument(
        "--from-vllm-bench",
        nargs="+",
        metavar="FILE",
        help="results files of vllm bench serve --save-result --save-detailed (several runs "
        "allowed): fit the profile to the requests that ran alone and the pure decode steps",
    )
    what.add_argument(
        "--list", action="store_true", help="list the shipped profiles (use with --profile NAME)"
    )
    src.add_argument(
        "--model", metavar="NAME", help="with --server: the model (default: its first)"
    )
    src.add_argument(
        "--request-timeout",
        type=positive_float,
        default=_LIMITS.deadline_s,
        metavar="S",
        help="with --server: seconds one request may take, its whole answer included, "
        "however slowly it streams (default %(default)g); each answer is also capped at "
        f"{_LIMITS.max_response_bytes >> 20} MiB",
    )
    src.add_argument(
        "--rounds",
        type=positive_int,
        default=1,
        metavar="N",
        help="with --server: calibrate N times over and fit one profile to all of them "
        "(each shape's median over the rounds; a round far from the others dropped; the "
        "profile says how spread they were). A small or shared machine's timings move "
        "between minutes: 3 rounds of --quick are steadier than one full sweep",
    )
    flags.add_max_num_batched_tokens(src, given_only=True, served=True)


def run(args: argparse.Namespace, argv: Sequence[str], interrupts: Interrupts | None = None) -> int:
    """Run ``prefixkv calibrate``; returns the exit status. The extras and ``--out`` are
    checked before any measurement; Ctrl-C before the fit writes nothing."""
    interrupts = interrupts or Interrupts()
    if args.list:
        print(list_profiles())
        return 0
    if args.out is None:
        raise CLIUsageError("--out FILE is required (the profile to write)")
    if args.rounds > 1 and args.server is None:
        raise CLIUsageError("--rounds goes with --server")
    needs = ("numpy", "scipy", "httpx") if args.server is not None else ("numpy", "scipy")
    require_extra("calibrate", "prefixkv calibrate", needs)
    reference = args.server is None and args.from_vllm_bench is None
    if reference:
        require_extra(
            "torch",
            "prefixkv calibrate (the reference engine)",
            instead="or calibrate from a served engine: --server URL or --from-vllm-bench FILE",
        )
    out = check_output(args.out)
    budget = args.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    if reference:
        profile = _reference_engine(args)
    elif args.server is not None:
        profile = _from_server(args, budget)
    else:
        from ..sim.bench_results import calibrate_from_vllm_bench

        profile = calibrate_from_vllm_bench(
            args.from_vllm_bench, name=args.name, max_num_batched_tokens=budget
        )
    interrupts.held = True  # the profile is measured: write it whole
    save_profile(profile, out)
    _print_fit(profile, out)
    return interrupts.status() if interrupts.received else 0


def _from_server(args: argparse.Namespace, budget: int) -> CostProfile:
    from ..sim.calibration_rounds import pool_rounds
    from ..sim.server_calibration import QUICK_SWEEP, ServerSweep, calibrate_server

    base = QUICK_SWEEP if args.quick else ServerSweep()
    repeats = args.repeats or base.repeats
    sweep = dataclasses.replace(base, repeats=repeats, max_num_batched_tokens=budget)
    runs = _num_runs(sweep) * args.rounds
    bar = progress(runs, f"calibrate {args.server}", quiet=args.quiet, unit="run")
    try:
        rounds = [
            calibrate_server(
                args.server,
                model=args.model,
                sweep=sweep,
                name=args.name,
                progress=bar.update,
                limits=RequestLimits(deadline_s=args.request_timeout),
            )
            for _ in range(args.rounds)
        ]
    finally:
        bar.close()
    return rounds[0] if len(rounds) == 1 else pool_rounds(rounds)


def _num_runs(sweep: Any) -> int:
    prefill = len(sweep.prompt_lengths) * len(sweep.cached_fractions)
    decode = len(sweep.batch_sizes) * len(sweep.decode_contexts)
    # short, long and loaded requests, idle, busy and decoding ones
    per_repeat = 3 + len(IDLE_PAUSES_S) + BUSY_PER_REPEAT + len(sweep.decoding_pauses_s)
    serving = per_repeat * sweep.serving_repeats
    return int((prefill + decode) * sweep.repeats + len(sweep.background_streams) + serving)


def _print_fit(profile: CostProfile, out: Path) -> None:
    fit = profile.fit
    print(
        f"{profile.name}: {profile.device}; fit over {fit['num_samples']} samples, relative "
        f"error p50 {fit['relative_error_p50']:.1%}, max {fit['relative_error_max']:.1%}"
        f" -> {out}"
    )
    rounds = fit.get("rounds")
    if isinstance(rounds, dict):
        speeds = ", ".join(f"{r['speed_log']:+.2f}" for r in rounds["per_round"])
        print(
            f"{rounds['kept']} of {rounds['count']} rounds kept (log speed against their "
            f"median: {speeds}); each shape's time varied "
            f"{rounds['shape_spread_median']:.0%} across them (median; max - min over median)"
        )
    path = fit.get("serving_path")
    if isinstance(path, dict):
        hops = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in path.get("hops", {}).items())
        print(
            f"serving path (engine side from {path.get('engine_side')}): request_s "
            f"{profile.request_s * 1e3:.1f} ms, stream_token_s {profile.stream_token_s * 1e3:.3f}"
            f" ms, front-end CPU share {profile.frontend_cpu_share:.2f}, wake "
            f"{profile.wake_s * 1e3:.1f} ms after {profile.wake_after_s:g} s idle, taking a "
            f"request in {profile.admit_s * 1e3:.1f} ms a step; medians: {hops}"
        )
        if profile.pace_spread:  # the quantiles at 0, 5, ..., 100%: p10, p50, p90
            p10, p50, p90 = (profile.pace_spread[k] for k in (2, 10, 18))
            print(f"engine pace from request to request (lone decodes, x their median): "
                  f"p10 {p10:.2f}, p50 {p50:.2f}, p90 {p90:.2f}, over "
                  f"{profile.pace_window_s * 1e3:.0f} ms")  # fmt: skip
        for what, table in (
            ("outside the engine, sent to an idle server", profile.request_spread_s),
            ("outside the engine, sent to a busy server", profile.busy_request_spread_s),
            ("a decoding request's first token beyond its step, sent to an idle server",
             profile.decoding_request_spread_s),
        ):  # fmt: skip
            if table:  # the quantiles at 0, 5, ..., 100%: p50, p90, p100
                p50, p90, top = (table[k] * 1e3 for k in (10, 18, 20))
                print(f"{what}: p50 {p50:.1f} ms, p90 {p90:.1f} ms, max {top:.1f} ms")


def list_profiles() -> str:
    """The shipped profiles, one paragraph each."""
    blocks = []
    for name in available_profiles():
        p = load_profile(name)
        lines = [f"{name}: {p.model}", f"  device: {p.device}"]
        measured = ", ".join(f"{k} {v}" for k, v in p.measured_on.items() if v)
        if measured:
            lines.append(f"  measured on: {measured}")
        if p.covers:
            lines.append(
                "  covers: "
                + ", ".join(
                    f"{k.replace('_', ' ')} {lo:,}-{hi:,}" for k, (lo, hi) in p.covers.items()
                )
            )
        cap = p.kv_capacity_tokens()
        if cap is not None:
            per = f"{p.kv_bytes_per_token:,} bytes a token" if p.kv_bytes_per_token else ""
            lines.append(
                f"  KV capacity: {cap:,} tokens at gpu-memory-utilization "
                f"{DEFAULT_GPU_MEMORY_UTILIZATION:g} ({per})"
            )
        lines.append(f"  source: {p.source}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def _reference_engine(args: argparse.Namespace) -> CostProfile:
    import torch  # only the reference engine's calibration needs torch here

    from prefixkv.adapters.engine import EngineConfig, ModelConfig

    from ..sim.calibration import (
        DEFAULT_DECODE_SHAPES,
        DEFAULT_MIXED_SHAPES,
        DEFAULT_PREFILL_SHAPES,
        QUICK_SHAPES,
        calibrate,
    )

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = ModelConfig(
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_heads,
        head_dim=args.head_dim,
    )
    config = EngineConfig(model=model, dtype=args.dtype, device=device)
    shapes: dict[str, Any] = {
        "prefill": DEFAULT_PREFILL_SHAPES,
        "decode": DEFAULT_DECODE_SHAPES,
        "mixed": DEFAULT_MIXED_SHAPES,
    }
    if args.quick:
        shapes.update(QUICK_SHAPES)
    num_shapes = sum(map(len, shapes.values()))
    repeats = args.repeats or 5
    bar = progress((1 + repeats) * num_shapes, f"calibrate on {device}", quiet=args.quiet,
                   unit="run")  # fmt: skip
    try:
        return calibrate(config, name=args.name, repeats=repeats, progress=bar.update, **shapes)
    finally:
        bar.close()
