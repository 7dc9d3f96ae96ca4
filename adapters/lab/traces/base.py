"""The record every trace format yields, its errors, and the size limits readers enforce.

A :class:`TraceRequest` carries compact token arrays (``array('I')``), never Python int
lists, plus what a trace says about time and sessions: the arrival in seconds and the
session/parent/turn links where the format has them (Qwen-Bailian's ``chat_id``
chain, a Claude Code conversation and its sub-agents).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.tokens import as_token_array

__all__ = [
    "LINE_SLACK_BYTES",
    "ArrivalOrder",
    "ReadSettings",
    "TraceFormatError",
    "TraceLimits",
    "TraceOptionError",
    "TraceRequest",
    "check_request_id",
    "make_request",
    "tokens_of",
]


class TraceFormatError(PrefixKVError):
    """A trace is malformed or unreadable; the message gives file, line and the fault."""


class TraceOptionError(PrefixKVError):
    """A reader option (``max_requests``, ``tokens_per_id``, a limit, ...) is invalid."""


class TraceRequest(NamedTuple):
    """One request of a trace.

    Attributes:
        id: unique request id (non-empty, encodable as UTF-8).
        tokens: the prompt's token ids (non-empty); readers give ``array('I')``.
        output: the token ids decoded after the prompt (may be empty).
        arrival: arrival time in seconds from the trace's (or, for per-conversation
            traces, the conversation's) start; ``None`` when the format has none.
        session: the conversation the request belongs to, where the format says.
        parent: the id of the request this one continues (the previous turn).
        turn: the turn number within its session (1 for the first).
        think_s: seconds between the previous turn's answer and this request, where
            the trace says (kv-cache-tester's ``think_time``); closed-loop replay
            waits that long after the previous turn finished.
    """

    id: str
    tokens: Sequence[int]
    output: Sequence[int]
    arrival: float | None = None
    session: str | None = None
    parent: str | None = None
    turn: int | None = None
    think_s: float | None = None


def tokens_of(values: Iterable[int]) -> array[int]:
    """Token ids as a fresh ``array('I')`` (validated).

    Raises:
        InvalidTokenError: an id that is not an int in ``[0, 2**32)``.
    """
    return as_token_array(values)


def check_request_id(value: object) -> str:
    """A request id as a non-empty str that encodes as UTF-8 (ints become strs).

    Checked when a request is read, so an id a result file cannot hold (a lone
    surrogate) fails at load, not after the run.

    Raises:
        TraceFormatError: a bool, an empty or non-str/int id, or one with a lone
            surrogate; the message holds no file position (callers add it).
    """
    if type(value) is int:
        return str(value)
    if not isinstance(value, str) or not value:
        raise TraceFormatError(f'"id" must be a non-empty str or an int, got {value!r:.80}')
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise TraceFormatError(
            f'"id" {value!r:.80} holds a lone surrogate and cannot be written as UTF-8'
        ) from None
    return value


def make_request(
    request_id: str,
    tokens: Iterable[int],
    output: Iterable[int] = (),
    *,
    arrival: float | None = None,
    session: str | None = None,
    parent: str | None = None,
    turn: int | None = None,
) -> TraceRequest:
    """A validated :class:`TraceRequest` with its tokens copied into ``array('I')``.

    Raises:
        TraceFormatError: a bad id or an empty prompt.
        InvalidTokenError: a bad token id.
    """
    rid = check_request_id(request_id)
    prompt = tokens_of(tokens)
    if not prompt:
        raise TraceFormatError(f"request {rid!r}: the prompt must not be empty")
    return TraceRequest(rid, prompt, tokens_of(output), arrival, session, parent, turn)


@dataclass(frozen=True, slots=True)
class TraceLimits:
    """Bounds on what one trace request may ask for, checked before anything is built.

    A trace line is small but may claim huge sizes (a 76-byte Mooncake line with
    ``output_length`` 10**9); these limits turn such a line into a one-line error
    instead of gigabytes of tokens. The defaults cover today's longest contexts.

    Attributes:
        max_prompt_tokens: most prompt tokens of one request (default 2**21 = 2,097,152).
        max_output_tokens: most output tokens of one request (default 2**17 = 131,072).
        max_document_bytes: most bytes of one JSON line or document (default 512 MiB).
    """

    max_prompt_tokens: int = 2**21
    max_output_tokens: int = 2**17
    max_document_bytes: int = 512 * 2**20

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_output_tokens", "max_document_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise TraceOptionError(f"{name} must be a positive int, got {value!r}")

    def check_prompt(self, length: int) -> str | None:
        """The fault of a prompt of ``length`` tokens, or ``None`` when it is within bounds."""
        return _over_limit("prompt", length, self.max_prompt_tokens)

    def check_output(self, length: int) -> str | None:
        """The fault of an output of ``length`` tokens, or ``None`` when it is within bounds."""
        return _over_limit("output", length, self.max_output_tokens)

    def line_bytes(self, numbers: int, number_bytes: int) -> tuple[int, str]:
        """The longest line a request within these limits can need, and what bounds it.

        A line listing ``numbers`` numbers of at most ``number_bytes`` bytes each
        (digits and a ``", "``), plus 1 MiB for its other fields; at most
        ``max_document_bytes``. Reading stops there, so a line claiming a huge
        request costs this much, not its size.
        """
        need = numbers * number_bytes + LINE_SLACK_BYTES
        if need >= self.max_document_bytes:
            return self.max_document_bytes, "the document size limit"
        return need, (
            "more than a request within --max-prompt-tokens and --max-output-tokens needs"
        )


def _over_limit(what: str, length: int, limit: int) -> str | None:
    if length <= limit:
        return None
    return f"{what} of {length:,} tokens exceeds the limit of {limit:,} (--max-{what}-tokens)"


LINE_SLACK_BYTES = 2**20
"""What :meth:`TraceLimits.line_bytes` allows a line beyond its numbers (ids, other keys)."""

SESSION_ORDERS = ("interleaved", "sequential")
"""How kv-cache-tester conversations are ordered: merged by time, or one after another."""


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How a reader builds requests: token content of hash ids, outputs, size limits.

    Attributes:
        tokens_per_id: tokens each id stands for (``None``: the format's block size).
        vocab_size: ids are drawn from ``[1, vocab_size)``.
        seed: selects the token content.
        output: ``False`` empties every output (prompt-only replay).
        limits: size bounds checked before anything is built.
        sorted_arrivals: refuse, at its ``file:line``, a request that arrives before
            the one read before it (what a replay at the trace's own timestamps, e.g.
            under a time scale, needs); formats whose times restart per conversation
            (kv-cache-tester) are not checked.
        block_cache_bytes: token bytes of recently expanded hash-id blocks kept for
            reuse (default 4 MiB); the reader's only memory that outlives a request.
        session_order: kv-cache-tester conversations ``"interleaved"`` by their time
            from their start, as concurrent agents (the default), or
            ``"sequential"``, one after another.
    """

    tokens_per_id: int | None = None
    vocab_size: int = 32000
    seed: int = 0
    output: bool = True
    limits: TraceLimits = TraceLimits()
    block_cache_bytes: int = 4 * 2**20
    sorted_arrivals: bool = False
    session_order: str = "interleaved"

    def __post_init__(self) -> None:
        if self.session_order not in SESSION_ORDERS:
            raise TraceOptionError(
                f"session_order must be one of {', '.join(SESSION_ORDERS)}, "
                f"got {self.session_order!r}"
            )
        per_id = self.tokens_per_id
        if per_id is not None and (type(per_id) is not int or per_id < 1):
            raise TraceOptionError(f"tokens_per_id must be None or a positive int, got {per_id!r}")
        if type(self.vocab_size) is not int or self.vocab_size < 2:
            raise TraceOptionError(f"vocab_size must be an int >= 2, got {self.vocab_size!r}")
        if type(self.seed) is not int:
            raise TraceOptionError(f"seed must be an int, got {self.seed!r}")
        if type(self.block_cache_bytes) is not int or self.block_cache_bytes < 0:
            raise TraceOptionError(
                f"block_cache_bytes must be an int >= 0, got {self.block_cache_bytes!r}"
            )
        if not isinstance(self.limits, TraceLimits):
            raise TraceOptionError(f"limits must be a TraceLimits, got {self.limits!r}")
        if type(self.sorted_arrivals) is not bool:
            raise TraceOptionError(f"sorted_arrivals must be a bool, got {self.sorted_arrivals!r}")


class ArrivalOrder:
    """Checks that requests come in arrival order, naming both places when not.

    Args:
        enabled: ``False`` makes :meth:`check` do nothing.
    """

    __slots__ = ("_enabled", "_last", "_where")

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._last: float | None = None
        self._where = ""

    def check(self, arrival: float | None, where: str, request_id: str) -> None:
        """Accept ``arrival`` (``None``: none said) if no earlier than the last one.

        Raises:
            TraceFormatError: ``where``, the request, both times and the earlier place.
        """
        if not self._enabled or arrival is None:
            return
        if self._last is not None and arrival < self._last:
            raise TraceFormatError(
                f"{where}: request {request_id!r} arrives at {arrival:g} s, before the request "
                f"at {self._where} ({self._last:g} s); a replay at the trace's own times needs "
                "it sorted by arrival (sort the file, or give a request rate instead)"
            )
        self._last, self._where = arrival, where
