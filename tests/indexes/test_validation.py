"""check_block_ids against a model: what it accepts, and the value each refusal names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prefixkv.indexes.errors import BlockOwnershipError
from prefixkv.indexes.validation import check_block_ids

IDS = st.lists(
    st.one_of(
        st.integers(-3, 40),
        st.integers(-(2**70), 2**70),
        st.sampled_from([True, 1.0, "3", None]),
    ),
    max_size=12,
)


def model(ids: list[object], num_blocks: int, unique: bool) -> str | None:
    """The refusal's named value (as text), or None when the ids are accepted."""
    bad_type = [b for b in ids if type(b) is not int]
    if bad_type:
        return f"got {bad_type[0]!r}"
    ints = [b for b in ids if type(b) is int]
    if ints and (min(ints) < 0 or max(ints) >= num_blocks):
        return f"block {min(ints) if min(ints) < 0 else max(ints)} is not a block id"
    if unique and len(set(ints)) != len(ints):
        return "appears twice"
    return None


@given(IDS, st.integers(1, 40), st.booleans())
def test_check_block_ids_matches_the_model(
    ids: list[object], num_blocks: int, unique: bool
) -> None:
    expect = model(ids, num_blocks, unique)
    try:
        got = check_block_ids(ids, "op", num_blocks, unique=unique)
    except BlockOwnershipError as exc:
        assert expect is not None and expect in str(exc), (expect, str(exc))
    else:
        assert expect is None, expect
        assert got == ids and got is not ids
