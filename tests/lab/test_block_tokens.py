"""Hash-id block expansion as properties: the LRU and the copy paths never change tokens.

A request's prompt is its blocks' tokens in order, cut to its length, however many of
them the LRU holds (none, some, all) and whichever path copies them out; a block's
tokens are a function of its name alone (each derived on its own, one name at a time).
"""

from __future__ import annotations

import hashlib
from array import array

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.traces.blocks import HEAD_TOKENS, BlockTokens, TokenDeriver

_PREFIX = "mooncake-block:0:"

requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 12), min_size=1, max_size=6),  # ids: repeats hit the LRU
        st.integers(0, 100),  # tokens cut from the last block, in percent of a block
    ),
    min_size=1,
    max_size=8,
)


_M64 = 2**64 - 1


def _splitmix64(z: int) -> int:
    z ^= z >> 30
    z = z * 0xBF58476D1CE4E5B9 & _M64
    z ^= z >> 27
    z = z * 0x94D049BB133111EB & _M64
    return z ^ z >> 31


def _reference(name: str, n: int, vocab: int) -> bytes:
    """The derivation as the module documents it, one token at a time in Python ints:
    SHAKE-128 words for the head, then xxh3 of the name mixed with step ``j``."""
    raw = name.encode()
    head = min(n, HEAD_TOKENS)
    words = hashlib.shake_128(raw).digest(4 * head)
    out = [
        int.from_bytes(words[4 * j : 4 * j + 4], "little") % (vocab - 1) + 1 for j in range(head)
    ]
    key = xxhash.xxh3_64_intdigest(raw)
    for j in range(head, n):
        step = _splitmix64((j + 1) * 0x9E3779B97F4A7C15 & _M64)
        z = ((key ^ step) * 0xBF58476D1CE4E5B9 & _M64) >> 32
        out.append((z * (vocab - 1) >> 32) + 1)
    return array("I", out).tobytes()


def _alone(deriver: TokenDeriver, name: str, n: int) -> bytes:
    got = deriver.named(name, n).tobytes()
    assert got == _reference(name, n, deriver.vocab_size)
    return got


@settings(max_examples=60, deadline=None)
@given(
    requests,
    st.sampled_from([1, 3, HEAD_TOKENS, HEAD_TOKENS + 1, 16, 64]),
    st.sampled_from([0, 1, 3, 100]),  # LRU entries (0: none kept)
    st.sampled_from(["", "conv-1"]),
    st.sampled_from([2, 7, 32000, 2**32]),
)
def test_a_prompt_is_its_blocks_cut_to_its_length_whatever_the_lru_holds(
    reqs: list[tuple[list[int], int]], per_id: int, entries: int, scope: str, vocab: int
) -> None:
    deriver = TokenDeriver(vocab)
    blocks = BlockTokens(deriver, _PREFIX, per_id, entries * (4 * per_id + 150))
    name = f"{_PREFIX}{scope}:" if scope else _PREFIX
    for ids, cut_percent in reqs:
        length = len(ids) * per_id - (per_id - 1) * cut_percent // 100
        got = blocks.prompt(scope, ids, length)
        whole = b"".join(_alone(deriver, f"{name}{h}", per_id) for h in ids)
        assert isinstance(got, array) and got.typecode == "I"
        assert got.tobytes() == whole[: 4 * length]
        assert all(1 <= t < vocab for t in got)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=5),
    st.integers(1, 40),
    st.sampled_from([2, 32000]),
)
def test_derived_rows_are_each_name_alone_and_named_is_one_row(
    names: list[str], n: int, vocab: int
) -> None:
    deriver = TokenDeriver(vocab)
    rows = deriver.rows(names, n)
    assert rows.shape == (len(names), n) and rows.flags["C_CONTIGUOUS"]
    for row, name in zip(rows, names, strict=True):
        assert row.tobytes() == _alone(TokenDeriver(vocab), name, n)
        assert deriver.named(name, n).tobytes() == row.tobytes()
