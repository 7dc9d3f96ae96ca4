"""A model's KV cache size from its Hugging Face ``config.json``, as vLLM sizes it.

Bytes a token: ``2 x layers x kv_heads x head_dim x dtype`` (MLA: ``layers x
(kv_lora_rank + qk_rope_head_dim) x dtype``). The weights are parameters x dtype bytes;
the pool an upper bound (activations 0 unless given; a sliding window not applied).
Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ProfileError
from .profile import shipped_json

__all__ = ["ModelConfig", "ModelConfigError", "available_model_configs", "load_model_config"]

_DTYPE_BYTES = {  # vLLM's --dtype auto serves float32 checkpoints in 16 bits
    **dict.fromkeys(("float32", "float", "float16", "half", "bfloat16"), 2),
    **dict.fromkeys(("float8", "float8_e4m3fn", "fp8"), 1),
}
_KV_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2}
"""vLLM's --kv-cache-dtype choices: auto keeps the model's dtype."""


class ModelConfigError(ProfileError):
    """A model config that cannot be found, read or sized."""


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """What sizes a model's KV cache and weights (``mla``: ``(kv_lora_rank,
    qk_rope_head_dim)``; ``max_position_embeddings``: vLLM's default ``max_model_len``;
    ``source``: where the config came from)."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    num_parameters: int
    max_position_embeddings: int | None
    mla: tuple[int, int] | None
    sliding_window: int | None
    kv_dtype_bytes: int
    source: str

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes a token takes over all layers (before tensor parallelism)."""
        if self.mla is not None:
            return self.num_layers * (self.mla[0] + self.mla[1]) * self.kv_dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Parameters x dtype bytes."""
        return self.num_parameters * self.dtype_bytes

    def describe(self) -> str:
        """``"<name>: 32 layers x 8 KV heads x 128 x K,V x 2 bytes = 131,072 bytes a token;
        8.03B parameters = 14.96 GiB"``."""
        if self.mla is not None:
            shape = (
                f"{self.num_layers} layers x (kv_lora_rank {self.mla[0]} + qk_rope_head_dim "
                f"{self.mla[1]}) x {self.kv_dtype_bytes} bytes (MLA)"
            )
        else:
            shape = (
                f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} x "
                f"K,V x {self.kv_dtype_bytes} bytes"
            )
        text = (
            f"{self.name}: {shape} = {self.kv_bytes_per_token:,} bytes a token; "
            f"{self.num_parameters / 1e9:.2f}B parameters = {self.weight_bytes / 2**30:.2f} GiB"
        )
        if self.sliding_window:
            text += (
                f"; sliding window {self.sliding_window:,} not applied (full attention "
                "counted: an upper bound per request)"
            )
        return text


def available_model_configs() -> list[str]:
    """Names of the shipped model configs."""
    return sorted(shipped_json("models"))


