"""Configuration of the reference engine and its tiny model, validated on construction.

``EngineConfig`` mirrors the knobs of vLLM's ``EngineArgs`` that matter for prefix
caching (block size, pool size, batch budgets, chunked prefill) plus the one flag
that picks the prefix index; ``ModelConfig`` sizes the seeded random transformer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.validation import MAX_BLOCK_SIZE, MAX_BLOCKS, check_positive

__all__ = ["SUPPORTED_DTYPES", "EngineConfig", "EngineConfigError", "ModelConfig"]

SUPPORTED_DTYPES = (torch.float32, torch.float64)
"""Element types the engine runs in (float64 is the equal-KV oracle's)."""

_DTYPE_NAMES = MappingProxyType({"float32": torch.float32, "float64": torch.float64})


class EngineConfigError(PrefixKVError):
    """An engine or model setting is out of range, or a request cannot be served by it."""


def _positive_int(name: str, value: object, hi: int | None = None) -> int:
    return check_positive(name, value, hi, error=EngineConfigError)


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of the decoder-only transformer; its weights are drawn from ``seed``.

    Attributes:
        num_layers: transformer blocks.
        num_heads: query heads.
        num_kv_heads: key/value heads (grouped-query attention when fewer than
            ``num_heads``; must divide it).
        head_dim: per-head width (even, for rotary embeddings).
        vocab_size: token ids are ``0 .. vocab_size - 1``.
        intermediate_size: MLP width (default ``2 * num_heads * head_dim``).
        rope_theta: rotary embedding base.
        seed: seeds the weights; equal seeds give equal weights on every device.

    Raises:
        EngineConfigError: a non-positive size, an odd ``head_dim``, or
            ``num_kv_heads`` not dividing ``num_heads``.
    """

    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 32
    vocab_size: int = 512
    intermediate_size: int | None = None
    rope_theta: float = 10000.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            _positive_int(name, getattr(self, name))
        if self.intermediate_size is not None:
            _positive_int("intermediate_size", self.intermediate_size)
        if self.head_dim % 2:
            raise EngineConfigError(
                f"head_dim must be even for rotary embeddings, got {self.head_dim}"
            )
        if self.num_heads % self.num_kv_heads:
            raise EngineConfigError(
                f"num_kv_heads {self.num_kv_heads} must divide num_heads {self.num_heads}"
            )
        if not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 1:
            raise EngineConfigError(f"rope_theta must be a number > 1, got {self.rope_theta!r}")
        if type(self.seed) is not int:
            raise EngineConfigError(f"seed must be an int, got {self.seed!r}")

    @property
    def hidden_size(self) -> int:
        """Residual stream width: ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim

    @property
    def mlp_size(self) -> int:
        """The MLP width actually used."""
        return self.intermediate_size or 2 * self.hidden_size


@dataclass(frozen=True)
class EngineConfig:
    """Everything an :class:`~prefixkv.adapters.engine.Engine` is built from.

    Switching ``prefix_index`` is the only difference between backends: the
    scheduler, the model and the storage are the same code for all of them.

    Attributes:
        prefix_index: a registry name (``"hash_chain"``, ``"radix"``, ``"none"`` or a
            third-party backend); see :func:`~prefixkv.indexes.make_index`.
        block_size: tokens per KV block, which is also the index's hit granularity
            (the radix tree's page size). ``None`` takes the backend's default:
            16 for ``hash_chain`` and ``none``, 1 for ``radix``.
        index_options: extra keyword arguments for ``make_index`` (e.g. ``seed``).
        num_blocks: pool size in blocks (``num_blocks * block_size`` token slots).
        max_num_seqs: most requests running at once (vLLM ``max_num_seqs``).
        max_num_batched_tokens: most tokens computed in one step, prefill and
            decode together (vLLM ``max_num_batched_tokens``).
        enable_chunked_prefill: split prefills that exceed the step's token budget
            over several steps; without it a prefill must fit one step.
        model: the transformer's sizes and seed.
        dtype: ``torch.float32`` / ``torch.float64`` or their names.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a ``torch.device``.
        check_invariants: run ``CacheManager.check_invariants()`` after every step
            (tests; costs O(cached blocks) per step).

    Raises:
        EngineConfigError: a value out of range or of the wrong type.
    """

    prefix_index: str = "hash_chain"
    block_size: int | None = None
    index_options: Mapping[str, object] = field(default_factory=dict)
    num_blocks: int = 1024
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    model: ModelConfig = field(default_factory=ModelConfig)
    dtype: torch.dtype | str = torch.float32
    device: torch.device | str = "cpu"
    check_invariants: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.prefix_index, str) or not self.prefix_index:
            raise EngineConfigError(
                f"prefix_index must be a registry name (str), got {self.prefix_index!r}"
            )
        if self.block_size is not None:
            _positive_int("block_size", self.block_size, MAX_BLOCK_SIZE)
        if not isinstance(self.index_options, Mapping):
            raise EngineConfigError(f"index_options must be a mapping, got {self.index_options!r}")
        if "block_size" in self.index_options:
            raise EngineConfigError(
                "pass block_size as EngineConfig.block_size, not in index_options"
            )
        _positive_int("num_blocks", self.num_blocks, MAX_BLOCKS)
        _positive_int("max_num_seqs", self.max_num_seqs)
        _positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        for name in ("enable_chunked_prefill", "check_invariants"):
            if type(getattr(self, name)) is not bool:
                raise EngineConfigError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if not isinstance(self.model, ModelConfig):
            raise EngineConfigError(f"model must be a ModelConfig, got {self.model!r}")
        object.__setattr__(self, "dtype", _dtype(self.dtype))
        object.__setattr__(self, "device", _device(self.device))

    @property
    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as a ``torch.dtype``."""
        assert isinstance(self.dtype, torch.dtype)  # normalized in __post_init__
        return self.dtype

    @property
    def torch_device(self) -> torch.device:
        """``device`` as a ``torch.device``."""
        assert isinstance(self.device, torch.device)  # normalized in __post_init__
        return self.device


def _dtype(value: object) -> torch.dtype:
    dtype = _DTYPE_NAMES.get(value) if isinstance(value, str) else value
    if dtype not in SUPPORTED_DTYPES:
        raise EngineConfigError(f"dtype must be float32 or float64, got {value!r}")
    assert isinstance(dtype, torch.dtype)
    return dtype


def _device(value: object) -> torch.device:
    if not isinstance(value, (str, torch.device)):
        raise EngineConfigError(f"device must be a str or torch.device, got {value!r}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise EngineConfigError(f"device {value!r} is not a torch device") from None
    if device.type not in ("cpu", "cuda"):
        raise EngineConfigError(f"device must be cpu or cuda, got {value!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineConfigError(f"device {value!r} asked for, but CUDA is not available")
    return device
