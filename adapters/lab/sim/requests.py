"""The simulator's unit of work: a prompt, how much it decodes, and when it arrives."""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from prefixkv.indexes.tokens import as_token_array

from .errors import SimInputError

if TYPE_CHECKING:
    from ..traces import TraceRequest

__all__ = ["SimRequest", "from_trace"]

FILLER_TOKEN = 0
"""The id decoded when a request's output tokens are not known (its length is)."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of an arrival-time replay.

    ``arrival`` is ``None`` until :mod:`.arrivals` stamps it; ``output`` holds the
    generated tokens when the trace knows them (else :data:`FILLER_TOKEN` is decoded);
    closed loop, ``after`` names the request this one follows, by ``think_s``.

    Raises:
        SimInputError: a field out of range.
    """

    id: str
    prompt: array[int]
    output_len: int
    arrival: float | None = None
    output: array[int] | None = None
    after: str | None = None
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, array) or self.prompt.typecode != "I" or not self.prompt:
            self._bad(f"prompt must be a non-empty array('I'), got {self.prompt!r:.80}")
        if type(self.output_len) is not int or self.output_len < 1:
            self._bad(f"output_len must be an int >= 1, got {self.output_len!r}")
        if self.output is not None and len(self.output) != self.output_len:
            self._bad(f"{len(self.output)} output tokens but output_len {self.output_len}")
        if self.arrival is not None and not _is_seconds(self.arrival):
            self._bad(f"arrival must be a finite number >= 0 seconds, got {self.arrival!r}")
        if self.after is not None and (not isinstance(self.after, str) or self.after == self.id):
            self._bad(f"after must be another request's id, got {self.after!r}")
        if not _is_seconds(self.think_s):
            self._bad(f"think_s must be a finite number >= 0, got {self.think_s!r}")

    def _bad(self, what: str) -> NoReturn:
        raise SimInputError(f"request {self.id!r}: {what}")

    def output_token(self, i: int) -> int:
        """The ``i``-th generated token (0-based)."""
        return FILLER_TOKEN if self.output is None else self.output[i]


def _is_seconds(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def from_trace(
    requests: Iterable[TraceRequest],
    *,
    closed_loop: bool = False,
    output_tokens: bool = True,
    prefill_only: bool = False,
) -> Iterator[SimRequest]:
    """Trace requests as the simulator's, lazily; an empty output decodes one token.

    Closed loop, a turn follows its ``parent`` or its session's previous request;
    ``output_tokens=False`` decodes the filler; ``prefill_only`` one token each.

    Raises:
        SimInputError: an empty prompt.
        InvalidTokenError: a token id that is not a non-negative int below 2**32.
    """
    last: dict[str, str] = {}
    for r in requests:
        after = None
        if closed_loop:
            after = r.parent or (last.get(r.session) if r.session is not None else None)
            if r.session is not None:
                last[r.session] = r.id
        out = r.output
        output_len = 1 if prefill_only else max(1, len(out))
        kept = _tokens(out) if output_tokens and not prefill_only and len(out) else None
        think = (r.think_s or 0.0) if after is not None else 0.0
        yield SimRequest(
            r.id, _tokens(r.tokens), output_len, r.arrival, kept, after=after, think_s=think
        )


def _tokens(tokens: Sequence[int]) -> array[int]:
    # The trace's own array when it is one (read once), else a validated copy.
    if isinstance(tokens, array) and tokens.typecode == "I":
        return tokens
    return as_token_array(tokens)
