"""``CacheManager.advance`` learns a block's tokens from a token array as from a list:
an ``array`` of the key's own type is taken as valid ids, any other array is checked."""

from __future__ import annotations

import random
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters import CacheManager
from prefixkv.indexes import InvalidTokenError, TokenKey, make_index
from prefixkv.indexes.tokens import TOKEN_TYPECODE
from prefixkv.storage import BlockAllocator

CACHING = ["hash_chain", "radix"]


def toks(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(0, 2**32) for _ in range(n)]


def decoded(name: str, prompt: list[int], out: list[int], as_array: bool) -> CacheManager:
    # Decode ``out`` a token a step, the request's whole sequence given each step.
    m = CacheManager(make_index(name, block_size=4), BlockAllocator(64))
    assert m.admit("A", prompt) is not None
    m.commit("A", len(prompt))
    seq = list(prompt)
    for t in out:
        seq.append(t)
        given_seq = array(TOKEN_TYPECODE, seq) if as_array else list(seq)
        assert m.advance("A", len(seq), len(seq), tokens=given_seq) is not None
    return m


@pytest.mark.parametrize("name", CACHING)
@settings(max_examples=25, deadline=None)
@given(
    n_prompt=st.integers(1, 13),
    n_out=st.integers(0, 13),
    seed=st.integers(0, 2**16),
)
def test_a_token_array_registers_what_a_list_does(
    name: str, n_prompt: int, n_out: int, seed: int
) -> None:
    prompt, out = toks(n_prompt, seed), toks(n_out, seed + 1)
    a, b = decoded(name, prompt, out, True), decoded(name, prompt, out, False)
    learned = list(a.key("A").tokens)  # up to the last block filled, or the prompt
    assert learned == list(b.key("A").tokens)
    assert learned == (prompt + out)[: max(len(prompt), (len(prompt + out) // 4) * 4)]
    assert a.num_computed_tokens("A") == b.num_computed_tokens("A")
    probe = TokenKey([*prompt, *out, 7])
    assert a.index.match_prefix(probe).num_tokens == b.index.match_prefix(probe).num_tokens
    a.check_invariants()
    b.check_invariants()


@pytest.mark.parametrize("name", CACHING)
@pytest.mark.parametrize(("typecode", "bad"), [("q", -1), ("q", 2**32), ("d", 1.5)])
def test_an_array_of_another_type_is_checked_before_a_block_is_added(
    name: str, typecode: str, bad: object
) -> None:
    m = CacheManager(make_index(name, block_size=2), BlockAllocator(16))
    prompt = toks(4, 16)
    assert m.admit("A", prompt) is not None
    m.commit("A", 4)
    before = (m.block_table("A"), list(m.key("A").tokens), m.allocator.num_free_blocks)
    with pytest.raises(InvalidTokenError):
        m.advance("A", 6, 6, tokens=array(typecode, [*prompt, 5, bad]))  # type: ignore[arg-type]
    assert (m.block_table("A"), list(m.key("A").tokens), m.allocator.num_free_blocks) == before
    m.check_invariants()
