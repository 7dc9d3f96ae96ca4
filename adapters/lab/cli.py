"""The ``prefixkv`` command line: ``compare`` backends head to head, ``replay`` one trace,
``calibrate`` a cost profile.

``compare`` with ``--request-rate`` or ``--time-scale`` also runs each backend at arrival
time on its natural engine and reports TTFT, queueing and GPU time. ``replay`` writes
the per-request hit file the vLLM and SGLang reference oracles write, so the two diff
request by request. ``calibrate`` times the reference engine and writes a cost profile
``compare --profile`` reads. Traces stream: memory is the cache and the live
requests, never the trace. Sizes are real tokens with vLLM's suffixes (``1k`` = 1,000,
``1K`` = 1,024). Errors are one line on stderr and exit status 2; Ctrl-C writes what
is finished, marked partial, and exits 130; every file is written atomically.
``replay --kv-events`` also writes (or publishes over ZeroMQ) the index's KV events,
one batch per scheduler step, in vLLM 0.33's wire format.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.registry import available_indexes, index_options

from ..events import EventFileWriter, KVEventBatch, ZmqEventPublisher
from ..events.wire import EventBatch, KVEvent
from . import report
from .cluster.cli import add_cluster_parser, run_cluster_command
from .compare import (
    MAX_POOL_BLOCKS,
    BackendSpec,
    CompareError,
    WorkloadResult,
    check_pool,
    parse_backends,
    roomy_capacity,
)
from .comparison import (
    CompareOptions,
    default_boundary_accounting,
    plan_comparison,
    run_comparison,
)
from .progress import Progress, progress
from .replay import DRIVERS, HitRow, ReplayError, ReplayInterrupted, ReplayResult, replay
from .sim import (
    ARRIVAL_PROCESSES,
    BATCHING_MODES,
    DEFAULT_PROFILE,
    POLICIES,
    available_profiles,
    load_profile,
    save_profile,
)
from .sources import DEFAULT_WORKLOADS, Workload, load_workloads, workload_names
from .timed import TimeSettings
from .traces import (
    FORMATS,
    ReadOptions,
    TraceLimits,
    atomic_writer,
    refuse_overwrite,
)

__all__ = ["CLIUsageError", "build_parser", "main", "parse_token_count", "parse_token_counts"]

EXIT_ERROR = 2
EXIT_INTERNAL = 1
EXIT_INTERRUPTED = 130
MAX_TOKEN_COUNT = 2**48
"""No size flag takes more (281 trillion tokens): beyond it a value is a typo."""

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_HASH_ALGOS = ("xxh3_128", "sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "sha256_raw")
"""vLLM's --prefix-caching-hash-algo names (computed exactly as vLLM 0.33 does), plus
prefixkv's own encodings (xxh3_128, the default, and sha256_raw)."""
_EVICTION_POLICIES = ("lru", "lfu", "priority", "fifo")


class CLIUsageError(PrefixKVError):
    """A command-line argument is missing, malformed or out of range."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting: errors stay one line."""

    def error(self, message: str) -> NoReturn:
        raise CLIUsageError(f"{message} (see {self.prog} --help)")


def parse_token_count(text: str) -> int:
    """A token count as vLLM's size flags read it: ``1000``, ``1k`` (1,000), ``25.6k``,
    ``1K`` (1,024), ``1M`` (1,048,576), ``2m`` (2,000,000); ``_`` separators allowed.

    Raises:
        argparse.ArgumentTypeError: not such a number, not positive, or over 2**48.
    """
    value = text.strip().replace("_", "")
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)", value)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"want a positive token count like 65536, 512K or 1m, got {text!r}"
        )
    number, suffix = m.groups()
    if suffix in _BINARY:
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"decimals are not allowed with binary suffixes like {suffix} "
                f"(did you mean {number}{suffix.lower()}?), got {text!r}"
            )
        count = int(number) * _BINARY[suffix]
    elif suffix:
        count = int(float(number) * _DECIMAL[suffix])
    elif "." in number:
        raise argparse.ArgumentTypeError(f"a token count is whole, got {text!r}")
    else:
        count = int(number)
    if not 1 <= count <= MAX_TOKEN_COUNT:
        raise argparse.ArgumentTypeError(
            f"want a token count from 1 to 2**48, got {text!r} = {count:,}"
        )
    return count


