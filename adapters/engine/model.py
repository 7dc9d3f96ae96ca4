"""A tiny decoder-only transformer whose attention reads K/V only through block tables.

Pre-norm blocks (RMSNorm, rotary multi-/grouped-query attention, SwiGLU MLP) with
seeded random weights, in the shape of nano-vllm's ``Qwen3`` model: new K/V go into
the shared :class:`PagedKVCache` through the slot mapping, and attention gathers past
K/V back through the request's block table, so the cache is the only copy of the KV.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.storage.block_table import slot_mapping
from prefixkv.storage.paged_kv import PagedKVCache

from .config import ModelConfig

__all__ = ["ReferenceOutput", "SeqChunk", "TinyTransformer"]


class SeqChunk(NamedTuple):
    """One request's share of a forward pass: a run of new tokens.

    Attributes:
        token_ids: the tokens to compute (a prefill chunk, or one decode token).
        start: position of ``token_ids[0]``; tokens ``0 .. start-1`` have K/V in
            the cache already (a prefix hit, earlier chunks, earlier decode steps).
        block_table: the request's blocks, covering ``start + len(token_ids)`` tokens.
    """

    token_ids: Sequence[int]
    start: int
    block_table: Sequence[int]


class ReferenceOutput(NamedTuple):
    """A whole sequence computed alone in one pass with no cache (the oracle).

    Attributes:
        keys: per layer, ``[num_tokens, num_kv_heads, head_dim]`` (after rotary).
        values: per layer, ``[num_tokens, num_kv_heads, head_dim]``.
        logits: ``[num_tokens, vocab_size]``; row ``t`` predicts token ``t + 1``.
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    logits: torch.Tensor


class _Layer(NamedTuple):
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


