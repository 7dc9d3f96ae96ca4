"""A peer router on the live fleet: SGLang's router (``sglang-router``), cache-aware.

``python -m sglang_router.launch_router --worker-urls URL... --policy cache_aware``
(the Rust router SGLang ships on PyPI; it keeps an approximate radix tree of the
requests it routed, per worker, and balances on requests in flight) is started in
front of the same ``vllm serve`` processes, bound to 127.0.0.1, from a Python that
has it (its own environment, not prefixkv's). The trace goes through it one request
at a time, streamed, as text: its ``/v1/completions`` takes ``prompt`` as a string or
strings only (a token-id list is refused with HTTP 422, "data did not match any
variant of untagged enum StringOrArray"), so the servers run a word tokenizer that
reads ``"t4405 t18654"`` back as ``[4405, 18654]`` (:mod:`word_tokenizer`) and see
the same tokens prefixkv's router sends them as ids. Which server served each
request is read from the servers' ``vllm:request_success_total`` counters, the hit
ratio from their prefix-cache counters, the time to first token from the client.
The router is always stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm_server import ServerError, free_port, stream_completion
from word_tokenizer import as_text

from prefixkv.adapters.lab.compare.k_live import percentile

if TYPE_CHECKING:
    from live_servers import LiveFleet
    from live_trace import LiveRequest

__all__ = ["run_peer"]

COUNTERS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def run_peer(
    python: str,
    fleet: LiveFleet,
    trace: Sequence[LiveRequest],
    out: Path,
    *,
    policy: str = "cache_aware",
    start_timeout: float = 90.0,
) -> dict[str, Any]:
    """Route ``trace`` through sglang-router's ``policy`` over ``fleet``.

    Returns:
        ``summary`` (hit ratio from the servers' metrics, TTFT p50/p90, requests per
        server) and per-request rows, or ``error`` with the router's log tail.
    """
    port, metrics_port = free_port(), free_port()
    urls = [s.url for s in fleet.servers]
    cmd = [
        python, "-m", "sglang_router.launch_router",
        "--host", "127.0.0.1", "--port", str(port),
        "--worker-urls", *urls,
        "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        "--log-level", "info",
    ]  # fmt: skip
    log_path = out / "logs" / f"sglang-router-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fleet.reset()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    result: dict[str, Any] = {"command": " ".join(cmd), "policy": policy}
    try:
        up = _wait_up(url, proc, len(urls), start_timeout)
        result["start_s"] = up
        rows = []
        before_all = fleet.counters()
        for req in trace:
            before = fleet.counters()
            text = as_text(req.prompt)  # it takes text only: the servers tokenize it back
            s = stream_completion(
                url, fleet.servers[0].config.model, text, req.output_len, timeout=120
            )
            after = fleet.counters()
            served = [
                k for k, (a, b) in enumerate(zip(after, before, strict=True))
                if a["vllm:request_success_total"] > b["vllm:request_success_total"]
            ]  # fmt: skip
            rows.append(
                {"id": req.id, "replica": served[0] if len(served) == 1 else served,
                 "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens,
                 "ttft_s": s.ttft_s}
            )  # fmt: skip
        after_all = fleet.counters()
        q = sum(a[COUNTERS[0]] - b[COUNTERS[0]] for a, b in zip(after_all, before_all, strict=True))
        h = sum(a[COUNTERS[1]] - b[COUNTERS[1]] for a, b in zip(after_all, before_all, strict=True))
        ttft = [r["ttft_s"] for r in rows]
        result["summary"] = {
            "run": f"sglang-router {policy}",
            "requests": len(rows),
            "hit_ratio_metrics": h / q if q else 0.0,
            "hit_ratio_usage": sum(r["cached_tokens"] for r in rows)
            / max(1, sum(r["prompt_tokens"] for r in rows)),
            "ttft_p50_ms": percentile(ttft, 50) * 1e3,
            "ttft_p90_ms": percentile(ttft, 90) * 1e3,
            "per_server": [sum(1 for r in rows if r["replica"] == k) for k in range(len(urls))],
        }
        result["rows"] = rows
    except (ServerError, OSError, urllib.error.URLError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
        result["log_tail"] = _tail(log_path)
    finally:
        _stop(proc)
    return result


def _wait_up(url: str, proc: subprocess.Popen[bytes], num_workers: int, timeout: float) -> float:
    """Seconds until the router lists every worker healthy. Its ``/health`` answers
    before then: workers register in the background (connection mode by ``/health``,
    metadata by ``/server_info`` and ``/model_info``, which vLLM lacks: 404, tolerated,
    model "unknown"), and a request sent meanwhile gets HTTP 503
    ``no_available_workers``."""
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise ServerError(f"sglang-router exited ({proc.returncode})")
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError, KeyError):
            with urllib.request.urlopen(url + "/workers", timeout=5) as r:
                workers = json.loads(r.read())["workers"]
            if len(workers) == num_workers and all(w.get("is_healthy") for w in workers):
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise ServerError(
                f"sglang-router: {num_workers} healthy workers not listed after {timeout:.0f} s"
            )
        time.sleep(0.5)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(15)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