def parse_token_counts(text: str) -> list[int]:
    """A comma-separated list of token counts (``1M,3M,10M``), each as
    :func:`parse_token_count` reads it, duplicates refused."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"want one or more token counts, got {text!r}")
    counts = [parse_token_count(p) for p in parts]
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"a capacity is listed twice in {text!r}")
    return counts


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if not 1 <= value <= MAX_TOKEN_COUNT:
        raise argparse.ArgumentTypeError(f"must be a positive int up to 2**48, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, got {text!r}") from None
    if abs(value) > 2**63:
        raise argparse.ArgumentTypeError(f"must be an int within 2**63, got {text!r}")
    return value


def _option(text: str) -> tuple[str, str, Any]:
    """``BACKEND.KEY=VALUE`` -> ``(backend, key, value)``; true/false/ints are typed."""
    m = re.fullmatch(r"([A-Za-z0-9_]+)\.([A-Za-z_][A-Za-z0-9_]*)=(.*)", text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"want BACKEND.KEY=VALUE (e.g. hash_chain.verify=true), got {text!r}"
        )
    backend, key, raw = m.groups()
    value: Any = raw
    if raw.lower() in ("true", "false"):
        value = raw.lower() == "true"
    elif re.fullmatch(r"-?\d{1,18}", raw):
        value = int(raw)
    return backend, key, value


def _version() -> str:
    try:
        return metadata.version("prefixkv")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def _add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cache (named like the engines' flags)")
    g.add_argument(
        "--block-size",
        type=_positive_int,
        default=16,
        metavar="N",
        help="tokens per block for the hash chain and none, as vLLM's --block-size (default 16)",
    )
    g.add_argument(
        "--page-size",
        type=_positive_int,
        default=1,
        metavar="N",
        help="the radix tree's page size in tokens, as SGLang's --page-size (default 1)",
    )
    cap = g.add_mutually_exclusive_group()
    cap.add_argument(
        "--capacity-tokens",
        type=parse_token_counts,
        metavar="T[,T...]",
        help="KV capacity in tokens, the same for every backend (blocks = T // size); "
        "suffixes as vLLM's: 1k = 1,000, 1K = 1,024, 1m = 10**6, 1M = 2**20. Several "
        "(1m,3m,10m): compare's table uses the first and its sweep all of them",
    )
    cap.add_argument(
        "--capacity-blocks",
        type=_positive_int,
        metavar="N",
        help="KV capacity as N blocks of --block-size tokens (N * block size tokens)",
    )
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
        type=_option,
        action="append",
        default=[],
        metavar="BACKEND.KEY=VALUE",
        help="any backend option of make_index, e.g. hash_chain.verify=true, "
        "hash_chain.seed=0, radix.eviction=lfu (repeatable)",
    )
    p.add_argument(
        "--concurrency",
        "-k",
        type=_positive_int,
        default=1,
        metavar="K",
        help="at most K live requests; the oldest finishes first (default 1)",
    )
    t = p.add_argument_group("trace input")
    t.add_argument(
        "--trace-format",
        choices=FORMATS,
        help="the trace's format (default: detected from its shape and first record)",
    )
    t.add_argument(
        "--max-requests", type=_positive_int, metavar="N", help="use only the first N requests"
    )
    t.add_argument(
        "--tokens-per-id",
        type=_positive_int,
        metavar="S",
        help="hash-id traces: tokens each hash id expands to, keeping the sharing pattern "
        "(default: the format's own: Mooncake 512, Qwen-Bailian 16, kv-cache-tester 64)",
    )
    t.add_argument(
        "--scale-block", dest="tokens_per_id", type=_positive_int, help=argparse.SUPPRESS
    )
    t.add_argument(
        "--vocab-size",
        type=_positive_int,
        default=32000,
        metavar="V",
        help="hash-id traces: token ids are drawn from [1, V) (default 32000)",
    )
    t.add_argument(
        "--max-prompt-tokens",
        type=parse_token_count,
        default=TraceLimits().max_prompt_tokens,
        metavar="T",
        help="refuse a trace with a longer prompt (default 2M = 2,097,152)",
    )
    t.add_argument(
        "--max-output-tokens",
        type=parse_token_count,
        default=TraceLimits().max_output_tokens,
        metavar="T",
        help="refuse a trace with a longer output (default 128K = 131,072)",
    )
    t.add_argument(
        "--max-pool-blocks",
        type=parse_token_count,
        default=MAX_POOL_BLOCKS,
        metavar="N",
        help="refuse a capacity of more blocks than this, the pool being built up front "
        "(default 16M = 16,777,216)",
    )
    p.add_argument(
        "--seed", type=_int, default=0, help="workload seed and hash-id token seed (default 0)"
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    """The ``prefixkv`` argument parser with its subcommands (compare, replay, calibrate)."""
    parser = _Parser(prog="prefixkv", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"prefixkv {_version()}")
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )
    cmp = sub.add_parser(
        "compare",
        help="run backends head to head; write tables, report.md, results.json and plots",
        description="Replay workloads (or a trace) through each backend at equal capacity, "
        "print a table per workload and write a report. Default: the built-in set "
        f"{', '.join(DEFAULT_WORKLOADS)} with a capacity sweep.",
    )
    src = cmp.add_mutually_exclusive_group()
    src.add_argument(
        "--workload",
        "-w",
        action="extend",
        nargs="+",
        metavar="NAME",
        help=f"built-in workloads (several allowed): {', '.join(workload_names())}",
    )
    src.add_argument(
        "--trace",
        metavar="PATH",
        help="a trace: prefixkv or Mooncake/Qwen-Bailian JSONL (gzip allowed), or "
        "kv-cache-tester conversations (a folder, a .json or a .tar.xz)",
    )
    cmp.add_argument(
        "--indexes",
        default="hash_chain,radix,none",
        metavar="LIST",
        help="comma-separated backends, NAME or NAME:SIZE "
        f"(default hash_chain,radix,none; known: {', '.join(available_indexes())})",
    )
    _add_common(cmp)
    cmp.add_argument(
        "--capacity-sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also replay at 7 capacities from tight to roomy and plot hit ratio "
        "vs capacity (default: on for the built-in set, off otherwise)",
    )
    cmp.add_argument(
        "--timing-repeats",
        type=lambda t: _positive_int(t) if t != "0" else 0,
        default=None,
        metavar="R",
        help="timed replays per backend; each request's index time is its minimum over "
        "them; 0 times the accounting replay itself (default 3, 1 for a trace)",
    )
    cmp.add_argument(
        "--boundary-accounting",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay once more with the token-level mirror that counts matched-but-"
        "recomputed tokens (SPEC BB-8) (default: on, but off for hash-id traces, whose "
        "sharing stops at block boundaries by construction)",
    )
    _add_time(cmp)
    cmp.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib)")
    cmp.add_argument(
        "--out",
        "-o",
        default="prefixkv-report",
        metavar="DIR",
        help="output folder (default ./prefixkv-report)",
    )
    rep = sub.add_parser(
        "replay",
        help="replay one trace through one backend; write per-request hits (oracle format)",
        description="Replay TRACE through one backend and write one {id, prompt_len, "
        "hit_tokens} line per request and a final {summary} line, as the vLLM and SGLang "
        "reference oracles do. Default capacity: roomy (no eviction). vLLM's oracle "
        "--num-blocks N matches --capacity-blocks N-1 (its block 0 is the null block).",
    )
    rep.add_argument("trace", metavar="TRACE", help="a trace (any format compare --trace reads)")
    rep.add_argument(
        "--index",
        required=True,
        metavar="NAME",
        help=f"the backend: {', '.join(available_indexes())}",
    )
    rep.add_argument(
        "--driver",
        choices=DRIVERS,
        help="call order: vllm, sglang or manager (default: the backend's own)",
    )
    _add_common(rep)
    rep.add_argument("--out", "-o", required=True, metavar="FILE", help="result JSONL")
    ev = rep.add_argument_group("KV events (vLLM 0.33's wire format)")
    ev.add_argument(
        "--kv-events",
        metavar="FILE|ENDPOINT",
        help="write the index's KV events to FILE, one batch per scheduler step as one "
        "msgspec-JSON line (vLLM's KVEventBatch), or publish them on a ZeroMQ PUB socket "
        "at a tcp:// or ipc:// ENDPOINT as vLLM's ZmqEventPublisher does (tcp://*:5557 "
        "binds; a host name connects)",
    )
    ev.add_argument(
        "--kv-events-replay",
        metavar="ENDPOINT",
        help="with an ENDPOINT: also bind a ROUTER socket here that answers replay "
        "requests (vLLM's replay_endpoint), so late subscribers catch up",
    )
    ev.add_argument(
        "--kv-events-topic",
        default="",
        metavar="TOPIC",
        help="with an ENDPOINT: the topic frame of every message (default empty)",
    )
    cal = sub.add_parser(
        "calibrate",
        help="time the reference engine on this machine and write a cost profile",
        description="Run the reference engine's forward pass on prefill, decode and mixed "
        "step shapes, time each (the least of --repeats runs), fit the cost model's five "
        "coefficients and write them as a profile that compare --profile FILE reads.",
    )
    cal.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where to run (default: cuda when available, else cpu)",
    )
    cal.add_argument(
        "--dtype", choices=("float32", "float64"), default="float32", help="(default float32)"
    )
    m = cal.add_argument_group("the reference engine's model (its weights are random)")
    m.add_argument(
        "--num-layers", type=_positive_int, default=2, metavar="N", help="layers (default 2)"
    )
    m.add_argument(
        "--num-heads",
        type=_positive_int,
        default=4,
        metavar="N",
        help="attention heads, as many KV heads (default 4)",
    )
    m.add_argument(
        "--head-dim", type=_positive_int, default=32, metavar="N", help="even (default 32)"
    )
    cal.add_argument(
        "--repeats",
        type=_positive_int,
        default=5,
        metavar="R",
        help="timed runs per shape (the least is kept; default 5)",
    )
    cal.add_argument(
        "--quick",
        action="store_true",
        help="8 small shapes instead of 22: a rough profile in seconds",
    )
    cal.add_argument("--name", metavar="NAME", help="the profile's name (default from the device)")
    cal.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    cal.add_argument("--out", "-o", required=True, metavar="FILE", help="the profile (JSON)")
    add_cluster_parser(sub)
    return parser


def _add_time(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "arrival time (TTFT, queueing, GPU time): give --request-rate or --time-scale"
    )
    when = g.add_mutually_exclusive_group()
    when.add_argument(
        "--request-rate",
        type=_positive_float,
        metavar="R",
        help="also run each backend at arrival time, requests arriving at R per second "
        "(as vllm bench serve --request-rate)",
    )
    when.add_argument(
        "--time-scale",
        type=_positive_float,
        metavar="S",
        help="also run each backend at arrival time, at the trace's own timestamps times S "
        "(S < 1: faster, more load)",
    )
    g.add_argument(
        "--arrival",
        choices=ARRIVAL_PROCESSES,
        help="with --request-rate: poisson (seeded by --seed; the default) or fixed spacing",
    )
    g.add_argument(
        "--max-num-seqs",
        type=_positive_int,
        metavar="N",
        help="most running requests, as vLLM's flag (SGLang --max-running-requests; default 256)",
    )
    g.add_argument(
        "--max-num-batched-tokens",
        type=parse_token_count,
        metavar="T",
        help="most tokens one step computes, as vLLM's flag (SGLang --chunked-prefill-size; "
        "default 8192)",
    )
    g.add_argument(
        "--policy",
        choices=POLICIES,
        help="waiting-queue order for every backend: fcfs, or SGLang's cache-aware lpm "
        "(default: fcfs, both engines' default)",
    )
    g.add_argument(
        "--batching",
        choices=BATCHING_MODES,
        help="force one engine for every backend: mixed (vLLM: prefill chunks and decodes "
        "in one step) or prefill_first (SGLang). Default: each backend's natural engine, "
        "hash chain and none as vLLM, radix as SGLang",
    )
    g.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help=f"the step cost profile: a shipped one ({', '.join(available_profiles())}) or a "
        f"file from prefixkv calibrate (default {DEFAULT_PROFILE})",
    )


_ZMQ_SCHEMES = ("tcp://", "ipc://")


class _EventPublisher:
    """What the replay hands each step's batch to: a file writer or a ZeroMQ publisher."""

    def __init__(self, target: EventFileWriter | ZmqEventPublisher) -> None:
        self.target = target
        self.num_batches = 0

    def publish(self, batch: EventBatch) -> None:
        self.target.publish(batch)
        self.num_batches += 1


