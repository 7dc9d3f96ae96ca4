"""GPU bandwidth of the paged KV writes and gathers, as a fraction of the device's peak.

Times ``PagedKVCache.write`` (slot-mapping scatter) and ``gather`` (block-table
gather) for 16-token blocks with CUDA events, for a decode-sized and a
prefill-sized batch, and prints achieved GB/s next to ``--peak-gbps`` (default:
4800, an H200's HBM3e). Needs a CUDA device; nothing in CI runs it.

    python benchmarks/gpu_storage.py [--peak-gbps 4800] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from prefixkv.storage.paged_kv import PagedKVCache


def timed(fn: Callable[[], object], iters: int) -> float:
    """Mean seconds per call, measured with CUDA events after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1e3 / iters


def measure(num_tokens: int, heads: int, head_dim: int, dtype: torch.dtype, iters: int,
            peak: float) -> list[dict[str, object]]:  # fmt: skip
    """Write and gather of ``num_tokens`` tokens through 16-token blocks."""
    bs = 16
    blocks = 2 * num_tokens // bs
    kv = PagedKVCache(1, heads, head_dim, blocks, bs, dtype=dtype, device="cuda")
    table = torch.randperm(blocks, device="cuda")[: num_tokens // bs]
    slots = kv.slots_for(table, num_tokens)
    k = torch.randn(num_tokens, heads, head_dim, dtype=dtype, device="cuda")
    moved = 4 * k.numel() * k.element_size()  # k and v, read once and written once
    out = []
    for op, fn in (
        ("write", lambda: kv.write(0, k, k, slots)),
        ("gather", lambda: kv.gather(0, table, num_tokens)),
    ):
        gbps = moved / timed(fn, iters) / 1e9
        frac = round(gbps / peak, 3)
        out.append({"op": op, "tokens": num_tokens, "dtype": str(dtype),
                    "GB_per_s": round(gbps, 1), "fraction_of_peak": frac})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peak-gbps", type=float, default=4800.0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_storage.py needs a CUDA device")
    dtype = getattr(torch, args.dtype)
    for num_tokens in (4096, 65536, 524288):
        for result in measure(num_tokens, args.heads, args.head_dim, dtype, args.iters,
                              args.peak_gbps):  # fmt: skip
            print(json.dumps(result))


if __name__ == "__main__":
    main()
