"""What the flags ``compare``, ``replay`` and ``cluster`` share (defined in :mod:`.flags`)
turn into: the backends' options, the trace's reading, the capacities, the model and GPU.
It loads the trace readers, never the comparison or the simulator: ``prefixkv replay``
imports it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefixkv.indexes.registry import available_indexes, index_options

from ..sim.model_config import ModelConfig, load_model_config
from ..sim.profile import DEFAULT_GPU_MEMORY_UTILIZATION
from ..traces import ReadSettings, TraceLimits
from ..workloads import Workload, load_workloads
from .args import CLIUsageError

if TYPE_CHECKING:
    from ..sim.load import Slo
    from ..sim.profile import CostProfile


def slo_of(args: argparse.Namespace) -> Slo | None:
    """The objective of the ``--slo-*`` flags, or ``None`` when none is given."""
    if args.slo_ttft is None and args.slo_tpot is None and args.slo_e2el is None:
        return None
    from ..sim.load import Slo

    return Slo(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot, e2e_s=args.slo_e2el)


def backend_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each backend's options: an engine-named flag reaches every backend that takes it,
    then ``--index-option``."""
    flags = {
        "hash_algorithm": args.prefix_caching_hash_algo,
        "eviction": args.radix_eviction_policy,
    }
    options: dict[str, dict[str, Any]] = {}
    for name in available_indexes():
        for option in index_options(name):
            if flags.get(option) is not None:
                options.setdefault(name, {})[option] = flags[option]
    for backend, key, value in args.index_option:
        options.setdefault(backend, {})[key] = value
    return options


def read_settings(args: argparse.Namespace) -> ReadSettings:
    """How the trace is read; with ``--time-scale``, in arrival order."""
    limits = TraceLimits(
        max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens
    )
    return ReadSettings(
        vocab_size=args.vocab_size,
        seed=args.seed,
        limits=limits,
        sorted_arrivals=getattr(args, "time_scale", None) is not None,
        session_order=getattr(args, "session_order", "interleaved"),
    )


def load_workloads_for(args: argparse.Namespace, names: list[str] | None) -> list[Workload]:
    """The named built-in workloads, or the trace, as the trace-input flags shape them."""
    return load_workloads(
        names,
        args.trace,
        max_requests=args.max_requests,
        tokens_per_id=args.tokens_per_id,
        seed=args.seed,
        trace_format=args.trace_format,
        settings=read_settings(args),
        quiet=args.quiet,
    )