@contextlib.contextmanager
def _kv_event_stream(args: argparse.Namespace) -> Iterator[_EventPublisher | None]:
    target: str | None = args.kv_events
    if target is None:
        if args.kv_events_replay is not None:
            raise CLIUsageError("--kv-events-replay needs --kv-events ENDPOINT")
        yield None
        return
    if target.startswith(_ZMQ_SCHEMES):
        pub = ZmqEventPublisher(
            endpoint=target, replay_endpoint=args.kv_events_replay, topic=args.kv_events_topic
        )
        try:
            yield _EventPublisher(pub)
        finally:
            pub.shutdown()
        return
    if args.kv_events_replay is not None:
        raise CLIUsageError(
            "--kv-events-replay needs --kv-events to be a tcp:// or ipc:// endpoint"
        )
    with atomic_writer(target) as f:
        writer = EventFileWriter(f)
        yield _EventPublisher(writer)
        writer.shutdown()


def _index_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
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


def _read_options(args: argparse.Namespace) -> ReadOptions:
    limits = TraceLimits(
        max_prompt_tokens=args.max_prompt_tokens, max_output_tokens=args.max_output_tokens
    )
    timed = getattr(args, "time_scale", None) is not None  # the trace's own clock: in order
    return ReadOptions(
        vocab_size=args.vocab_size, seed=args.seed, limits=limits, sorted_arrivals=timed
    )


