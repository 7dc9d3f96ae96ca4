"""The flags ``compare``, ``replay`` and ``cluster`` share: the cache, the trace input,
and what they turn into (backend options, read settings, workloads, capacities).

The argument types, the parser and the exit codes are in :mod:`.args`. This module
loads the trace readers, never the comparison or the simulator: ``prefixkv replay``
imports it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefixkv.indexes.registry import available_indexes, index_options

from ..backends import MAX_POOL_BLOCKS
from ..progress import Progress, progress
from ..sim.config import DEFAULT_BLOCK_SIZE
from ..sim.profile import DEFAULT_GPU_MEMORY_UTILIZATION
from ..traces import FORMATS, ReadSettings, TraceLimits
from ..traces.base import SESSION_ORDERS
from ..workloads import Workload, load_workloads
from .args import (
    CLIUsageError,
    gib_list,
    index_option,
    int_arg,
    parse_capacity_tokens,
    parse_token_count,
    positive_int,
    token_count_text,
    utilization,
)

if TYPE_CHECKING:
    from ..sim.profile import CostProfile

__all__ = [
    "add_cache_flags",
    "add_common",
    "add_gpu_memory_utilization",
    "add_no_plots",
    "add_trace_flags",
    "backend_options",
    "capacities",
    "capacity_rule",
    "capacity_warnings",
    "load_workloads_for",
    "memory_utilization",
    "read_settings",
    "token_bars",
]

_HASH_ALGOS = ("xxh3_128", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "sha256_raw")
"""vLLM's --prefix-caching-hash-algo names (computed exactly as vLLM 0.33 does), plus
prefixkv's own encodings (xxh3_128, the default, and sha256_raw)."""
_EVICTION_POLICIES = ("lru", "lfu", "priority", "fifo")


def add_common(p: argparse.ArgumentParser) -> None:
    """The flags ``compare`` and ``replay`` share: the cache, K, the trace input, seed, quiet."""
    add_cache_flags(p)
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


def add_cache_flags(p: argparse.ArgumentParser) -> None:
    """Block and page size, capacity, hash algorithm, eviction, backend options."""
    g = p.add_argument_group("cache (named like the engines' flags)")
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
    _add_capacity_flags(g)
    g.add_argument(
        "--prefix-caching-hash-algo",
        choices=_HASH_ALGOS,
        metavar="ALGO",
        help="the hash chain's block hash: vLLM's sha256, sha256_cbor, xxhash, xxhash_cbor "
        "(bit-identical to vLLM 0.33's, for KV events a router can match), or prefixkv's "
        "own xxh3_128 (the default, fastest) or sha256_raw; hits are the same with any",
    )
    g.add_argument(
        "--radix-eviction-policy",
        choices=_EVICTION_POLICIES,
        metavar="POLICY",
        help=f"the radix tree's eviction, as SGLang's flag: {', '.join(_EVICTION_POLICIES)} "
        "(default lru)",
    )
    g.add_argument(
        "--index-option",
        type=index_option,
        action="append",
        default=[],
        metavar="BACKEND.KEY=VALUE",
        help="any backend option of make_index, e.g. hash_chain.verify=true, "
        "hash_chain.seed=0, radix.eviction=lfu (repeatable)",
    )


def _add_capacity_flags(g: argparse._ArgumentGroup) -> None:
    """The KV capacity, in tokens, GiB or blocks (one of them), and the memory share."""
    cap = g.add_mutually_exclusive_group()
    cap.add_argument(
        "--capacity-tokens",
        type=parse_capacity_tokens,
        metavar="T[,T...]|auto",
        help="KV capacity in tokens, the same for every backend (blocks = T // size); "
        "suffixes as vLLM's: 1k = 1,000, 1K = 1,024, 1m = 10**6, 1M = 2**20. Several "
        "(1m,3m,10m): compare's table uses the first and its sweep all of them. auto: what "
        "the cost profile's hardware holds at --gpu-memory-utilization (compare)",
    )
    cap.add_argument(
        "--capacity-gib",
        type=gib_list,
        metavar="G[,G...]",
        help="KV capacity in GiB of KV cache, turned into tokens by the cost profile's KV "
        "bytes per token (compare; --profile names the model)",
    )
    cap.add_argument(
        "--capacity-blocks",
        type=positive_int,
        metavar="N",
        help="KV capacity as N blocks of --block-size tokens (N * block size tokens)",
    )
    add_gpu_memory_utilization(g)