def capacities(args: argparse.Namespace, profile: CostProfile | None = None) -> list[int] | None:
    """The capacities asked for, in tokens (``None``: the roomy default); CLIUsageError for
    ``auto`` or GiB without a profile that says its KV bytes per token (and memory)."""
    if args.capacity_tokens == "auto":
        if profile is None:
            raise CLIUsageError("--capacity-tokens auto needs a cost profile: use compare")
        tokens = profile.kv_capacity_tokens(memory_utilization(args))
        if not tokens:
            raise CLIUsageError(
                f"--capacity-tokens auto: profile {profile.name!r} does not say its KV bytes "
                "per token and device memory (or holds no KV); give --capacity-tokens T"
            )
        return [tokens]
    if getattr(args, "capacity_gib", None) is not None:
        per = None if profile is None else profile.kv_bytes_per_token
        if not per:
            what = "a cost profile" if profile is None else f"profile {profile.name!r}"
            raise CLIUsageError(
                f"--capacity-gib needs {what} that says its KV bytes per token; give "
                "--capacity-tokens T"
            )
        return [int(g * 2**30) // per for g in args.capacity_gib]
    if args.capacity_tokens is not None:
        return list(args.capacity_tokens)
    blocks = getattr(args, "capacity_blocks", None)  # cluster has no --capacity-blocks
    return None if blocks is None else [int(blocks) * int(args.block_size)]


def memory_utilization(args: argparse.Namespace) -> float:
    """``--gpu-memory-utilization``, or vLLM's default share."""
    return float(args.gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION)


def capacity_warnings(
    caps: Sequence[int], profile: CostProfile, args: argparse.Namespace
) -> list[str]:
    """A line naming the capacities beyond what ``profile``'s hardware holds, if any."""
    util = memory_utilization(args)
    held = profile.kv_capacity_tokens(util)
    over = sorted(c for c in caps if held and c > held)
    if not held or not over:
        return []
    return [
        f"capacity {', '.join(f'{c:,}' for c in over)} tokens: up to {over[-1] / held:.1f}x "
        f"what {profile.name}'s hardware holds ({held:,} tokens of KV at "
        f"--gpu-memory-utilization {util:g}; --capacity-tokens auto gives that)"
    ]


def apply_model(
    args: argparse.Namespace, profile: CostProfile
) -> tuple[CostProfile, ModelConfig | None]:
    """``profile`` with the hardware of ``--model-config``/``--gpu-memory``; ModelConfigError
    for a config not found or read, CLIUsageError for a flag missing what it needs."""
    model = None
    if args.model_config is not None:
        model = load_model_config(args.model_config, args.kv_cache_dtype)
    elif args.kv_cache_dtype != "auto":
        raise CLIUsageError("--kv-cache-dtype needs --model-config")
    if args.capacity_tokens == "auto" and model is not None and args.gpu_memory is None:
        raise CLIUsageError("--capacity-tokens auto with --model-config needs --gpu-memory GIB")
    if args.model_config is None and args.gpu_memory is None:
        if args.tensor_parallel_size != 1 or args.non_kv_memory is not None:
            raise CLIUsageError(
                "--tensor-parallel-size and --non-kv-memory need --model-config or --gpu-memory"
            )
        return profile, None
    non_kv = int((args.non_kv_memory or 0.0) * 2**30)
    changes: dict[str, object] = {"kv_cache_tokens": None}
    if model is not None:
        tp = args.tensor_parallel_size
        changes.update(
            kv_bytes_per_token=model.kv_bytes_per_token,
            weight_bytes=model.weight_bytes + non_kv,
            model=f"{model.name}, {8 * model.kv_dtype_bytes}-bit KV"
            + (f", tensor parallel {tp}" if tp > 1 else ""),
        )
    elif non_kv:
        changes["weight_bytes"] = (profile.weight_bytes or 0) + non_kv
    if args.gpu_memory is not None:
        changes["device_memory_bytes"] = int(args.gpu_memory * 2**30) * args.tensor_parallel_size
    elif model is not None:
        changes["device_memory_bytes"] = None  # the profile's GPUs are not this model's
    return dataclasses.replace(profile, **changes), model  # type: ignore[arg-type]


def model_line(
    args: argparse.Namespace, profile: CostProfile, model: ModelConfig | None
) -> str | None:
    """The console's and report's capacity line for ``--model-config``/``--gpu-memory``."""
    if model is None and args.gpu_memory is None:
        return None
    util = memory_utilization(args)
    parts = [] if model is None else [model.describe()]
    if profile.device_memory_bytes is not None and profile.kv_bytes_per_token:
        tokens = profile.kv_capacity_tokens(util) or 0
        gib = tokens * profile.kv_bytes_per_token / 2**30
        parts.append(
            f"pool {tokens:,} tokens = {gib:,.1f} GiB of KV on {args.tensor_parallel_size} x "
            f"{args.gpu_memory:g} GiB at --gpu-memory-utilization {util:g}, less "
            f"{(profile.weight_bytes or 0) / 2**30:,.2f} GiB of weights"
            + (
                " and non-KV memory"
                if args.non_kv_memory
                else " (an upper bound: vLLM also keeps its profiled activation peak out; "
                "--non-kv-memory GIB)"
            )
        )
    parts.append(f"step costs from profile {profile.name}")
    return "; ".join(parts)


def max_model_len(args: argparse.Namespace, model: ModelConfig | None) -> int | None:
    """``--max-model-len``, else the model's context (as vLLM defaults it), else ``None``."""
    given: int | None = args.max_model_len
    return model.max_position_embeddings if given is None and model is not None else given
