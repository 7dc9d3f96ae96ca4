"""prefixkv inside ``vllm serve`` on a GPU, against native prefix caching: ``smoke.py`` there.

Writes a small Llama ``config.json`` (no weights, no tokenizer, nothing from a hub),
checks that the given vLLM sees a CUDA device (exit 2 at once if not), then runs
``benchmarks/serve/smoke.py`` with it: ``vllm serve --load-format dummy`` three times --
native prefix caching, ``--scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler``
with the hash chain, and with the radix tree -- the same requests to each, and exact
checks: the hash chain's cached tokens per request, ``/metrics`` counters and KV events
equal native's, the radix tree caches at least as much, greedy outputs are equal.

    python benchmarks/gpu/vllm_serve_prefixkv.py --vllm GPU_VENV/bin/vllm [--out gpu.json]

``GPU_VENV`` needs vLLM 0.32 or 0.33 (a CUDA build) and this checkout
(``GPU_VENV/bin/pip install --no-deps -e .``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SERVE = Path(__file__).resolve().parents[1] / "serve"
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


def has_cuda(python: Path) -> bool:
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="the vllm executable of a GPU environment")
    ap.add_argument("--out", default="vllm-serve-gpu.json")
    ap.add_argument("--logs", default="vllm-serve-gpu-logs")
    args = ap.parse_args()
    python = Path(args.vllm).parent / "python"
    if not has_cuda(python):
        print(f"vllm_serve_prefixkv: {python} sees no CUDA device; this check needs a GPU",
              file=sys.stderr)  # fmt: skip
        return 2
    sys.path.insert(0, str(SERVE))
    import smoke

    with tempfile.TemporaryDirectory(prefix="prefixkv-tiny-llama-") as d:
        (Path(d) / "config.json").write_text(json.dumps(TINY_LLAMA))
        return smoke.main(
            ["--vllm", args.vllm, "--model", d, "--out", args.out, "--logs", args.logs,
             "--serve-arg=--gpu-memory-utilization", "--serve-arg=0.3"]
        )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