def _load_workloads(args: argparse.Namespace, names: list[str] | None) -> list[Workload]:
    """The named built-in workloads, or the trace, as the trace-input flags shape them."""
    return load_workloads(
        names,
        args.trace,
        max_requests=args.max_requests,
        tokens_per_id=args.tokens_per_id,
        seed=args.seed,
        trace_format=args.trace_format,
        options=_read_options(args),
        quiet=args.quiet,
    )


def _capacities(args: argparse.Namespace) -> list[int] | None:
    """The capacities asked for, in tokens; ``None`` for the roomy default."""
    if args.capacity_tokens is not None:
        return list(args.capacity_tokens)
    if args.capacity_blocks is not None:
        return [int(args.capacity_blocks) * int(args.block_size)]
    return None


def _capacity_rule(args: argparse.Namespace) -> str:
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


def _bars(quiet: bool) -> Any:
    def make(desc: str, total: int) -> Progress:
        return progress(total, desc, quiet=quiet, unit="tok")

    return make


_TIME_KNOBS = (
    "arrival", "max_num_seqs", "max_num_batched_tokens", "policy", "batching", "profile",
)  # fmt: skip


def _time_settings(args: argparse.Namespace) -> TimeSettings | None:
    if args.request_rate is None and args.time_scale is None:
        given = [k for k in _TIME_KNOBS if getattr(args, k) is not None]
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise CLIUsageError(f"{flags} need --request-rate or --time-scale")
        return None
    if args.arrival is not None and args.request_rate is None:
        raise CLIUsageError("--arrival goes with --request-rate (--time-scale keeps the trace's)")
    return TimeSettings(
        request_rate=args.request_rate,
        time_scale=args.time_scale,
        arrival=args.arrival or "poisson",
        seed=args.seed,
        max_num_seqs=args.max_num_seqs or 256,
        max_num_batched_tokens=args.max_num_batched_tokens or 8192,
        policy=args.policy,
        batching=args.batching,
        profile=load_profile(args.profile or DEFAULT_PROFILE),
    )


