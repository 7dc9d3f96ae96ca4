"""The storage layer: block allocator order and ownership, the paged KV tensor, and
block-table addressing (SPEC BB-4). CUDA variants run when a GPU is present."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES

from prefixkv.indexes import BlockOwnershipError
from prefixkv.storage import BlockAllocator, pad_block_tables, slot_mapping, token_slot
from prefixkv.storage.allocator import Owner
from prefixkv.storage.paged_kv import PagedKVCache


def test_allocator_hands_out_in_id_order_and_reuses_freed_blocks_first() -> None:
    a = BlockAllocator(6)
    assert a.allocate(2) == [0, 1]
    assert a.allocate(2) == [2, 3]
    a.free([1, 0])
    assert a.free_block_ids() == [1, 0, 4, 5]
    assert a.allocate(3) == [1, 0, 4]
    a.check_invariants()


def test_allocator_is_all_or_nothing() -> None:
    a = BlockAllocator(3)
    assert a.allocate(4) is None
    assert a.num_free_blocks == 3
    assert a.allocate(0) == []


@pytest.mark.parametrize("bad", [[7], [-1], [0, 0], [True]])
def test_allocator_rejects_foreign_repeated_and_double_frees(bad: list[int]) -> None:
    a = BlockAllocator(4)
    a.allocate(4)
    with pytest.raises(BlockOwnershipError, match=str(bad[0])):
        a.free(bad)
    assert a.num_free_blocks == 0
    a.free([2])
    with pytest.raises(BlockOwnershipError, match="double free of block 2"):
        a.free([3, 2])
    assert a.free_block_ids() == [2]  # the valid id 3 was not freed either


@pytest.mark.parametrize("bad", [[0, 1, 0], [0, 1, 9], [0, 1, "x"], [0, 1, 3]])
def test_a_refused_free_or_transfer_changes_no_owner(bad: list[object]) -> None:
    # The valid ids before the bad one are checked and retagged in one pass; the
    # refusal must undo them (a repeat, another pool's id, a non-int, a caller's block).
    a = BlockAllocator(8)
    mine = a.allocate(3, owner=Owner.MANAGER)
    theirs = a.allocate(1)
    assert mine == [0, 1, 2] and theirs == [3]
    before = [a.owner_of(b) for b in range(4)], a.free_block_ids()
    with pytest.raises(BlockOwnershipError):
        a.free(bad, owner=Owner.MANAGER)  # type: ignore[arg-type]
    assert ([a.owner_of(b) for b in range(4)], a.free_block_ids()) == before
    with pytest.raises(BlockOwnershipError):
        a.transfer(bad, src=Owner.MANAGER, dst=Owner.CALLER)  # type: ignore[arg-type]
    assert ([a.owner_of(b) for b in range(4)], a.free_block_ids()) == before
    a.check_invariants()


def test_bb_04_slot_positions() -> None:
    table = [7, 3, 9, 4, 11]
    assert token_slot(table, 16, 16) == 3 * 16 + 0  # token 16 -> entry 1, slot 0
    assert token_slot(table, 79, 16) == 11 * 16 + 15  # token 79 -> entry 4, slot 15
    assert slot_mapping(table, 14, 18, 16) == [7 * 16 + 14, 7 * 16 + 15, 48, 49]
    assert pad_block_tables([[1], [2, 3, 4]]) == [[1, -1, -1], [2, 3, 4]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_write_then_gather_through_a_block_table(device: str, dtype: torch.dtype) -> None:
    kv = PagedKVCache(2, 2, 4, num_blocks=8, block_size=4, dtype=dtype, device=device)
    table = [5, 2, 7]
    n = 10
    k = torch.randn(n, 2, 4, dtype=dtype, device=device)
    v = torch.randn(n, 2, 4, dtype=dtype, device=device)
    kv.write(1, k, v, slot_mapping(table, 0, n, 4))
    gk, gv = kv.gather(1, table, n)
    assert torch.equal(gk, k) and torch.equal(gv, v)
    assert torch.equal(kv.key_cache(1)[5, 0], k[0])  # block 5 holds tokens 0..3
    assert kv.key_cache(0).abs().sum() == 0  # the other layer is untouched


@pytest.mark.parametrize("device", DEVICES)
def test_slot_minus_one_skips_a_token(device: str) -> None:
    kv = PagedKVCache(1, 1, 2, num_blocks=2, block_size=2, device=device)
    k = torch.ones(3, 1, 2, device=device)
    kv.write(0, k, k * 2, [0, -1, 3])
    flat = kv.key_cache(0).reshape(4, 1, 2)
    assert flat[:, 0, 0].tolist() == [1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("device", DEVICES)
def test_copy_blocks(device: str) -> None:
    kv = PagedKVCache(2, 1, 2, num_blocks=4, block_size=2, device=device)
    kv.kv.copy_(torch.arange(kv.kv.numel(), dtype=torch.float32).view_as(kv.kv))
    before = kv.kv.clone()
    kv.copy_blocks([0, 1], [3, 2])
    assert torch.equal(kv.kv[:, :, 3], before[:, :, 0])
    assert torch.equal(kv.kv[:, :, 2], before[:, :, 1])
    assert torch.equal(kv.kv[:, :, :2], before[:, :, :2])


def test_kv_layout() -> None:
    kv = PagedKVCache(3, 2, 8, num_blocks=5, block_size=16, dtype=torch.float16)
    assert tuple(kv.kv.shape) == (2, 3, 5, 16, 2, 8)
    assert kv.nbytes == 2 * 3 * 5 * 16 * 2 * 8 * 2
