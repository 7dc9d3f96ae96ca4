"""Check a side environment: the engine's modules import and the seed example's hits.

    PYTHON check_env.py vllm|sglang [--prefixkv]

Exits 0 when the engine (vLLM 0.32 or 0.33, SGLang 0.5.23) runs on a CPU torch 2.13,
the modules the oracles and engine tests drive import, and the seed example (a: 80
tokens; b: a[:30] + 50 new; a again) gives the engine's hits through its oracle.
``--prefixkv`` (after ``make engine-envs`` installed this checkout) also imports
prefixkv -- from this checkout, not another one -- and its plug-in as the engine
loads it: for vLLM the seed example then runs again inside vLLM's own scheduler
with ``--scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler``; for
SGLang, SGLang's own plug-in loader must register prefixkv's backends.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
VERSIONS = {"vllm": ("0.32.", "0.33."), "sglang": ("0.5.23",)}
ROOT = HERE.parents[2]
PLUGIN = "prefixkv.adapters.vllm.scheduler.PrefixKVScheduler"


def seed_trace(path: Path) -> None:
    rng = random.Random(0)
    a = [rng.randrange(1, 16000) for _ in range(80)]
    b = a[:30] + [rng.randrange(16000, 32000) for _ in range(50)]
    with path.open("w") as f:
        for rid, tokens in (("a", a), ("b", b), ("a-again", a)):
            f.write(json.dumps({"id": rid, "tokens": tokens, "output": []}) + "\n")


def hits(path: Path) -> dict[str, int]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return {r["id"]: r["hit_tokens"] for r in lines if "id" in r}


def check_prefixkv(engine: str) -> str | None:
    """Import prefixkv and its plug-in the way the engine does; a reason when it fails."""
    import importlib.metadata

    import prefixkv.adapters

    where = Path(prefixkv.adapters.__file__).resolve().parent
    if where != ROOT / "adapters":
        return f"prefixkv here is {where.parent}, not this checkout {ROOT} (make engine-envs)"
    if engine == "vllm":
        import prefixkv.adapters.vllm.scheduler  # what --scheduler-cls loads
    else:
        eps = importlib.metadata.entry_points(group="sglang.srt.plugins", name="prefixkv")
        if not eps:
            return "prefixkv's sglang.srt.plugins entry point is not installed"
        return sglang_plugin_missing() or None
    return None


def sglang_plugin_missing() -> str:
    """Why prefixkv cannot run inside this SGLang ("" when it can): the engine tests
    import prefixkv and its dependencies, and SGLang must find its entry point."""
    try:
        from sglang.srt.mem_cache.registry import get_radix_cache_factory
        from sglang.srt.plugins import load_plugins

        import prefixkv.adapters.lab.traces  # noqa: F401  # the engine tests' traces

        load_plugins()  # SGLang's own loader: the sglang.srt.plugins entry point
    except ImportError as e:
        return f"prefixkv does not import here ({e}); rerun setup_env.sh"
    names = ("prefixkv-radix", "prefixkv-hash-chain")
    missing = [n for n in names if get_radix_cache_factory(n) is None]
    if missing:
        return f"SGLang's plug-in loader did not register {missing}: install prefixkv here"
    return ""


def main() -> int:
    engine = sys.argv[1]
    with_prefixkv = "--prefixkv" in sys.argv[2:]
    import pytest  # noqa: F401  # the engine tests run here
    import sortedcontainers  # noqa: F401  # prefixkv's dependency
    import torch

    assert torch.__version__.startswith("2.13.") and torch.version.cuda is None, torch.__version__
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "seed.jsonl"
        seed_trace(trace)
        if engine == "vllm":
            import vllm
            import vllm.v1.core.sched.async_scheduler

            assert vllm.__version__.startswith(VERSIONS[engine]), vllm.__version__
            if with_prefixkv and (problem := check_prefixkv(engine)):
                print(f"check_env: {engine}: {problem}", file=sys.stderr)
                return 1
            oracle = [sys.executable, str(HERE / "vllm_oracle.py"), str(trace)]
            oracle += ["--num-blocks", "64", "--quiet"]
            subprocess.run([*oracle, "--out", f"{d}/v.jsonl"], check=True)
            want = {16: {"a": 0, "b": 16, "a-again": 64}}
            got = {16: hits(Path(d) / "v.jsonl")}
            if with_prefixkv:
                inside = ["--driver", "scheduler", "--scheduler-cls", PLUGIN]
                subprocess.run([*oracle, *inside, "--out", f"{d}/p.jsonl"], check=True)
                got[-16] = hits(Path(d) / "p.jsonl")  # prefixkv inside vLLM: the same
                want[-16] = want[16]
        else:
            import torchvision_standin  # beside this script

            torchvision_standin.install()
            import sglang
            import sglang.srt.managers.schedule_batch
            import sglang.srt.mem_cache.registry

            assert sglang.__version__.startswith(VERSIONS[engine]), sglang.__version__
            if with_prefixkv and (problem := check_prefixkv(engine)):
                print(f"check_env: {engine}: {problem}", file=sys.stderr)
                return 1
            want = {1: {"a": 0, "b": 30, "a-again": 79}, 16: {"a": 0, "b": 16, "a-again": 64}}
            batch = Path(d) / "runs.txt"
            batch.write_text(
                "".join(
                    f"{trace} --page-size {ps} --capacity-tokens 4096 "
                    f"--no-warmup --out {d}/p{ps}.jsonl\n"
                    for ps in want
                )
            )
            subprocess.run(
                [sys.executable, str(HERE / "sglang_oracle.py"), "--batch", str(batch)],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            got = {ps: hits(Path(d) / f"p{ps}.jsonl") for ps in want}
    if got != want:
        print(f"check_env: {engine} seed example hits {got}, expected {want}", file=sys.stderr)
        return 1
    version = __import__(engine).__version__
    extra = f", prefixkv from {ROOT}" if with_prefixkv else ""
    print(f"check_env: {engine} {version} on torch {torch.__version__}: seed example OK{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