def _run_compare(args: argparse.Namespace, argv: Sequence[str]) -> int:
    t0 = time.perf_counter()
    backends = parse_backends(
        args.indexes,
        block_size=args.block_size,
        page_size=args.page_size,
        options=_index_options(args),
    )
    settings = _time_settings(args)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIUsageError(f"--out {out} is a file; compare writes a folder")
    if args.trace is not None:
        outputs = ["results.json", "report.md"]
        outputs += [f"{t}.{f}" for t in ("requests", "runs") for f in ("csv", "parquet")]
        refuse_overwrite([out / name for name in outputs], [args.trace])
    names = [n for part in args.workload or [] for n in part.split(",") if n]
    caps = _capacities(args)
    listed = caps is not None and len(caps) > 1
    sweep = args.capacity_sweep
    if sweep is None:
        sweep = listed or (not args.workload and args.trace is None)
    workloads = _load_workloads(args, names or None)
    repeats = args.timing_repeats
    if repeats is None:
        repeats = 1 if args.trace is not None else 3
    if args.boundary_accounting is None:
        args.boundary_accounting = default_boundary_accounting(workloads)
    options = CompareOptions(
        backends=tuple(backends),
        capacities=None if caps is None else tuple(caps),
        capacity_sweep=bool(sweep),
        concurrency=args.concurrency,
        timing_repeats=repeats,
        boundary_accounting=args.boundary_accounting,
        time=settings,
        max_pool_blocks=args.max_pool_blocks,
    )
    plans = plan_comparison(workloads, options)
    comparison = run_comparison(plans, options, bars=_bars(args.quiet))
    interrupted = comparison.partial
    results = comparison.workloads
    for r in results:
        print(report.workload_title(r))
        if r.backends:
            print(report.text_table(report.table_rows(r.backends)))
        for note in r.notes:
            print(f"note: {note}")
        timed = r.timed_at_table()
        if timed:
            print()
            print(report.time_title(r))
            print(report.text_table(report.time_rows(timed), report.TIME_COLUMNS))
        print()
    meta: dict[str, Any] = {
        "config": _compare_config(args, argv, backends, bool(sweep), repeats, settings),
        "machine": report.machine_info(),
        "versions": report.package_versions(),
        "partial": interrupted,
        "plots": {},
        "tables": {},
    }
    if results:
        try:
            report.write_tables(results, out, meta["tables"])
        except KeyboardInterrupt:  # each table is whole or absent; the finished are listed
            interrupted = meta["partial"] = True
    if not interrupted and not args.no_plots and results:
        try:
            meta["plots"] = _plots(results, out, args.quiet)
        except KeyboardInterrupt:
            interrupted = meta["partial"] = True
    meta["elapsed_seconds"] = time.perf_counter() - t0
    report.write_results(out / "results.json", report.results_document(results, meta))
    report.write_report(out / "report.md", results, meta)
    what = "partial results (interrupted)" if interrupted else "the results"
    files = [out / "report.md", out / "results.json", *(out / f for f in meta["tables"].values())]
    print(
        f"wrote {what} to {', '.join(str(f) for f in files)}"
        + (" and the plots" if meta["plots"] else "")
    )
    return EXIT_INTERRUPTED if interrupted else 0


