"""Derive the default cost profile from Vidur's published profiling data.

Vidur (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM
Inference", MLSys 2024, https://github.com/microsoft/vidur) ships per-operator
timings measured with Kineto. This script reads the single-file layout of its
earlier commits (``data/profiling/a100/attention.csv`` @ e2d00e9), whose attention
rows are one configuration only: Llama-2-70B at tensor parallel 2 (64 query heads,
8 KV heads, hidden 8192) on A100 80 GB with FlashAttention. So one profile is
derived, ``llama2-70b-tp2-a100``.

Skipped, and why. Vidur's later layout (``data/profiling/compute/<device>/<model>/``
with ``mlp.csv`` and ``attention.csv`` each, at 7d47513 of November 2024) covers, at
the tensor-parallel degrees its ``mlp.csv`` rows list:

    A100  Llama-2-7B, Llama-2-70B, Meta-Llama-3-8B, Meta-Llama-3-70B,
          CodeLlama-34B-Instruct, InternLM-20B, Qwen-72B, phi-2
    A40   the same without the two Llama-3 models
    H100  the same without the two Llama-3 models

Those ``attention.csv`` files (the large ones) were not retrieved when this profile
was derived: only their ``mlp.csv`` were at hand, and a profile needs both the
linear and the attention measurements of its (model, device, TP), so none of those
combinations has a shipped profile yet. Nothing is made up in their place: no
attention time is scaled from another model or device.

A profile is composed the way Vidur's ``ExecutionTime`` composes a step:

    per layer: input/post-attention norms, QKV and output projections, rotary,
               MLP up/act/down, residual add, two all-reduces of the step's
               activations (tokens x 8192 x 2 bytes), prefill and decode attention
    per step:  80 layers + the CPU overheads (schedule, sampler, prepare inputs,
               process outputs; Ray's communication left out, as vLLM v1 runs
               tensor parallelism without Ray)

and then fitted, by least squares, to prefixkv's five coefficients:

    step_s              linear layers' time at one token (decode-regime intercept)
                        + decode attention's per-step intercept + CPU's
    prefill_token_s     linear layers' slope over 512..4096 tokens + attention's per-query slope
    prefill_attention_s prefill attention per (query, key) pair
    decode_seq_s        linear layers' slope over 1..256 tokens + decode attention
                        and CPU per request
    decode_context_s    decode attention per context token

The data is read from a clone of the repository at pinned commits (nothing of it
is copied here):

    git clone https://github.com/microsoft/vidur /tmp/vidur
    python benchmarks/derive_vidur_profile.py --vidur /tmp/vidur \
        --out adapters/lab/sim/profiles/llama2-70b-tp2-a100.json
"""

from __future__ import annotations

import argparse
import csv
import io
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from prefixkv.adapters.lab.sim.profile import CostProfile, save_profile

NUM_LAYERS = 80
HIDDEN = 8192
TP = 2
MS = 1e-3  # Vidur's timings are in milliseconds

# The hardware facts that bound capacity, from the model's config.json (80 layers,
# 8 KV heads of 128, hidden 8192, MLP 28672, vocabulary 32000, fp16) and the device.
KV_BYTES_PER_TOKEN = 2 * NUM_LAYERS * 8 * 128 * 2  # K and V, 2 bytes each: 327,680
NUM_PARAMS = NUM_LAYERS * (
    2 * HIDDEN * HIDDEN + 2 * HIDDEN * 1024 + 3 * HIDDEN * 28672 + 2 * HIDDEN
)
NUM_PARAMS += 2 * 32000 * HIDDEN + HIDDEN  # embeddings, LM head, final norm: 68,976,648,192
WEIGHT_BYTES = 2 * NUM_PARAMS
DEVICE_MEMORY_BYTES = TP * 80 * 2**30  # two A100 80GB (80 GiB each)