class TinyTransformer:
    """Seeded random decoder-only transformer over a paged KV cache.

    The weights are drawn in float64 on the CPU from ``config.seed`` and then cast
    and moved, so a given seed means the same model on every device and dtype
    (up to rounding). No autograd: weights never require grad.

    Args:
        config: the sizes and seed.
        dtype: element type of weights and activations.
        device: where the weights live (the KV cache must be on the same device).
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        gen = torch.Generator().manual_seed(config.seed)
        hidden, mlp = config.hidden_size, config.mlp_size
        q_width = config.num_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim

        def draw(*shape: int, scale: float) -> torch.Tensor:
            t = torch.randn(*shape, generator=gen, dtype=torch.float64) * scale
            return t.to(device=self.device, dtype=dtype)

        def norm_weight() -> torch.Tensor:
            # Not all ones, so a wrong norm weight would show.
            return 1.0 + draw(hidden, scale=0.1)

        self.embed = draw(config.vocab_size, hidden, scale=1.0)
        self.layers = [
            _Layer(
                attn_norm=norm_weight(),
                wq=draw(hidden, q_width, scale=hidden**-0.5),
                wk=draw(hidden, kv_width, scale=hidden**-0.5),
                wv=draw(hidden, kv_width, scale=hidden**-0.5),
                wo=draw(q_width, hidden, scale=q_width**-0.5),
                mlp_norm=norm_weight(),
                w_gate=draw(hidden, mlp, scale=hidden**-0.5),
                w_up=draw(hidden, mlp, scale=hidden**-0.5),
                w_down=draw(mlp, hidden, scale=mlp**-0.5),
            )
            for _ in range(config.num_layers)
        ]
        self.final_norm = norm_weight()
        # A wide logit spread keeps greedy argmax far from ties in float32 too.
        self.lm_head = draw(hidden, config.vocab_size, scale=4.0 * hidden**-0.5)
        half = config.head_dim // 2
        exponent = torch.arange(half, dtype=torch.float64) / half
        self._inv_freq = (config.rope_theta**-exponent).to(self.device)

    def make_kv_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """A paged KV cache shaped for this model, on its device and dtype."""
        c = self.config
        return PagedKVCache(
            c.num_layers, c.num_kv_heads, c.head_dim, num_blocks, block_size,
            dtype=self.dtype, device=self.device,
        )  # fmt: skip

    # ------------------------------------------------------------ building blocks

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float64 whatever the dtype, so a position's rotation does not
        # depend on which other positions share the pass.
        angles = positions.to(torch.float64)[:, None] * self._inv_freq[None, :]
        return angles.cos().to(self.dtype)[:, None, :], angles.sin().to(self.dtype)[:, None, :]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv(
        self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.config
        n = x.shape[0]
        h = self._rms_norm(x, layer.attn_norm)
        q = (h @ layer.wq).view(n, c.num_heads, c.head_dim)
        k = (h @ layer.wk).view(n, c.num_kv_heads, c.head_dim)
        v = (h @ layer.wv).view(n, c.num_kv_heads, c.head_dim)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin), v

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int
    ) -> torch.Tensor:
        """Causal attention of ``n`` queries at ``start ..`` over keys ``0 .. start+n-1``.

        Args:
            q: ``[n, num_heads, head_dim]``.
            k, v: ``[start + n, num_kv_heads, head_dim]``.
            start: position of the first query.

        Returns:
            ``[n, num_heads * head_dim]``.
        """
        c = self.config
        n, total = q.shape[0], k.shape[0]
        group = c.num_heads // c.num_kv_heads
        qg = q.view(n, c.num_kv_heads, group, c.head_dim).permute(1, 2, 0, 3)
        kt = k.permute(1, 2, 0)[:, None]  # [kv_heads, 1, dim, total]
        scores = (qg @ kt) * (1.0 / math.sqrt(c.head_dim))  # [kv_heads, group, n, total]
        query_pos = torch.arange(start, start + n, device=q.device)[:, None]
        key_pos = torch.arange(total, device=q.device)[None, :]
        scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = probs @ v.permute(1, 0, 2)[:, None]  # [kv_heads, group, n, dim]
        return out.permute(2, 0, 1, 3).reshape(n, c.num_heads * c.head_dim)

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        h = self._rms_norm(x, layer.mlp_norm)
        return (torch.nn.functional.silu(h @ layer.w_gate) * (h @ layer.w_up)) @ layer.w_down

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self._rms_norm(x, self.final_norm) @ self.lm_head

    # -------------------------------------------------------------------- passes

    def forward(self, chunks: Sequence[SeqChunk], kv_cache: PagedKVCache) -> torch.Tensor:
        """Compute a batch of chunks over the paged cache; return each chunk's last logits.

        For every layer, the chunks' new K/V are written through their slot
        mappings first, then each chunk's queries attend over K/V gathered through
        its block table (cached prefix, earlier chunks and its own new tokens),
        with a causal mask. The dense parts run on all chunks' tokens at once.

        Args:
            chunks: one per request, each with at least one token.
            kv_cache: the shared paged cache (this model's shape, device, dtype).

        Returns:
            ``[len(chunks), vocab_size]``: logits after each chunk's last token.

        Raises:
            PrefixKVError: no chunks or an empty one; a table too short (storage).
        """
        if not chunks or min(len(c.token_ids) for c in chunks) == 0:
            raise PrefixKVError(f"forward needs chunks of at least one token, got {list(chunks)!r}")
        bs = kv_cache.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for chunk in chunks:
            end = chunk.start + len(chunk.token_ids)
            token_ids.extend(chunk.token_ids)
            positions.extend(range(chunk.start, end))
            slots.extend(slot_mapping(chunk.block_table, chunk.start, end, bs))
        dev = self.device
        ids = torch.tensor(token_ids, dtype=torch.long, device=dev)
        slot_tensor = torch.tensor(slots, dtype=torch.long, device=dev)
        tables = [torch.tensor(list(c.block_table), dtype=torch.long, device=dev) for c in chunks]
        cos, sin = self._rotary(torch.tensor(positions, device=dev))
        x = self.embed[ids]
        for index, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, cos, sin)
            kv_cache.write(index, k, v, slot_tensor)
            parts = []
            offset = 0
            for chunk, table in zip(chunks, tables, strict=True):
                n = len(chunk.token_ids)
                past_k, past_v = kv_cache.gather(index, table, chunk.start + n)
                parts.append(self._attend(q[offset : offset + n], past_k, past_v, chunk.start))
                offset += n
            x = x + torch.cat(parts) @ layer.wo
            x = x + self._mlp(layer, x)
        ends = torch.cumsum(torch.tensor([len(c.token_ids) for c in chunks], device=dev), 0) - 1
        return self._logits(x[ends])

    def reference_forward(self, token_ids: Sequence[int]) -> ReferenceOutput:
        """Compute one whole sequence alone, in one pass, with plain causal attention.

        No paged cache and no block table are involved: this is the oracle the
        engine's paged, prefix-cached passes are compared with (SPEC BB-6).

        Args:
            token_ids: the sequence (at least one token).

        Returns:
            Every layer's K and V and every position's logits.

        Raises:
            PrefixKVError: an empty sequence.
        """
        if not len(token_ids):
            raise PrefixKVError("reference_forward needs at least one token, got none")
        dev = self.device
        ids = torch.tensor(list(token_ids), dtype=torch.long, device=dev)
        cos, sin = self._rotary(torch.arange(len(ids), device=dev))
        x = self.embed[ids]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, cos, sin)
            keys.append(k)
            values.append(v)
            x = x + self._attend(q, k, v, 0) @ layer.wo
            x = x + self._mlp(layer, x)
        return ReferenceOutput(keys, values, self._logits(x))