def _compare_config(
    args: argparse.Namespace,
    argv: Sequence[str],
    backends: Sequence[BackendSpec],
    sweep: bool,
    repeats: int,
    settings: TimeSettings | None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "command": shlex.join(["prefixkv", *argv]),
        "backends": ",".join(b.label for b in backends),
        "backends_described": [b.describe() for b in backends],
        "workloads": ",".join(args.workload) if args.workload else None,
        "trace": args.trace,
        "trace_format": args.trace_format,
        "capacity_tokens": None
        if args.capacity_tokens is None
        else ",".join(str(c) for c in args.capacity_tokens),
        "capacity_blocks": args.capacity_blocks,
        "capacity_rule": _capacity_rule(args),
        "capacity_sweep": sweep,
        "concurrency": args.concurrency,
        "max_requests": args.max_requests,
        "tokens_per_id": args.tokens_per_id,
        "seed": args.seed,
        "timing_repeats": repeats,
        "boundary_accounting": args.boundary_accounting,
        "timing": (
            f"hits and accounting from a replay with boundary accounting; index times from "
            f"{repeats} more without it (garbage collected between requests only), each "
            "request's time the minimum over those"
            if repeats
            else "hits, accounting and index times from one replay (times include the "
            "accounting's own cost)"
        ),
    }
    if settings is not None:
        prof = settings.profile
        config.update(
            {
                **settings.row(),
                "engines": [settings.describe_engine(b) for b in backends],
                "max_num_seqs": settings.max_num_seqs,
                "max_num_batched_tokens": settings.max_num_batched_tokens,
                "policy": settings.policy,
                "batching": settings.batching,
                "profile_model": prof.model,
                "profile_device": prof.device,
                "profile_source": prof.source,
            }
        )
    return config


