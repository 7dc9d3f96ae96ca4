"""Every flag two or more ``prefixkv`` subcommands take, defined once: a function per flag
group, called by each subcommand that takes it. What a flag means to one subcommand only
(how many values, what it seeds or silences, its default) comes from the caller as a
keyword, so each subcommand's help speaks of itself alone. A flag ``None`` unless given
(``given_only``) says what unset means. Light: ``prefixkv replay`` imports it, never the
comparison or the simulator."""

from __future__ import annotations

import argparse

from prefixkv.indexes.eviction import EVICTION_POLICIES
from prefixkv.indexes.hashing import BLOCK_HASH_ALGORITHMS
from prefixkv.indexes.registry import available_indexes

from ..backends import MAX_POOL_BLOCKS
from ..sim.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS
from ..sim.model_config import available_model_configs
from ..sim.profile import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_PROFILE, available_profiles
from ..traces import FORMATS, TraceLimits
from ..traces.base import SESSION_ORDERS
from ..workloads import WORKLOADS, workload_names
from .args import (
    gib_list,
    index_option,
    int_arg,
    milliseconds,
    parse_capacity_tokens,
    parse_token_count,
    positive_float,
    positive_int,
    request_rates,
    token_count_text,
    utilization,
)

Group = argparse.ArgumentParser | argparse._ArgumentGroup
"""Where a flag goes: a parser, one of its groups or a mutually exclusive group."""


def _default(given_only: bool, unset: object) -> str:
    """The help's default: argparse's ``%(default)s``, or what ``unset`` says for a flag
    that stays ``None`` unless given."""
    return f"{unset}" if given_only else "%(default)s"


def add_trace(g: Group, *, positional: bool = False) -> None:
    """The trace to read: ``--trace PATH``, or replay's ``TRACE`` argument."""
    g.add_argument(
        "trace" if positional else "--trace",
        metavar="TRACE" if positional else "PATH",
        help="a trace: prefixkv, Mooncake or Qwen-Bailian JSONL (gzip or xz allowed), or "
        "kv-cache-tester conversations (a folder, a .json or a .tar.xz)",
    )


def add_workload(g: Group, *, many: bool = False, default: str | None = None) -> None:
    """``--workload``: ``many`` built-in workloads (also ``-w``), or one, ``default`` unless
    given."""
    if many:
        g.add_argument(
            "--workload",
            "-w",
            action="extend",
            nargs="+",
            metavar="NAME",
            help=f"built-in workloads, space- or comma-separated: {', '.join(workload_names())}",
        )
        return
    g.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default=default,
        help="a built-in workload when no trace is given (default %(default)s)",
    )


def add_index(
    g: Group, *, default: str | None = None, many: bool = False, per_replica: bool = False
) -> None:
    """``--index`` (required when ``default`` is ``None``): one prefix index, ``many`` run
    head to head, or the one index of every replica (by name: ``--block-size`` sizes it)."""
    size = "NAME or NAME:SIZE (SIZE: its block or page size in tokens)"
    if many:
        what = f"the prefix indexes to run head to head, comma-separated, each {size}"
    elif per_replica:
        what = "every replica's prefix index, a NAME (--block-size sets its block size)"
    else:
        what = f"the prefix index, {size}"
    g.add_argument(
        "--index",
        default=default,
        required=default is None,
        metavar="LIST" if many else "NAME",
        help=f"{what}; known: {', '.join(available_indexes())}"
        + ("" if default is None else "; default %(default)s"),
    )


