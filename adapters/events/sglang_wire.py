"""SGLang 0.5.23's KV-event structs (``sglang/srt/disaggregation/kv_events.py``).

Same shape as vLLM's (tagged msgpack maps in a positional batch), with differences
a consumer must know: the batch's third field is ``attn_dp_rank`` and is always
written (``nil`` when unset); hashes are *signed* 64-bit ints (the first 16 hex
digits of a SHA-256 page hash, ``hash_str_to_int64``); ``BlockStored`` has
``cache_salt`` and no ``extra_keys``/``group_idx``; ``medium`` and ``lora_name`` are
omitted when unset; mediums are ``GPU``, ``CPU_PINNED``, ``DISK`` and ``EXTERNAL``.
Used to re-encode SGLang batches byte for byte; :mod:`.codec` maps them onto the
vLLM structs for consumers.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "SGLANG_MEDIUMS",
    "SGLangAllBlocksCleared",
    "SGLangBlockRemoved",
    "SGLangBlockStored",
    "SGLangEventBatch",
]

SGLANG_MEDIUMS = ("GPU", "CPU_PINNED", "DISK", "EXTERNAL")
"""SGLang's ``StorageMedium`` values, device memory to remote pool."""


class _SGLangEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class SGLangBlockStored(_SGLangEvent, tag="BlockStored"):
    """SGLang's ``BlockStored``: one chain of pages after ``parent_block_hash``."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None
    cache_salt: str | None = None
    session_id: str | None = None
    lora_name: str | None = None


class SGLangBlockRemoved(_SGLangEvent, tag="BlockRemoved"):
    """SGLang's ``BlockRemoved``: the pages of one evicted radix node."""

    block_hashes: list[int]
    medium: str | None = None


class SGLangAllBlocksCleared(_SGLangEvent, tag="AllBlocksCleared"):
    """SGLang's ``AllBlocksCleared`` (tree reset)."""


class SGLangEventBatch(msgspec.Struct, array_like=True, gc=False):
    """SGLang's ``KVEventBatch``: ``[ts, events, attn_dp_rank]``, the rank always written."""

    ts: float
    events: list[SGLangBlockStored | SGLangBlockRemoved | SGLangAllBlocksCleared]
    attn_dp_rank: int | None = None