def _plots(results: list[WorkloadResult], out: Path, quiet: bool) -> dict[str, str]:
    try:
        from . import plots  # matplotlib only now, and only if plots are wanted
    except ImportError:  # pragma: no cover - plots itself imports nothing optional
        return {}
    bar = progress(plots.num_plots(results), "plots", quiet=quiet, unit="plot")
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".plots-", dir=out))
    try:
        written = plots.write_plots(results, staging, tick=bar.update)
        for f in staging.iterdir():  # each plot appears whole or not at all
            os.replace(f, out / f.name)
        return written
    except ImportError:
        print(
            "prefixkv: plots skipped: matplotlib is not installed (pip install 'prefixkv[report]')",
            file=sys.stderr,
        )
        return {}
    finally:
        bar.close()
        shutil.rmtree(staging, ignore_errors=True)


def _run_calibrate(args: argparse.Namespace) -> int:
    import torch  # only calibrate needs torch here

    from prefixkv.adapters.engine import EngineConfig, ModelConfig

    from .sim.calibrate import (
        DEFAULT_DECODE_SHAPES,
        DEFAULT_MIXED_SHAPES,
        DEFAULT_PREFILL_SHAPES,
        QUICK_SHAPES,
        calibrate,
    )

    out = Path(args.out)
    if out.is_dir():
        raise CLIUsageError(f"--out {out} is a folder; calibrate writes a file")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = ModelConfig(
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_heads,
        head_dim=args.head_dim,
    )
    config = EngineConfig(model=model, dtype=args.dtype, device=device)
    shapes: dict[str, Any] = dict(QUICK_SHAPES) if args.quick else {}
    num_shapes = sum(
        len(shapes.get(k, default))
        for k, default in (
            ("prefill", DEFAULT_PREFILL_SHAPES),
            ("decode", DEFAULT_DECODE_SHAPES),
            ("mixed", DEFAULT_MIXED_SHAPES),
        )
    )
    bar = progress((1 + args.repeats) * num_shapes, f"calibrate on {device}", quiet=args.quiet,
                   unit="run")  # fmt: skip
    try:
        profile = calibrate(
            config, name=args.name, repeats=args.repeats, progress=bar.update, **shapes
        )
    finally:
        bar.close()
    save_profile(profile, out)
    fit = profile.fit
    print(
        f"{profile.name}: {profile.device}; fit over {fit['num_samples']} step shapes, "
        f"relative error p50 {fit['relative_error_p50']:.1%}, max {fit['relative_error_max']:.1%}"
        f" -> {out}"
    )
    return 0