def add_common(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    """The flags ``compare`` and ``replay`` share: the cache, K and the trace input. ``many``:
    several backends at one capacity, which may also be several (swept, the table using the
    first), ``auto`` or in GiB, sized by the cost profile; else one value in tokens or
    blocks."""
    g = p.add_argument_group("cache (named like the engines' flags)")
    add_block_size(g, of="the hash chain and none (the radix tree takes --page-size)")
    g.add_argument(
        "--page-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="the radix tree's page size in tokens, as SGLang's --page-size (default %(default)s)",
    )
    cap = g.add_mutually_exclusive_group()
    add_capacity_tokens(
        cap,
        per=", the same for every backend" if many else "",
        sweep="the table using the first" if many else None,
        default="roomy, nothing evicted",
    )
    if many:
        cap.add_argument(
            "--capacity-gib",
            type=gib_list,
            metavar="G[,G...]",
            help="KV capacity in GiB of KV cache, turned into tokens by the cost profile's KV "
            "bytes per token (--profile names the model)",
        )
    cap.add_argument(
        "--capacity-blocks",
        type=positive_int,
        metavar="N",
        help="KV capacity as N blocks of --block-size tokens (N * block size tokens)",
    )
    if many:
        add_gpu_memory_utilization(g)
    _add_index_options(g)
    p.add_argument(
        "--concurrency",
        "-k",
        type=positive_int,
        default=1,
        metavar="K",
        help="at most K live requests; the oldest finishes first (default %(default)s)",
    )
    add_trace_flags(p)


def _add_index_options(g: Group) -> None:
    """The engine-named index options, then any other through ``--index-option``."""
    g.add_argument(
        "--prefix-caching-hash-algo",
        choices=BLOCK_HASH_ALGORITHMS,
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


def add_block_size(g: Group, *, of: str, given_only: bool = False) -> None:
    """``--block-size`` of the indexes ``of`` names; ``given_only``: ``None`` unless given,
    then a hash-id trace's tokens per id."""
    unset = f"a hash-id trace's tokens per id, else {DEFAULT_BLOCK_SIZE}"
    g.add_argument(
        "--block-size",
        type=positive_int,
        default=None if given_only else DEFAULT_BLOCK_SIZE,
        metavar="N",
        help=f"tokens per block of {of}, as vLLM's --block-size (default "
        f"{_default(given_only, unset)})",
    )


def add_capacity_tokens(g: Group, *, per: str = "", sweep: str | None = None, default: str) -> None:
    """``--capacity-tokens`` (``per``: whose pool). With ``sweep`` (what else several values
    do), several values or ``auto``; without, one value."""
    text = (
        f"KV capacity in tokens{per} (blocks = T // size); suffixes as vLLM's: 1k = 1,000, "
        "1K = 1,024, 1m = 10**6, 1M = 2**20"
    )
    if sweep is not None:
        text += (
            f"; several (1m,3m,10m) are swept, {sweep}; auto: the pool vLLM sizes at "
            "--gpu-memory-utilization on the cost profile's hardware, or on --model-config "
            "and --gpu-memory"
        )
    g.add_argument(
        "--capacity-tokens",
        type=parse_capacity_tokens,
        metavar="T" if sweep is None else "T[,T...]|auto",
        help=f"{text} (default {default})",
    )


def add_gpu_memory_utilization(g: Group) -> None:
    """``--gpu-memory-utilization``, which ``--capacity-tokens auto`` reads."""
    g.add_argument(
        "--gpu-memory-utilization",
        type=utilization,
        metavar="U",
        help="with --capacity-tokens auto: the share of device memory the engine uses, as vLLM's "
        f"flag (default {DEFAULT_GPU_MEMORY_UTILIZATION:g})",
    )


def add_seed(g: Group, *, seeds: str) -> None:
    """``--seed`` of the random choices ``seeds`` names."""
    g.add_argument(
        "--seed", type=int_arg, default=0, help=f"the seed of {seeds} (default %(default)s)"
    )


def add_quiet(g: Group, *, also: str = "") -> None:
    """``--quiet``: no progress bars, and ``also`` what else it silences."""
    g.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help=f"no progress bars{also} (warnings and errors still print)",
    )


def add_out(g: Group, *, folder: str = "", file: str = "", required: bool = True) -> None:
    """``--out``: the report's ``folder`` (its default name), or the one ``file`` (what it
    holds) a run writes."""
    if folder:
        g.add_argument(
            "--out",
            "-o",
            default=folder,
            metavar="DIR",
            help="the output folder: the report, its tables and plots (default ./%(default)s)",
        )
        return
    g.add_argument(
        "--out", "-o", required=required, metavar="FILE", help=f"the output file: {file}"
    )


def add_no_plots(g: Group) -> None:
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


def add_rate_flags(
    g: Group, *, runs: str = "", spacing: str, sweep: str, auto: str, default: str = ""
) -> None:
    """``--request-rate`` or ``--time-scale``: when requests arrive (one of them). The caller
    says what a rate ``runs``, the ``spacing``, what several rates do (``sweep``), what
    ``auto`` doubles until, and what runs when neither is given (``default``)."""
    runs = f"{runs}: " if runs else ""
    when = g.add_mutually_exclusive_group()
    when.add_argument(
        "--request-rate",
        type=request_rates,
        metavar="R[,R...]|auto",
        help=f"{runs}requests arrive at R per second ({spacing}), as vllm bench serve "
        f"--request-rate; several (1,2,4,8) {sweep}; auto starts where {auto} (at most 10 "
        f"rates{f'; default {default}' if default else ''})",
    )
    when.add_argument(
        "--time-scale",
        type=positive_float,
        metavar="S",
        help=f"{runs}requests arrive at the trace's own timestamps times S (S < 1: faster, "
        "more load)",
    )


def add_engine_limits(g: Group, *, given_only: bool = False) -> None:
    """An engine step's limits; ``given_only``: ``None`` unless given."""
    g.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=None if given_only else DEFAULT_MAX_NUM_SEQS,
        metavar="N",
        help="most running requests, as vLLM's flag (SGLang --max-running-requests; "
        f"default {_default(given_only, DEFAULT_MAX_NUM_SEQS)})",
    )
    add_max_num_batched_tokens(g, given_only=given_only)


