"""Record the real engines' hits on the fidelity fixtures (tests/data/fidelity/).

Replays each fixture trace through the vLLM 0.33 and SGLang 0.5.23 replay oracles
beside this script (``vllm_oracle.py``, ``sglang_oracle.py``: they drive the engines'
own prefix-cache code on CPU) for a grid of block sizes, concurrencies and capacities,
and writes ``expected.json``, which ``tests/adapters/test_fidelity.py`` compares prefixkv
against. Needs the two side environments (``setup_env.sh vllm|sglang``;
tests/README.md, "The engine tests and the recorders"):

    python tests/engines/recorders/make_fidelity_fixtures.py \
        --vllm-python .peers/vllm/bin/python --sglang-python .peers/sglang/bin/python \
        [--out PATH]   # default: overwrite tests/data/fidelity/expected.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from prefixkv.adapters.lab.traces import load_any, write_trace

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[1] / "data" / "fidelity"

# name -> (file, loader options)
TRACES = {
    "mixed": ("mixed.jsonl.gz", {}),
    "mooncake_conversation_head": ("mooncake_conversation_head.jsonl", {"tokens_per_id": 16}),
}


def grid(max_len: int) -> list[dict[str, int | str]]:
    """Configurations: each engine, two block sizes, K in {1, 4}, roomy and tight pools."""
    runs: list[dict[str, int | str]] = []
    for k in (1, 4):
        roomy = 200 * max_len
        tight = k * max_len + max_len // 2
        for cap in (roomy, tight):
            for bs in (16, 4):
                runs.append({"engine": "vllm", "block_size": bs, "k": k, "blocks": -(-cap // bs)})
            for ps in (1, 16):
                runs.append({"engine": "sglang", "block_size": ps, "k": k, "tokens": cap})
    return runs


def run_key(r: dict[str, int | str]) -> str:
    size = f"blocks={r['blocks']}" if r["engine"] == "vllm" else f"tokens={r['tokens']}"
    return f"{r['engine']} bs={r['block_size']} k={r['k']} {size}"


def read_hits(path: Path) -> list[int]:
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if "id" in rec:
            out.append(int(rec["hit_tokens"]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm-python", required=True, help="a Python with vLLM 0.33")
    ap.add_argument("--sglang-python", required=True, help="a Python with SGLang 0.5.23")
    ap.add_argument("--out", type=Path, default=FIXTURES / "expected.json")
    args = ap.parse_args()
    expected: dict[str, dict[str, list[int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, (fname, opts) in TRACES.items():
            reqs = load_any(FIXTURES / fname, **opts)  # type: ignore[arg-type]
            trace = work / f"{name}.jsonl"
            write_trace(trace, reqs)
            max_len = max(len(r.tokens) + len(r.output) for r in reqs)
            runs = grid(max_len)
            expected[name] = {}
            batch = work / f"{name}.batch"
            lines = []
            for i, r in enumerate(runs):
                out = work / f"{name}-{i}.jsonl"
                if r["engine"] == "vllm":
                    # vLLM's block 0 is its null block: N usable blocks = N + 1 in vLLM.
                    cmd = [args.vllm_python, str(HERE / "vllm_oracle.py"), str(trace),
                           "--block-size", str(r["block_size"]), "--num-blocks",
                           str(int(r["blocks"]) + 1), "-k", str(r["k"]), "--out", str(out),
                           "--quiet"]  # fmt: skip
                    subprocess.run(cmd, check=True)
                else:
                    lines.append(f"{trace} --page-size {r['block_size']} --capacity-tokens "
                                 f"{r['tokens']} --concurrency {r['k']} --no-warmup "
                                 f"--out {out}")  # fmt: skip
            batch.write_text("\n".join(lines) + "\n")
            subprocess.run([args.sglang_python, str(HERE / "sglang_oracle.py"), "--batch",
                            str(batch)], check=True)  # fmt: skip
            for i, r in enumerate(runs):
                expected[name][run_key(r)] = read_hits(work / f"{name}-{i}.jsonl")
    args.out.write_text(json.dumps(expected, indent=1) + "\n")
    print(f"wrote {args.out}: {sum(len(v) for v in expected.values())} runs")


if __name__ == "__main__":
    main()
