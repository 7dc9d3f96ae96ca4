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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prefixkv.indexes.tokens import as_token_array

from .errors import SimInputError

__all__ = ["FILLER_TOKEN", "SimRequest", "sim_request"]

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
        if self.arrival is not None and (
            isinstance(self.arrival, bool)
            or not isinstance(self.arrival, (int, float))
            or not math.isfinite(self.arrival)
            or self.arrival < 0
        ):
            raise SimInputError(
                f"request {self.id!r}: arrival must be a finite number >= 0 seconds, "
                f"got {self.arrival!r}"
            )
        if self.after is not None and (not isinstance(self.after, str) or self.after == self.id):
            raise SimInputError(
                f"request {self.id!r}: after must be another request's id, got {self.after!r}"
            )
        if (
            isinstance(self.think_s, bool)
            or not isinstance(self.think_s, (int, float))
            or not math.isfinite(self.think_s)
            or self.think_s < 0
        ):
            raise SimInputError(
                f"request {self.id!r}: think_s must be a finite number >= 0, got {self.think_s!r}"
            )

    def output_token(self, i: int) -> int:
        """The ``i``-th generated token (0-based)."""
        return FILLER_TOKEN if self.output is None else self.output[i]


def sim_request(
    id: str,
    prompt: Iterable[int],
    output: Sequence[int] | int,
    arrival: float | None = None,
) -> SimRequest:
    """Build a :class:`SimRequest` from plain Python values (validated).

    Args:
        id: the request id.
        prompt: token ids.
        output: the generated tokens, or how many there are. An empty output (a
            prompt-only trace line) still generates one token, as an engine would.
        arrival: seconds, or ``None``.

    Raises:
        SimInputError: an empty prompt, a negative length or a bad arrival.
        InvalidTokenError: a token id that is not a non-negative int below 2**32.
    """
    tokens = as_token_array(prompt)
    if isinstance(output, int):
        if isinstance(output, bool) or output < 0:
            raise SimInputError(f"request {id!r}: output length must be >= 0, got {output!r}")
        return SimRequest(id, tokens, max(1, output), arrival)
    out = as_token_array(output)
    if not out:
        return SimRequest(id, tokens, 1, arrival)
    return SimRequest(id, tokens, len(out), arrival, out)
