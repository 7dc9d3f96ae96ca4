"""The flags ``compare``, ``replay`` and ``cluster`` share (the cache, the trace input, the
load, the model and GPU) and what they turn into. It loads the trace readers, never the
comparison or the simulator: ``prefixkv replay`` imports it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefixkv.indexes.eviction import EVICTION_POLICIES
from prefixkv.indexes.registry import available_indexes, index_options

from ..backends import MAX_POOL_BLOCKS
from ..sim.config import DEFAULT_BLOCK_SIZE
from ..sim.model_config import ModelConfig, available_model_configs, load_model_config
from ..sim.profile import DEFAULT_GPU_MEMORY_UTILIZATION
from ..traces import FORMATS, ReadSettings, TraceLimits
from ..traces.base import SESSION_ORDERS
from ..workloads import Workload, load_workloads
from .args import (
    CLIUsageError,
    gib_list,
    index_option,
    int_arg,
    milliseconds,
    parse_capacity_tokens,
    parse_token_count,
    positive_float,
    positive_int,
    token_count_text,
    utilization,
)

if TYPE_CHECKING:
    from ..sim.load import Slo
    from ..sim.profile import CostProfile

_HASH_ALGOS = ("xxh3_128", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "sha256_raw")


def add_common(p: argparse.ArgumentParser) -> None:
    """The flags ``compare`` and ``replay`` share: the cache, K, the trace input, seed, quiet."""
    g = p.add_argument_group("cache (named like the engines' flags)")
    _add_capacity_flags(g)
    add_gpu_memory_utilization(g)
    g.add_argument(
        "--prefix-caching-hash-algo",
        choices=_HASH_ALGOS,
        metavar="ALGO",
        help="the hash chain's block hash: vLLM's sha256, sha256_cbor, xxhash, xxhash_cbor "
        "(bit-identical to vLLM 0.33's, for KV events a router can match), or prefixkv's own "
        "xxh3_128 (the default, fastest) or sha256_raw; hits are the same with any",
    )
    g.add_argument(
        "--radix-eviction-policy",
        choices=tuple(EVICTION_POLICIES),
        metavar="POLICY",
        help=f"the radix tree's eviction, as SGLang's flag: "
        f"{', '.join(EVICTION_POLICIES)} (default lru)",
    )
    g.add_argument(
        "--index-option",
        type=index_option,
        action="append",
        default=[],
        metavar="BACKEND.KEY=VALUE",
        help="any backend option of make_index, e.g. hash_chain.verify=true, hash_chain.seed=0, "
        "radix.eviction=lfu (repeatable)",
    )
    p.add_argument(
        "--concurrency",
        "-k",
        type=positive_int,
        default=1,
        metavar="K",
        help="at most K live requests; the oldest finishes first (default %(default)s)",
    )
    add_trace_flags(p)
    p.add_argument(
        "--seed",
        type=int_arg,
        default=0,
        help="workload seed and hash-id token seed (default %(default)s)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def _add_capacity_flags(g: argparse._ArgumentGroup) -> None:
    """The block and page sizes, and the KV capacity in tokens, GiB or blocks (one of them)."""
    g.add_argument(
        "--block-size",
        type=positive_int,
        default=DEFAULT_BLOCK_SIZE,
        metavar="N",
        help="tokens per block for the hash chain and none, as vLLM's --block-size "
        "(default %(default)s)",
    )
    g.add_argument(
        "--page-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="the radix tree's page size in tokens, as SGLang's --page-size (default %(default)s)",
    )
    cap = g.add_mutually_exclusive_group()
    cap.add_argument(
        "--capacity-tokens",
        type=parse_capacity_tokens,
        metavar="T[,T...]|auto",
        help="KV capacity in tokens, the same for every backend (blocks = T // size); suffixes as "
        "vLLM's: 1k = 1,000, 1K = 1,024, 1m = 10**6, 1M = 2**20. Several (1m,3m,10m): compare's "
        "table uses the first and its sweep all of them. auto: what the cost profile's hardware "
        "holds at --gpu-memory-utilization (compare)",
    )
    cap.add_argument(
        "--capacity-gib",
        type=gib_list,
        metavar="G[,G...]",
        help="KV capacity in GiB of KV cache, turned into tokens by the cost profile's KV bytes "
        "per token (compare; --profile names the model)",
    )
    cap.add_argument(
        "--capacity-blocks",
        type=positive_int,
        metavar="N",
        help="KV capacity as N blocks of --block-size tokens (N * block size tokens)",
    )


def add_gpu_memory_utilization(g: argparse._ArgumentGroup) -> None:
    """``--gpu-memory-utilization``, which ``--capacity-tokens auto`` reads."""
    g.add_argument(
        "--gpu-memory-utilization",
        type=utilization,
        metavar="U",
        help="with --capacity-tokens auto: the share of device memory the engine uses, as vLLM's "
        f"flag (default {DEFAULT_GPU_MEMORY_UTILIZATION:g})",
    )


def add_no_plots(g: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--no-plots``: the reports without their plots (and without matplotlib)."""
    g.add_argument(
        "--no-plots", action="store_true", help="skip the PNG plots (needed without matplotlib)"
    )