def add_gpu_memory_utilization(g: argparse._ArgumentGroup) -> None:
    """``--gpu-memory-utilization``, which ``--capacity-tokens auto`` reads."""
    g.add_argument(
        "--gpu-memory-utilization",
        type=utilization,
        metavar="U",
        help="with --capacity-tokens auto: the share of device memory the engine uses, as "
        f"vLLM's flag (default {DEFAULT_GPU_MEMORY_UTILIZATION:g})",
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
        help="kv-cache-tester conversations: interleaved by their time from each one's start, "
        "all starting together, as concurrent agents (default), or sequential, one after "
        "another (each finds its own blocks cached: optimistic for sizing)",
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
    t.add_argument(
        "--max-prompt-tokens",
        type=parse_token_count,
        default=TraceLimits().max_prompt_tokens,
        metavar="T",
        help="refuse a trace with a longer prompt "
        f"(default {token_count_text(TraceLimits().max_prompt_tokens)})",
    )
    t.add_argument(
        "--max-output-tokens",
        type=parse_token_count,
        default=TraceLimits().max_output_tokens,
        metavar="T",
        help="refuse a trace with a longer output "
        f"(default {token_count_text(TraceLimits().max_output_tokens)})",
    )
    t.add_argument(
        "--max-pool-blocks",
        type=parse_token_count,
        default=MAX_POOL_BLOCKS,
        metavar="N",
        help="refuse a capacity of more blocks than this, the pool being built up front "
        f"(default {token_count_text(MAX_POOL_BLOCKS)})",
    )


def backend_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    # An engine-named flag reaches every backend that takes its option.
    options: dict[str, dict[str, Any]] = {}
    flags = {
        "hash_algorithm": args.prefix_caching_hash_algo,
        "eviction": args.radix_eviction_policy,
    }
    for name in available_indexes():
        for option in index_options(name):
            if flags.get(option) is not None:
                options.setdefault(name, {})[option] = flags[option]
    for backend, key, value in args.index_option:
        options.setdefault(backend, {})[key] = value
    return options


def read_settings(args: argparse.Namespace) -> ReadSettings:
    limits = TraceLimits(
        max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens
    )
    timed = getattr(args, "time_scale", None) is not None  # the trace's own clock: in order
    return ReadSettings(
        vocab_size=args.vocab_size,
        seed=args.seed,
        limits=limits,
        sorted_arrivals=timed,
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
    """The capacities asked for, in tokens; ``None`` for the roomy default.

    ``--capacity-tokens auto`` and ``--capacity-gib`` need ``profile``'s hardware.

    Raises:
        CLIUsageError: ``auto`` or GiB without a profile, or with one that does not
            say its KV bytes per token (and, for ``auto``, its memory).
    """
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
    if args.capacity_blocks is not None:
        return [int(args.capacity_blocks) * int(args.block_size)]
    return None


def memory_utilization(args: argparse.Namespace) -> float:
    """``--gpu-memory-utilization``, or vLLM's default share."""
    value = getattr(args, "gpu_memory_utilization", None)
    return DEFAULT_GPU_MEMORY_UTILIZATION if value is None else float(value)


def capacity_warnings(
    caps: Sequence[int], profile: CostProfile, args: argparse.Namespace
) -> list[str]:
    """A line naming the capacities beyond what ``profile``'s hardware holds (none
    when it does not say, or when all fit)."""
    util = memory_utilization(args)
    held = profile.kv_capacity_tokens(util)
    over = sorted(c for c in caps if held and c > held)
    if not held or not over:
        return []
    listed = ", ".join(f"{c:,}" for c in over)
    return [
        f"capacity {listed} tokens: up to {over[-1] / held:.1f}x what {profile.name}'s "
        f"hardware holds ({held:,} tokens of KV at --gpu-memory-utilization {util:g}; "
        "--capacity-tokens auto gives that)"
    ]


def capacity_rule(args: argparse.Namespace, caps: Sequence[int] | None = None) -> str:
    if args.capacity_tokens == "auto" and caps:
        return (
            f"auto: {caps[0]:,} tokens, what the profile's hardware holds at "
            f"--gpu-memory-utilization {memory_utilization(args):g}"
        )
    if getattr(args, "capacity_gib", None) is not None and caps:
        gib = ", ".join(f"{g:g}" for g in args.capacity_gib)
        return f"{gib} GiB of KV = {', '.join(f'{c:,}' for c in caps)} tokens"
    if args.capacity_tokens is not None:
        caps = args.capacity_tokens
        text = f"{caps[0]:,} tokens for every backend"
        if len(caps) > 1:
            text += f"; sweep at {', '.join(f'{c:,}' for c in caps)} tokens"
        return text
    if args.capacity_blocks is not None:
        return (
            f"{args.capacity_blocks:,} blocks of {args.block_size} tokens = "
            f"{args.capacity_blocks * args.block_size:,} tokens for every backend"
        )
    return "roomy: every request's prompt and output plus two blocks, so nothing is evicted"


def token_bars(quiet: bool) -> Any:
    def make(desc: str, total: int) -> Progress:
        return progress(total, desc, quiet=quiet, unit="tok")

    return make