def _hf_cache_dirs() -> list[Path]:
    env = os.environ
    dirs = [Path(env[v]) for v in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE") if env.get(v)]
    home = os.environ.get("HF_HOME")
    dirs.append(Path(home) / "hub" if home else Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def _from_hf_cache(name: str) -> Path | None:
    folder = "models--" + name.replace("/", "--")
    for cache in _hf_cache_dirs():
        snapshots = cache / folder / "snapshots"
        if snapshots.is_dir():
            found = sorted(
                (p for p in snapshots.glob("*/config.json") if p.is_file()),
                key=lambda p: p.stat().st_mtime,
            )
            if found:
                return found[-1]
    return None


def _locate(name_or_path: str) -> tuple[Mapping[str, Any], str]:
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return _read(path), str(path)
    shipped = shipped_json("models")
    if name_or_path in shipped:
        text = shipped[name_or_path].read_text()
        return _parse(text, name_or_path), f"shipped config {name_or_path}"
    cached = _from_hf_cache(name_or_path) if "/" in name_or_path else None
    if cached is not None:
        return _read(cached), str(cached)
    raise ModelConfigError(
        f"no model config {name_or_path!r}: not a config.json file or folder, not a shipped "
        f"config ({', '.join(sorted(shipped))}), not in the local Hugging Face "
        "cache (nothing is downloaded; give the path of its config.json)"
    )


def _read(path: Path) -> Mapping[str, Any]:
    try:
        size = path.stat().st_size
        if size > 4 * 2**20:
            raise ModelConfigError(f"{path}: {size:,} bytes is no config.json")
        return _parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelConfigError(f"{path}: cannot read ({exc})") from None


def _parse(text: str, where: str) -> Mapping[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelConfigError(f"{where}: a config.json is an object, got {type(data).__name__}")
    return data


def _int(cfg: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ModelConfigError(f"{where}: {key!r} is missing (needed for the KV size)")
    if type(value) is not int or value < 1:
        raise ModelConfigError(f"{where}: {key!r} must be a positive int, got {value!r}")
    return value


def _opt_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    return value if type(value) is int and value > 0 else None


def count_parameters(cfg: Mapping[str, Any], head_dim: int, num_kv_heads: int) -> int:
    """Parameters of a decoder with gated MLPs (and MoE kin) from its shapes; biases and
    routers left out."""
    hidden = int(cfg.get("hidden_size") or 0)
    vocab = int(cfg.get("vocab_size") or 0)
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 0)
    inter = int(cfg.get("intermediate_size") or 0)
    tied = bool(cfg.get("tie_word_embeddings", False))
    attention = hidden * heads * head_dim * 2 + hidden * num_kv_heads * head_dim * 2
    experts = int(cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    if experts:
        moe_inter = int(cfg.get("moe_intermediate_size") or inter)
        shared = int(cfg.get("n_shared_experts") or 0)
        mlp = 3 * hidden * moe_inter * (experts + shared)
    else:
        mlp = 3 * hidden * inter
    per_layer = attention + mlp + 2 * hidden
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def load_model_config(name_or_path: str, kv_cache_dtype: str = "auto") -> ModelConfig:
    """The :class:`ModelConfig` of a config.json (file, folder, shipped name, or
    ``org/name`` in the local Hugging Face cache); :class:`ModelConfigError` if bad."""
    raw, where = _locate(name_or_path)
    cfg: Mapping[str, Any] = raw
    if isinstance(raw.get("text_config"), dict):
        cfg = {**raw, **raw["text_config"]}
    layers = _int(cfg, "num_hidden_layers", where)
    heads = _int(cfg, "num_attention_heads", where)
    kv_heads = _int(cfg, "num_key_value_heads", where, default=heads)
    head_dim = _opt_int(cfg, "head_dim")
    if head_dim is None:
        head_dim = _int(cfg, "hidden_size", where) // heads
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    if dtype.removeprefix("torch.") not in _DTYPE_BYTES:
        raise ModelConfigError(
            f"{where}: dtype {dtype!r} unknown; known: {', '.join(sorted(_DTYPE_BYTES))}"
        )
    dtype_bytes = _DTYPE_BYTES[dtype.removeprefix("torch.")]
    if kv_cache_dtype not in _KV_DTYPES:
        raise ModelConfigError(
            f"kv cache dtype {kv_cache_dtype!r} unknown; known: {', '.join(_KV_DTYPES)}"
        )
    kv_bytes = _KV_DTYPES[kv_cache_dtype] or dtype_bytes
    lora = _opt_int(cfg, "kv_lora_rank")
    mla = None if lora is None else (lora, _int(cfg, "qk_rope_head_dim", where))
    params = _opt_int(cfg, "num_parameters") or count_parameters(cfg, head_dim, kv_heads)
    window = _opt_int(cfg, "sliding_window")
    if cfg.get("use_sliding_window") is False:
        window = None
    name = str(cfg.get("_name_or_path") or raw.get("_name_or_path") or name_or_path)
    return ModelConfig(
        name=name,
        num_layers=layers,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=dtype_bytes,
        num_parameters=params,
        max_position_embeddings=_opt_int(cfg, "max_position_embeddings"),
        mla=mla,
        sliding_window=window,
        kv_dtype_bytes=kv_bytes,
        source=where,
    )