def add_trace_flags(p: argparse.ArgumentParser) -> None:
    """The trace's format, size limits and hash-id expansion."""
    t = p.add_argument_group("trace input")
    t.add_argument(
        "--trace-format",
        choices=FORMATS,
        help="the trace's format (default: detected from its shape and first record)",
    )
    t.add_argument(
        "--max-requests", type=positive_int, metavar="N", help="use only the first N requests"
    )
    t.add_argument(
        "--session-order",
        choices=SESSION_ORDERS,
        default="interleaved",
        help="kv-cache-tester conversations: interleaved by their time from each one's start, all "
        "starting together, as concurrent agents (default), or sequential, one after another (each "
        "finds its own blocks cached: optimistic for sizing)",
    )
    t.add_argument(
        "--tokens-per-id",
        type=positive_int,
        metavar="S",
        help="hash-id traces: tokens each hash id expands to, keeping the sharing pattern "
        "(default: the format's own: Mooncake 512, Qwen-Bailian 16, kv-cache-tester 64)",
    )
    t.add_argument(
        "--vocab-size",
        type=positive_int,
        default=32000,
        metavar="V",
        help="hash-id traces: token ids are drawn from [1, V) (default %(default)s)",
    )
    limits = TraceLimits()
    for part in ("prompt", "output"):
        most = getattr(limits, f"max_{part}_tokens")
        t.add_argument(
            f"--max-{part}-tokens",
            type=parse_token_count,
            default=most,
            metavar="T",
            help=f"refuse a trace with a longer {part} (default {token_count_text(most)})",
        )
    t.add_argument(
        "--max-pool-blocks",
        type=parse_token_count,
        default=MAX_POOL_BLOCKS,
        metavar="N",
        help="refuse a capacity of more blocks than this, the pool being built up front (default "
        f"{token_count_text(MAX_POOL_BLOCKS)})",
    )


def add_slo_flags(g: argparse._ArgumentGroup) -> None:
    """``--slo-ttft``, ``--slo-tpot``, ``--slo-e2el`` (milliseconds, as vllm bench serve)."""
    for name, what in (
        ("ttft", "time to first token"),
        ("tpot", "time per output token after the first"),
        ("e2el", "end-to-end latency"),
    ):
        g.add_argument(
            f"--slo-{name}",
            type=milliseconds,
            metavar="MS",
            help=f"an SLO bound on {what}, in milliseconds (or 0.5s); the goodput "
            "column counts requests per second that meet every bound given, as "
            f"vllm bench serve --goodput {name}:MS",
        )


def slo_of(args: argparse.Namespace) -> Slo | None:
    """The objective of the ``--slo-*`` flags, or ``None`` when none is given."""
    if args.slo_ttft is None and args.slo_tpot is None and args.slo_e2el is None:
        return None
    from ..sim.load import Slo

    return Slo(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot, e2e_s=args.slo_e2el)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The model, GPU and length flags of ``compare`` and ``cluster``."""
    g = p.add_argument_group("your model and GPU (capacity as vLLM sizes it)")
    g.add_argument(
        "--model-config",
        metavar="FILE|NAME",
        help="a Hugging Face config.json (or its folder, or org/name in the local Hugging Face "
        f"cache; nothing is downloaded; shipped: {', '.join(available_model_configs())}): its KV "
        "bytes per token (2 x layers x KV heads x head dim x dtype bytes; MLA: layers x "
        "(kv_lora_rank + qk_rope_head_dim) x dtype bytes) and weights replace the profile's",
    )
    g.add_argument(
        "--gpu-memory",
        type=positive_float,
        metavar="GIB",
        help="device memory of one GPU in GiB (an 80 GB H100 or A100: 80); with "
        "--capacity-tokens auto the pool is (--gpu-memory-utilization x GPUs x GiB "
        "- weights - --non-kv-memory) // KV bytes per token",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="GPUs the model is split over, as vLLM's flag (default %(default)s)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"),
        help="as vLLM's flag: auto keeps the model's dtype (default %(default)s)",
    )
    g.add_argument(
        "--non-kv-memory",
        type=positive_float,
        metavar="GIB",
        help="GiB besides the weights that vLLM keeps out of the pool: the profiled "
        "activation peak, CUDA graphs, non-torch memory (default 0: the pool is an "
        "upper bound; about 5 GiB for an 8B model on an H100)",
    )
    g.add_argument(
        "--max-model-len",
        type=parse_token_count,
        metavar="T",
        help="refuse requests whose prompt plus output exceed T tokens, as vLLM's front end does "
        "(default: the model config's max_position_embeddings, else no limit); requests that "
        "cannot fit the table's KV pool alone are refused too",
    )
    g.add_argument(
        "--on-long-request",
        choices=("reject", "abort"),
        default="reject",
        help="reject (count it and go on, as vLLM answers 400) or abort the run on a request too "
        "long for --max-model-len or the pool (default %(default)s)",
    )


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
