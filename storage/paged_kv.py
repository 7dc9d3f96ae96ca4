"""The paged KV tensor every backend shares: one buffer, addressed by block tables.

Layout ``[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]`` (K then V),
written through a slot mapping and read through block tables, on CPU or CUDA with
the same torch code (nano-vllm's single KV buffer).
"""

from __future__ import annotations

from collections.abc import Sequence

from prefixkv.indexes.validation import (
    MAX_BLOCK_SIZE,
    MAX_BLOCKS,
    ceil_div,
    check_count,
    check_positive,
)

from .block_table import PAD_SLOT
from .errors import PrefixKVError, StorageShapeError
from .extras import TORCH_EXTRA, extra_imports

with extra_imports(*TORCH_EXTRA, "prefixkv.storage.PagedKVCache"):
    import torch

__all__ = ["PagedKVCache"]

IndexLike = Sequence[int] | torch.Tensor

_MAX_DIM = 2**16
"""Bound of the per-token sizes (layers, heads, head width): far above any model's."""


class PagedKVCache:
    """K and V for ``num_blocks`` blocks of ``block_size`` tokens, all layers.

    Args:
        num_layers, num_kv_heads, head_dim, num_blocks, block_size: sizes (> 0).
        dtype: element type (float32, float64, float16, bfloat16).
        device: ``"cpu"``, ``"cuda"`` or a ``torch.device``.

    Raises:
        PrefixKVError: a non-positive size.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.num_layers = check_positive("num_layers", num_layers, _MAX_DIM)
        self.num_kv_heads = check_positive("num_kv_heads", num_kv_heads, _MAX_DIM)
        self.head_dim = check_positive("head_dim", head_dim, _MAX_DIM)
        self.num_blocks = check_positive("num_blocks", num_blocks, MAX_BLOCKS)
        self.block_size = check_positive("block_size", block_size, MAX_BLOCK_SIZE)
        if not isinstance(dtype, torch.dtype):
            raise StorageShapeError(f"dtype must be a torch.dtype, got {dtype!r:.80}")
        self.dtype = dtype
        try:
            self.device = torch.device(device)
            self.kv = torch.zeros(
                2, num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                dtype=dtype, device=self.device,
            )  # fmt: skip
        except (RuntimeError, MemoryError, TypeError) as exc:
            # torch says "can't allocate memory" or "invalid device" as a RuntimeError.
            raise StorageShapeError(
                f"cannot make a KV cache of {num_layers} layers x {num_blocks} blocks x "
                f"{block_size} tokens x {num_kv_heads} heads x {head_dim} on {device!r}: "
                f"{' '.join(str(exc).split())[:200]}"
            ) from None
        self.num_slots = num_blocks * block_size

    def _flat(self, which: int, layer: int) -> torch.Tensor:
        # [num_slots, heads, dim] view of one layer's K (0) or V (1).
        return self.kv[which, layer].view(self.num_slots, self.num_kv_heads, self.head_dim)

    def _layer(self, layer: int) -> int:
        return check_count("layer", layer, self.num_layers - 1)

    def _index(self, values: IndexLike, what: str) -> torch.Tensor:
        t = torch.as_tensor(values, device=self.device)
        if t.dim() != 1:
            raise StorageShapeError(f"{what} must be 1-D, got shape {tuple(t.shape)}")
        if t.numel() and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
            raise StorageShapeError(f"{what} must hold integers, got dtype {t.dtype}")
        return t.to(torch.long)

    def key_cache(self, layer: int) -> torch.Tensor:
        """K of one layer, ``[num_blocks, block_size, heads, dim]`` (a view)."""
        return self.kv[0, self._layer(layer)]

    def value_cache(self, layer: int) -> torch.Tensor:
        """V of one layer, ``[num_blocks, block_size, heads, dim]`` (a view)."""
        return self.kv[1, self._layer(layer)]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slot_mapping: IndexLike) -> None:
        """Store the K/V of ``T`` tokens at their slots; slot ``-1`` skips a token.

        Args:
            layer: which layer.
            k, v: ``[T, num_kv_heads, head_dim]``.
            slot_mapping: ``T`` slot numbers (``block_id * block_size + offset``).

        Raises:
            StorageShapeError: shapes disagree.
            PrefixKVError: a slot is out of range.
        """
        self._layer(layer)
        slots = self._index(slot_mapping, "slot_mapping")
        want = (slots.numel(), self.num_kv_heads, self.head_dim)
        if tuple(k.shape) != want or tuple(v.shape) != want:
            raise StorageShapeError(
                f"k and v must be {want} for {slots.numel()} slots, got "
                f"{tuple(k.shape)} and {tuple(v.shape)}"
            )
        if slots.numel() == 0:
            return
        lo, hi = int(slots.min()), int(slots.max())
        if lo < PAD_SLOT or hi >= self.num_slots:
            bad = lo if lo < PAD_SLOT else hi
            raise PrefixKVError(f"slot {bad} is outside [0, {self.num_slots}) (or -1 to skip)")
        if lo == PAD_SLOT:
            keep = slots >= 0
            slots, k, v = slots[keep], k[keep], v[keep]
        self._flat(0, layer).index_copy_(0, slots, k.to(self.dtype))
        self._flat(1, layer).index_copy_(0, slots, v.to(self.dtype))

    def slots_for(self, block_table: IndexLike, num_tokens: int) -> torch.Tensor:
        """Slots of tokens ``0 .. num_tokens-1`` of a request (BB-4), as a tensor.

        Raises:
            PrefixKVError: the table is too short or holds an out-of-range block.
        """
        table = self._index(block_table, "block_table")
        check_count("num_tokens", num_tokens)
        if num_tokens > table.numel() * self.block_size:
            raise PrefixKVError(
                f"{num_tokens} tokens do not fit a {table.numel()}-block table "
                f"(block_size {self.block_size})"
            )
        nb = ceil_div(num_tokens, self.block_size)
        used = table[:nb]
        if nb and (int(used.min()) < 0 or int(used.max()) >= self.num_blocks):
            raise PrefixKVError(
                f"block table {used.tolist()} has ids outside [0, {self.num_blocks})"
            )
        offsets = torch.arange(self.block_size, device=self.device)
        slots = (used[:, None] * self.block_size + offsets[None, :]).reshape(-1)
        return slots[:num_tokens]

    def gather(
        self, layer: int, block_table: IndexLike, num_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a request's first ``num_tokens`` tokens, ``[num_tokens, heads, dim]``.

        Raises:
            PrefixKVError: bad layer, or the table does not cover the tokens.
        """
        self._layer(layer)
        slots = self.slots_for(block_table, num_tokens)
        return (
            self._flat(0, layer).index_select(0, slots),
            self._flat(1, layer).index_select(0, slots),
        )

    def copy_blocks(self, src: IndexLike, dst: IndexLike) -> None:
        """Copy whole blocks ``src[i] -> dst[i]`` in every layer (copy-on-write, swap-in).

        Raises:
            StorageShapeError: ``src`` and ``dst`` differ in length.
            PrefixKVError: an id is out of range or a destination repeats.
        """
        s = self._index(src, "src")
        d = self._index(dst, "dst")
        if s.numel() != d.numel():
            raise StorageShapeError(f"src has {s.numel()} blocks, dst has {d.numel()}")
        if s.numel() == 0:
            return
        for t, name in ((s, "src"), (d, "dst")):
            if int(t.min()) < 0 or int(t.max()) >= self.num_blocks:
                raise PrefixKVError(f"{name} {t.tolist()} has ids outside [0, {self.num_blocks})")
        if torch.unique(d).numel() != d.numel():
            raise PrefixKVError(f"dst {d.tolist()} repeats a block")
        self.kv[:, :, d] = self.kv[:, :, s]

    @property
    def nbytes(self) -> int:
        """Size of the KV buffer in bytes."""
        return self.kv.numel() * self.kv.element_size()