# (commit, path): the last commit holding each file in this form.
SOURCES = {
    "mlp": (
        "25e529deb1f90ffa53d6777622b8e2a1ef78a0f0",
        "data/profiling/compute/a100/meta-llama/Llama-2-70b-hf/mlp.csv",
    ),
    "attention": (
        "e2d00e9afba96cec9f0e7ea560bbfc4a539fae6a",
        "data/profiling/a100/attention.csv",
    ),
    "all_reduce": (
        "60277c06b41e49483609bdab55f71fe0fb5fdd54",
        "data/profiling/network/a100_pairwise_nvlink/all_reduce.csv",
    ),
    "cpu": (
        "57720caf01edae3e5e7391581266e57c258e97dd",
        "data/profiling/a100/cpu_overheads.csv",
    ),
}
LINEAR_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


def read_csv(vidur: str, what: str) -> list[dict[str, str]]:
    """Rows of one pinned Vidur file."""
    commit, path = SOURCES[what]
    text = subprocess.run(
        ["git", "-C", vidur, "show", f"{commit}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return list(csv.DictReader(io.StringIO(text)))


def lstsq(columns: Sequence[np.ndarray], y: np.ndarray, relative: bool = False) -> np.ndarray:
    """Least-squares coefficients of ``y ~ columns``; ``relative`` weights by ``1/y``."""
    x = np.vstack(columns).T.astype(float)
    w = 1.0 / y if relative else np.ones_like(y)
    coef, *_ = np.linalg.lstsq(x * w[:, None], y * w, rcond=None)
    return np.asarray(coef)


def rel_errors(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Median and 90th-percentile relative error of a fit."""
    err = np.abs(pred - y) / y
    return {
        "p50": round(float(np.percentile(err, 50)), 4),
        "p90": round(float(np.percentile(err, 90)), 4),
    }


def linear_layers(vidur: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-step milliseconds of everything but attention, by batched tokens."""
    rows = [r for r in read_csv(vidur, "mlp") if r["num_tensor_parallel_workers"] == str(TP)]
    tokens = np.array([int(r["num_tokens"]) for r in rows])
    per_layer = np.array(
        [sum(float(r[f"time_stats.{op}.median"]) for op in LINEAR_OPS) for r in rows]
    )
    ar = [r for r in read_csv(vidur, "all_reduce") if r["num_workers"] == str(TP)]
    size = np.array([int(r["size"]) for r in ar])
    ar_ms = np.array([float(r["time_stats.all_reduce.median"]) for r in ar])
    order = np.argsort(size)
    all_reduce = np.interp(tokens * HIDDEN * 2, size[order], ar_ms[order])
    order = np.argsort(tokens)
    return tokens[order], (NUM_LAYERS * (per_layer + 2 * all_reduce))[order]


def column(rows: list[dict[str, str]], name: str) -> np.ndarray:
    """One integer column of ``rows``."""
    return np.array([int(r[name]) for r in rows])


def summed(rows: list[dict[str, str]], names: Sequence[str]) -> np.ndarray:
    """Each row's sum of the float columns ``names``."""
    return np.array([sum(float(r[n]) for n in names) for r in rows])


def attention(attn: list[dict[str, str]], phase: str) -> tuple[list[dict[str, str]], np.ndarray]:
    """The tensor-parallel-``TP`` attention rows of ``phase`` (prefill or decode) and
    each one's milliseconds: the kernel and the input and output reshapes."""
    rows = [
        r
        for r in attn
        if r["is_prefill"] == str(phase == "prefill")
        and r["num_tensor_parallel_workers"] == str(TP)
    ]
    parts = (phase, "input_reshape", "output_reshape")
    return rows, summed(rows, [f"time_stats.attn_{k}.median" for k in parts])


def derive(vidur: str) -> CostProfile:
    """Fit the five coefficients; returns the profile with its fit report."""
    fit: dict[str, Any] = {}
    tokens, lin = linear_layers(vidur)
    dec = tokens <= 256
    lin_base, lin_seq = lstsq([np.ones(dec.sum()), tokens[dec]], lin[dec])
    pre = tokens >= 512
    _, lin_token = lstsq([np.ones(pre.sum()), tokens[pre]], lin[pre])
    fit["linear_decode_regime_1_256"] = rel_errors(lin_base + lin_seq * tokens[dec], lin[dec])
    fit["linear_prefill_regime_512_4096"] = rel_errors(lin_base + lin_token * tokens[pre], lin[pre])

    attn = read_csv(vidur, "attention")
    p, t = attention(attn, "prefill")
    q, s = column(p, "prefill_chunk_size"), column(p, "kv_cache_size")
    pairs = q * s + q * (q + 1) / 2
    a_q, a_pair = lstsq([q, pairs], t, relative=True)
    fit["prefill_attention"] = rel_errors(a_q * q + a_pair * pairs, t)

    d, t = attention(attn, "decode")
    b, kv = column(d, "batch_size"), column(d, "kv_cache_size")
    e0, e_seq, e_ctx = lstsq([np.ones_like(b), b, b * kv], t, relative=True)
    fit["decode_attention"] = rel_errors(e0 + e_seq * b + e_ctx * b * kv, t)

    cpu = [r for r in read_csv(vidur, "cpu") if r["model_name"] == "meta-llama/Llama-2-70b-hf"]
    cb = column(cpu, "batch_size")
    parts = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")
    ct = summed(cpu, [f"{k}_median" for k in parts])
    cpu0, cpu_seq = lstsq([np.ones_like(cb), cb], ct)
    fit["cpu_overhead"] = rel_errors(cpu0 + cpu_seq * cb, ct)
    fit["cpu_overhead_rows"] = f"Llama-2-70b at tensor parallel {cpu[0]['tensor_parallel_degree']}"
    # What the data covers: a run past it extrapolates (prefixkv warns once).
    covers = {
        "prefill_tokens": [int(tokens.min()), int(tokens.max())],
        "context_tokens": [int((q + s).min()), int(max((q + s).max(), kv.max()))],
        "batch_size": [int(b.min()), int(b.max())],
    }

    return CostProfile(
        name="llama2-70b-tp2-a100",
        model="meta-llama/Llama-2-70b-hf, fp16, tensor parallel 2 (80 layers, GQA 64/8)",
        device="2x NVIDIA A100 80GB (NVLink), FlashAttention",
        step_s=float(lin_base + NUM_LAYERS * e0 + cpu0) * MS,
        prefill_token_s=float(lin_token + NUM_LAYERS * a_q) * MS,
        prefill_attention_s=float(NUM_LAYERS * a_pair) * MS,
        decode_seq_s=float(lin_seq + NUM_LAYERS * e_seq + cpu_seq) * MS,
        decode_context_s=float(NUM_LAYERS * e_ctx) * MS,
        source=(
            "Vidur profiling data (Agrawal et al., MLSys 2024; github.com/microsoft/vidur): "
            + "; ".join(f"{path} @ {commit[:12]}" for commit, path in SOURCES.values())
        ),
        notes=(
            "Derived by benchmarks/derive_vidur_profile.py: per-operator medians composed "
            "as Vidur's ExecutionTime does (80 layers, two all-reduces a layer, CPU "
            "overheads without Ray), then fitted by least squares; fit gives each part's "
            "relative error. CPU overheads are Vidur's only Llama-2-70b rows (tensor parallel "
            "4). Kernel-level timings: no CUDA graphs, no overlap of CPU and GPU work."
        ),
        fit=fit,
        measured_on={"engine": "Vidur's operator profiling (Kineto)", "machine": "A100 80GB"},
        covers=covers,
        kv_bytes_per_token=KV_BYTES_PER_TOKEN,
        device_memory_bytes=DEVICE_MEMORY_BYTES,
        weight_bytes=WEIGHT_BYTES,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: derive and write (or print) the profile."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--vidur", required=True, help="a git clone of github.com/microsoft/vidur")
    ap.add_argument("--out", help="write the profile here (default: print it)")
    args = ap.parse_args(argv)
    profile = derive(args.vidur)
    if args.out:
        save_profile(profile, args.out)
    else:
        import json

        json.dump(profile.to_dict(), sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