def add_max_num_batched_tokens(g: Group, *, given_only: bool = False, served: bool = False) -> None:
    """``--max-num-batched-tokens``: an engine step's token budget; ``served``: the budget
    a served engine was started with, not the simulated one's."""
    g.add_argument(
        "--max-num-batched-tokens",
        type=parse_token_count,
        default=None if given_only else DEFAULT_MAX_NUM_BATCHED_TOKENS,
        metavar="T",
        help="most tokens one step computes, as vLLM's flag (SGLang --chunked-prefill-size; "
        f"default {_default(given_only, DEFAULT_MAX_NUM_BATCHED_TOKENS)})"
        + (": the server's, as it was started (vLLM serve on a CPU: 2048)" if served else ""),
    )


def add_profile(g: Group, *, sizes: str, given_only: bool = False) -> None:
    """``--profile``: the cost profile, whose hardware also ``sizes`` what the caller says;
    ``given_only``: ``None`` unless given."""
    g.add_argument(
        "--profile",
        default=None if given_only else DEFAULT_PROFILE,
        metavar="NAME|FILE",
        help=f"the cost profile that times each engine step: a shipped one "
        f"({', '.join(available_profiles())}; prefixkv calibrate --list) or a file from prefixkv "
        f"calibrate (default {_default(given_only, DEFAULT_PROFILE)}); its hardware also sizes "
        f"{sizes}",
    )


def add_open_loop(g: Group, *, given_only: bool = False) -> None:
    """``--open-loop``: sessions' turns at their arrival times, not after each answer."""
    g.add_argument(
        "--open-loop",
        action="store_true",
        default=None if given_only else False,
        help="send every request at its own arrival time, even a session's next turn before "
        "the previous one finished (default: sessions replay closed loop, each turn after the "
        "previous answer plus its think time, as kv-cache-tester and AIPerf do)",
    )


def add_slo_flags(g: Group) -> None:
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
    _add_length_flags(g)


def _add_length_flags(g: Group) -> None:
    """The non-KV memory and the longest request, and what a longer one gets."""
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
