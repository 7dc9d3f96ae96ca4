"""Serve a tiny dummy-weight model with ``vllm serve`` and prefixkv's scheduler, on a GPU.

Writes a small Llama ``config.json`` (no weights, no tokenizer, nothing from a hub),
starts ``vllm serve`` with ``--load-format dummy --skip-tokenizer-init`` and
``--scheduler-cls prefixkv.adapters.plugins.vllm.PrefixKVScheduler``, once per index,
sends requests that share a prefix as token ids, and prints each request's cached
tokens (``usage.prompt_tokens_details.cached_tokens``). Exits 2 at once when the
given Python sees no CUDA device.

    python benchmarks/gpu/vllm_serve_prefixkv.py --python GPU_VENV/bin/python \\
        [--index hash_chain --index radix] [--port 8123]

``GPU_VENV`` needs vLLM 0.33 (its CUDA build) and prefixkv (``pip install -e .``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def has_cuda(python: str) -> bool:
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def post(port: int, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def wait_healthy(port: int, server: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"vllm serve exited with status {server.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except (urllib.error.URLError, ConnectionError):
            time.sleep(2)
    raise SystemExit(f"vllm serve was not healthy after {timeout_s:.0f} s")


def serve_and_query(python: str, model: Path, index: str, port: int, log: Path) -> list[int]:
    cmd = [
        python, "-m", "vllm.entrypoints.cli.main", "serve", str(model),
        "--load-format", "dummy", "--skip-tokenizer-init", "--enforce-eager",
        "--max-model-len", "2048", "--block-size", "16", "--gpu-memory-utilization", "0.3",
        "--enable-prompt-tokens-details", "--port", str(port), "--host", "127.0.0.1",
        "--scheduler-cls", "prefixkv.adapters.plugins.vllm.PrefixKVScheduler",
        "--additional-config", json.dumps({"prefixkv": {"index": index}}),
    ]  # fmt: skip
    with log.open("w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(port, server, 600)
        rng = random.Random(0)
        system = [rng.randrange(3, 32000) for _ in range(200)]
        prompts = [system + [rng.randrange(3, 32000) for _ in range(rng.randrange(10, 60))]
                   for _ in range(4)]  # fmt: skip
        prompts.append(prompts[0])  # a repeat: the whole prompt but its last block hits
        cached = []
        for p in prompts:
            body = {"model": str(model), "prompt": p, "max_tokens": 8, "temperature": 0}
            usage = post(port, body)["usage"]
            cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
            print(f"  {index}: prompt {usage['prompt_tokens']} tokens, cached {cached[-1]}")
        return cached
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", required=True, help="a Python with GPU vLLM 0.33 and prefixkv")
    ap.add_argument("--index", action="append", help="prefixkv index (repeatable)")
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    if not has_cuda(args.python):
        print(f"vllm_serve_prefixkv: {args.python} sees no CUDA device; this check needs a GPU",
              file=sys.stderr)  # fmt: skip
        return 2
    with tempfile.TemporaryDirectory(prefix="prefixkv-tiny-llama-") as d:
        model = Path(d) / "model"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(TINY_LLAMA))
        for index in args.index or ["hash_chain", "radix"]:
            cached = serve_and_query(args.python, model, index, args.port, Path(d) / "serve.log")
            if not any(cached[1:]):
                print((Path(d) / "serve.log").read_text()[-4000:], file=sys.stderr)
                print(f"vllm_serve_prefixkv: {index}: no request hit the cache", file=sys.stderr)
                return 1
    print("vllm_serve_prefixkv: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
