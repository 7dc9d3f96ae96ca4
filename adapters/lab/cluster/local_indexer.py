"""What a replica's own events say it holds: Dynamo's local indexer, for dumps and checks."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from prefixkv.adapters.events.wire import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from prefixkv.adapters.router.cluster_index import wire_int
from prefixkv.indexes.tokens import TOKEN_BYTES, TOKEN_TYPECODE

__all__ = ["KVEvent", "LocalIndexer"]

KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class _Block:
    parent: int | None
    tokens: bytes
    depth: int
    copies: int = 1


class LocalIndexer:
    """The blocks a replica's events announced, with copies, parent and tokens (Dynamo's
    ``LocalKvIndexer``), for dumps; without ``keep_tokens``, a dump is hash-only."""

    __slots__ = ("_blocks", "block_size", "keep_tokens")

    def __init__(self, block_size: int, *, keep_tokens: bool = True) -> None:
        self.block_size = block_size
        self.keep_tokens = keep_tokens
        self._blocks: dict[int, _Block] = {}

    def apply(self, events: list[KVEvent]) -> None:
        """Follow the replica's events. O(blocks in them)."""
        blocks = self._blocks
        for event in events:
            if isinstance(event, BlockStored):
                parent = (
                    None if event.parent_block_hash is None else wire_int(event.parent_block_hash)
                )
                up = blocks.get(parent) if parent is not None else None
                depth = 0 if up is None else up.depth + 1
                data = b""
                if self.keep_tokens and event.token_ids:
                    data = array(TOKEN_TYPECODE, event.token_ids).tobytes()
                step = self.block_size * TOKEN_BYTES
                for i, h in enumerate(event.block_hashes):
                    key = wire_int(h)
                    held = blocks.get(key)
                    if held is None:
                        blocks[key] = _Block(parent, data[i * step : (i + 1) * step], depth)
                    else:
                        held.copies += 1
                    parent = key
                    depth += 1
            elif isinstance(event, BlockRemoved):
                for key in map(wire_int, event.block_hashes):
                    held = blocks.get(key)
                    if held is not None:
                        held.copies -= 1
                        if not held.copies:
                            del blocks[key]
            elif isinstance(event, AllBlocksCleared):
                blocks.clear()

    def held(self) -> dict[int, int]:
        """Hash -> copies (a new dict). O(blocks)."""
        return {h: b.copies for h, b in self._blocks.items()}

    def prefix(self, hashes: list[int]) -> int:
        """Leading hashes held. O(prefix)."""
        return next((n for n, h in enumerate(hashes) if h not in self._blocks), len(hashes))

    def dump_events(self) -> list[KVEvent]:
        """The held blocks as ``BlockStored`` events, parents first, each repeated per
        copy. O(blocks log blocks)."""
        bs = self.block_size
        return [
            BlockStored(
                [h],
                b.parent,
                list(array(TOKEN_TYPECODE, b.tokens)),
                bs,
                None,
                MEDIUM_GPU,
                None,
                group_idx=0,
            )
            for h, b in sorted(self._blocks.items(), key=lambda item: item[1].depth)
            for _ in range(b.copies)
        ]
