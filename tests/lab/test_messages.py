"""Error messages on one line (``prefixkv.adapters.lab.messages``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from prefixkv.adapters.lab.messages import one_line


@given(st.text(), st.integers(min_value=4, max_value=300))
def test_a_message_is_one_line_within_its_limit(text: str, limit: int) -> None:
    out = one_line(text, limit)
    assert out == " ".join(out.split())  # one line, single spaces, no edge space
    assert len(out) <= limit
    flat = " ".join(text.split())
    assert out == flat if len(flat) <= limit else out == flat[: limit - 3] + "..."


def test_a_long_message_is_cut_with_an_ellipsis() -> None:
    assert one_line("a\n  b\tc") == "a b c"
    assert one_line("x" * 200, 10) == "xxxxxxx..."
