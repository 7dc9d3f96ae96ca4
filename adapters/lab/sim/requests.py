"""The simulator's unit of work: a prompt, how much it decodes, and when it arrives.

A :class:`SimRequest` is what an arrival-time replay consumes, in arrival order.
Its prompt is an ``array('I')`` (the storage ``TokenKey`` uses); its output is either
the tokens a trace recorded (so multi-turn prompts that quote them hit the cache, as
they would in the engine) or just a length. A turn of a session may name the request
it follows (``after``): replayed closed loop, it is sent only once that one finished,
plus its think time, as kv-cache-tester and AIPerf replay sessions.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixkv.indexes.tokens import as_token_array

from .errors import SimInputError

if TYPE_CHECKING:
    from ..traces import TraceRequest

__all__ = ["FILLER_TOKEN", "SimRequest", "from_trace"]

FILLER_TOKEN = 0
"""The id decoded when a request's output tokens are not known (its length is)."""


@dataclass(frozen=True, slots=True)
class SimRequest:
    """One request of an arrival-time replay.

    Attributes:
        id: unique within the run.
        prompt: the prompt's token ids, ``array('I')``, at least one.
        output_len: tokens to generate, at least 1 (the first comes with the prefill,
            as in vLLM and SGLang).
        arrival: seconds since the run's start, or ``None`` until an arrival process
            (:mod:`.arrivals`) stamps it.
        output: the generated tokens when the trace knows them (their K/V is cached
            like any other), else ``None`` and :data:`FILLER_TOKEN` is decoded.
        after: closed loop: the id of the request this one follows (its session's
            previous turn); it is sent no earlier than that request's finish plus
            ``think_s``, and no earlier than ``arrival``. ``None``: open loop.
        think_s: seconds between the previous turn's answer and this turn.
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
            raise SimInputError(
                f"request {self.id!r}: prompt must be a non-empty array('I'), "
                f"got {self.prompt!r:.80}"
            )
        if type(self.output_len) is not int or self.output_len < 1:
            raise SimInputError(
                f"request {self.id!r}: output_len must be an int >= 1, got {self.output_len!r}"
            )
        if self.output is not None and len(self.output) != self.output_len:
            raise SimInputError(
                f"request {self.id!r}: {len(self.output)} output tokens but "
                f"output_len {self.output_len}"
            )
        if self.arrival is not None and not _is_seconds(self.arrival):
            raise SimInputError(
                f"request {self.id!r}: arrival must be a finite number >= 0 seconds, "
                f"got {self.arrival!r}"
            )
        if self.after is not None and (not isinstance(self.after, str) or self.after == self.id):
            raise SimInputError(
                f"request {self.id!r}: after must be another request's id, got {self.after!r}"
            )
        if not _is_seconds(self.think_s):
            raise SimInputError(
                f"request {self.id!r}: think_s must be a finite number >= 0, got {self.think_s!r}"
            )

    def output_token(self, i: int) -> int:
        """The ``i``-th generated token (0-based)."""
        return FILLER_TOKEN if self.output is None else self.output[i]


def _is_seconds(value: object) -> bool:
    """A finite number of seconds >= 0 (a bool is not one)."""
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
    """Trace requests as the simulator's requests, lazily, in their order (each keeps
    its arrival, ``None`` until an arrival process stamps it).

    A request with an empty output still decodes one token, as an engine does.
    Closed loop, a turn follows its ``parent``, or else the previous request of its
    ``session``, after its think time (the trace's, else none).

    Args:
        requests: trace requests (``id``, ``tokens``, ``output``, ``arrival``,
            ``parent``, ``session``, ``think_s``).
        closed_loop: link each session's turns (see above); ``False``: open loop.
        output_tokens: decode the output tokens the trace recorded (a later prompt
            that quotes them hits the cache); ``False``: decode :data:`FILLER_TOKEN`
            as many times.
        prefill_only: one output token each (Mooncake's prefill pool), the filler.

    Raises:
        SimInputError: a request the simulator cannot run (an empty prompt).
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
    """``tokens`` as ``array('I')``: the trace's own array when it is one (a trace's
    requests are read once), else a validated copy."""
    if isinstance(tokens, array) and tokens.typecode == "I":
        return tokens
    return as_token_array(tokens)