def _run_replay(args: argparse.Namespace, argv: Sequence[str]) -> int:
    specs = parse_backends(
        args.index,
        block_size=args.block_size,
        page_size=args.page_size,
        driver=args.driver,
        options=_index_options(args),
    )
    if len(specs) != 1:
        raise CompareError(f"replay takes one backend, got {args.index!r}")
    spec = specs[0]
    caps = _capacities(args)
    if caps is not None and len(caps) > 1:
        raise CLIUsageError("replay takes one capacity; give several to compare for a sweep")
    out = Path(args.out)
    outputs = [out]
    events_file = args.kv_events is not None and not args.kv_events.startswith(_ZMQ_SCHEMES)
    if events_file:
        if Path(args.kv_events).resolve() == out.resolve():
            raise CLIUsageError("--kv-events and --out name the same file; give two")
        outputs.append(Path(args.kv_events))
    refuse_overwrite(outputs, [args.trace])
    t_load = time.perf_counter()
    (workload,) = _load_workloads(args, None)
    load_seconds = time.perf_counter() - t_load
    capacity = roomy_capacity(workload.stats, specs) if caps is None else caps[0]
    check_pool(capacity, specs, args.max_pool_blocks)
    num_blocks = spec.num_blocks(capacity)
    encoder = msgspec.json.Encoder()
    interrupted = False
    with atomic_writer(out) as f, _kv_event_stream(args) as events:
        index = spec.make()
        on_events = None
        if events is not None:
            stream = events

            def on_events(batch: list[KVEvent]) -> None:
                stream.publish(KVEventBatch(time.time(), batch, None))

        def write_row(row: HitRow) -> None:
            f.write(
                encoder.encode(
                    {"id": row.id, "prompt_len": row.prompt_len, "hit_tokens": row.hit_tokens}
                )
            )
            f.write(b"\n")

        bar = progress(
            workload.stats.prompt_tokens, f"replay {spec.label}", quiet=args.quiet, unit="tok"
        )
        result: ReplayResult
        try:
            result = replay(
                workload.requests,
                index,
                num_blocks,
                driver=spec.driver,
                concurrency=args.concurrency,
                keep_per_request=False,
                on_admit=write_row,
                progress=bar.update,
                on_events=on_events,
            )
        except ReplayInterrupted as exc:
            result, interrupted = exc.result, True
        except ReplayError as exc:
            raise ReplayError(
                f"capacity {capacity:,} tokens ({num_blocks:,} × {spec.block_size}-token blocks) "
                f"is too small at concurrency {args.concurrency}: {exc}"
            ) from None
        finally:
            bar.close()
        summary = _replay_summary(args, argv, workload, spec, num_blocks, result)
        summary["scan_seconds"] = load_seconds
        if events is not None:
            summary["kv_events"] = {"target": args.kv_events, "batches": events.num_batches}
        f.write(encoder.encode({"summary": summary}))
        f.write(b"\n")
    if not args.quiet or interrupted:
        state = " (interrupted: partial)" if interrupted else ""
        print(
            f"{summary['trace']} {spec.describe()} K={args.concurrency} "
            f"capacity={num_blocks * spec.block_size:,} tokens: hit {summary['total_hit_tokens']:,}"
            f"/{summary['total_prompt_tokens']:,} = {summary['hit_ratio']:.4f}, evicted "
            f"{summary['evicted_blocks']:,} blocks, {summary['wall_seconds']:.1f} s -> {out}{state}"
        )
        if events is not None:
            print(f"KV events: {events.num_batches:,} batches -> {args.kv_events}")
        for note in workload.notes:
            print(f"note: {note}")
    return EXIT_INTERRUPTED if interrupted else 0


def _replay_summary(
    args: argparse.Namespace,
    argv: Sequence[str],
    workload: Workload,
    spec: BackendSpec,
    num_blocks: int,
    result: ReplayResult,
) -> dict[str, Any]:
    summary = result.summary()
    summary.update(
        {
            "trace": os.path.basename(os.path.normpath(args.trace)),
            "trace_source": workload.source,
            "notes": list(workload.notes),
            "config": {
                "command": shlex.join(["prefixkv", *argv]),
                "index": spec.index,
                "driver": spec.driver,
                "block_size": spec.block_size,
                "options": dict(spec.options),
                "num_blocks": num_blocks,
                "capacity_tokens": num_blocks * spec.block_size,
                "concurrency": args.concurrency,
                "max_requests": args.max_requests,
                "tokens_per_id": args.tokens_per_id,
                "seed": args.seed,
                "prefixkv": _version(),
                "python": sys.version.split()[0],
            },
        }
    )
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``prefixkv`` command line; returns the exit status.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        0 on success; 2 on any error in the input or the flags (one line on
        stderr); 130 when interrupted (what was finished is written, marked
        partial); 1 on an internal error (one line too; set ``PREFIXKV_TRACEBACK=1``
        to see the traceback).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
        if args.command == "compare":
            return _run_compare(args, args_list)
        if args.command == "calibrate":
            return _run_calibrate(args)
        if args.command == "cluster":
            return run_cluster_command(args, args_list)
        return _run_replay(args, args_list)
    except SystemExit as exc:  # --help and --version exit through argparse
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print(
            "prefixkv: interrupted before anything was finished; nothing written", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `prefixkv compare | head`: the reader left, not an error
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except MemoryError:
        print(
            "prefixkv: error: out of memory; lower --capacity-tokens, --max-prompt-tokens "
            "or --max-output-tokens",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except (PrefixKVError, OSError, ValueError, RecursionError) as exc:
        print(f"prefixkv: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:
        if os.environ.get("PREFIXKV_TRACEBACK"):
            raise
        print(
            f"prefixkv: internal error: {type(exc).__name__}: {_one_line(exc)} "
            "(set PREFIXKV_TRACEBACK=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename is not None:
        text = f"{exc.strerror or exc}: {exc.filename}"
    else:
        text = str(exc) or type(exc).__name__
    flat = " ".join(text.split())
    return flat if len(flat) <= 500 else flat[:497] + "..."
