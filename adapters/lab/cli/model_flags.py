"""The model and GPU flags of ``compare`` and ``cluster``: KV bytes per token and the
pool for your model, and the requests refused for their length.

``--model-config`` (a Hugging Face ``config.json``, a folder holding one, a shipped
config's name or a model in the local Hugging Face cache) and ``--gpu-memory GiB``
replace the cost profile's hardware: its KV bytes per token, device memory and
weights (:mod:`..sim.model_config`), which ``--capacity-tokens auto``,
``--capacity-gib`` and the capacity anchors' GiB read. The step costs stay the
profile's. ``--max-model-len`` (default: the config's ``max_position_embeddings``)
and the table's capacity bound each request's length (:mod:`..admission`).
"""

from __future__ import annotations

import argparse
import dataclasses

from ..admission import AdmissionRule, length_rule
from ..sim import CostProfile
from ..sim.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..sim.model_config import ModelConfig, available_model_configs, load_model_config
from .args import CLIUsageError, parse_token_count, positive_float, positive_int
from .common import memory_utilization

__all__ = ["add_model_flags", "admission_rule", "apply_model", "max_model_len", "model_line"]


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The model, GPU and length flags."""
    g = p.add_argument_group("your model and GPU (capacity as vLLM sizes it)")
    g.add_argument(
        "--model-config",
        metavar="FILE|NAME",
        help="a Hugging Face config.json (or its folder, or org/name in the local Hugging "
        f"Face cache; nothing is downloaded; shipped: {', '.join(available_model_configs())}): "
        "its KV bytes per token (2 x layers x KV heads x head dim x dtype bytes; MLA: layers x "
        "(kv_lora_rank + qk_rope_head_dim) x dtype bytes) and weights replace the profile's",
    )
    g.add_argument(
        "--gpu-memory",
        type=positive_float,
        metavar="GIB",
        help="device memory of one GPU in GiB (an 80 GB H100 or A100: 80); with "
        "--capacity-tokens auto the pool is (--gpu-memory-utilization x GPUs x GiB - "
        "weights - --non-kv-memory) // KV bytes per token",
    )
    g.add_argument(
        "--tensor-parallel-size",
        type=positive_int,
        default=1,
        metavar="N",
        help="GPUs the model is split over, as vLLM's flag (default %(default)s)",
    )
    g.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"),
        default="auto",
        help="as vLLM's flag: auto keeps the model's dtype (default %(default)s)",
    )
    g.add_argument(
        "--non-kv-memory",
        type=positive_float,
        metavar="GIB",
        help="GiB besides the weights that vLLM keeps out of the pool: the profiled "
        "activation peak, CUDA graphs, non-torch memory (default 0: the pool is an upper "
        "bound; about 5 GiB for an 8B model on an H100)",
    )
    g.add_argument(
        "--max-model-len",
        type=parse_token_count,
        metavar="T",
        help="refuse requests whose prompt plus output exceed T tokens, as vLLM's front end "
        "does (default: the model config's max_position_embeddings, else no limit); requests "
        "that cannot fit the table's KV pool alone are refused too",
    )
    g.add_argument(
        "--on-long-request",
        choices=("reject", "abort"),
        default="reject",
        help="reject (count it and go on, as vLLM answers 400) or abort the run on a request "
        "too long for --max-model-len or the pool (default %(default)s)",
    )


def apply_model(
    args: argparse.Namespace, profile: CostProfile
) -> tuple[CostProfile, ModelConfig | None]:
    """``profile`` with the hardware of ``--model-config``/``--gpu-memory``.

    Raises:
        ModelConfigError: the config cannot be found or read.
        CLIUsageError: a model flag without ``--model-config`` or ``--gpu-memory``;
            ``--capacity-tokens auto`` for a model without ``--gpu-memory``.
    """
    model = None
    if args.model_config is not None:
        model = load_model_config(args.model_config, args.kv_cache_dtype)
    elif args.kv_cache_dtype != "auto":
        raise CLIUsageError("--kv-cache-dtype needs --model-config")
    if args.capacity_tokens == "auto" and model is not None and args.gpu_memory is None:
        raise CLIUsageError("--capacity-tokens auto with --model-config needs --gpu-memory GIB")
    if args.model_config is None and args.gpu_memory is None:
        if args.tensor_parallel_size != 1 or args.non_kv_memory is not None:
            raise CLIUsageError(
                "--tensor-parallel-size and --non-kv-memory need --model-config or --gpu-memory"
            )
        return profile, None
    non_kv = int((args.non_kv_memory or 0.0) * 2**30)
    changes: dict[str, object] = {"kv_cache_tokens": None}
    if model is not None:
        tp = args.tensor_parallel_size
        changes.update(
            kv_bytes_per_token=model.kv_bytes_per_token,
            weight_bytes=model.weight_bytes + non_kv,
            model=f"{model.name}, {_dtype(model)}" + (f", tensor parallel {tp}" if tp > 1 else ""),
        )
    elif non_kv:
        changes["weight_bytes"] = (profile.weight_bytes or 0) + non_kv
    if args.gpu_memory is not None:
        changes["device_memory_bytes"] = int(args.gpu_memory * 2**30) * args.tensor_parallel_size
    elif model is not None:
        changes["device_memory_bytes"] = None  # the profile's GPUs are not this model's
    return dataclasses.replace(profile, **changes), model  # type: ignore[arg-type]


def _dtype(model: ModelConfig) -> str:
    return f"{8 * model.kv_dtype_bytes}-bit KV"


def model_line(
    args: argparse.Namespace, profile: CostProfile, model: ModelConfig | None
) -> str | None:
    """The console's and report's capacity line for ``--model-config``/``--gpu-memory``."""
    if model is None and args.gpu_memory is None:
        return None
    util = memory_utilization(args)
    parts = [] if model is None else [model.describe()]
    if profile.device_memory_bytes is not None and profile.kv_bytes_per_token:
        tokens = profile.kv_capacity_tokens(util) or 0
        gpus = args.tensor_parallel_size
        gib = tokens * profile.kv_bytes_per_token / 2**30
        parts.append(
            f"pool {tokens:,} tokens = {gib:,.1f} GiB of KV "
            f"on {gpus} x {args.gpu_memory:g} GiB at --gpu-memory-utilization {util:g}, less "
            f"{(profile.weight_bytes or 0) / 2**30:,.2f} GiB of weights"
            + (" and non-KV memory" if args.non_kv_memory else "")
            + (
                "" if args.non_kv_memory else
                " (an upper bound: vLLM also keeps its profiled activation peak out; "
                "--non-kv-memory GIB)"
            )
        )  # fmt: skip
    parts.append(f"step costs from profile {profile.name}")
    return "; ".join(parts)


def max_model_len(args: argparse.Namespace, model: ModelConfig | None) -> int | None:
    """``--max-model-len``, else the model's context (as vLLM defaults it), else ``None``."""
    given: int | None = args.max_model_len
    if given is None and model is not None:
        return model.max_position_embeddings
    return given


def admission_rule(
    args: argparse.Namespace, model: ModelConfig | None, block_size: int, pool_tokens: int | None
) -> AdmissionRule | None:
    """The length rule of ``--max-model-len`` (or the model's context) and a pool of
    ``pool_tokens`` in blocks of ``block_size``, or ``None`` when neither bounds anything."""
    return length_rule(
        max_model_len(args, model),
        pool_tokens,
        block_size=block_size,
        max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None)
        or DEFAULT_MAX_NUM_BATCHED_TOKENS,
    )
