"""The record every trace format yields, its errors, and the size limits readers enforce."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from prefixkv.indexes.errors import PrefixKVError
from prefixkv.indexes.tokens import as_token_array


class TraceFormatError(PrefixKVError):
    """A trace is malformed or unreadable; the message gives file, line and the fault."""


class TraceOptionError(PrefixKVError):
    """A reader option (``max_requests``, ``tokens_per_id``, a limit, ...) is invalid."""


class TraceRequest(NamedTuple):
    """One request of a trace: its prompt and output tokens (``array('I')`` from the
    readers), and where the format says them, its arrival in seconds from the trace's
    (or conversation's) start, its session, the request it continues, its turn (from 1)
    and the seconds between the previous turn's answer and it."""

    id: str
    tokens: Sequence[int]
    output: Sequence[int]
    arrival: float | None = None
    session: str | None = None
    parent: str | None = None
    turn: int | None = None
    think_s: float | None = None


def check_request_id(value: object) -> str:
    """A request id as a non-empty str that encodes as UTF-8 (ints become strs), else a
    TraceFormatError."""
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
    """A :class:`TraceRequest` with its tokens copied into ``array('I')``; a bad id or
    an empty prompt is a TraceFormatError, a bad token an InvalidTokenError."""
    rid = check_request_id(request_id)
    prompt = as_token_array(tokens)
    if not prompt:
        raise TraceFormatError(f"request {rid!r}: the prompt must not be empty")
    return TraceRequest(rid, prompt, as_token_array(output), arrival, session, parent, turn)


@dataclass(frozen=True, slots=True)
class TraceLimits:
    """Bounds on one request's tokens and one JSON line or document's bytes, checked
    before anything is built, so a small line that claims a huge size is a one-line error."""

    max_prompt_tokens: int = 2**21
    max_output_tokens: int = 2**17
    max_document_bytes: int = 512 * 2**20

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_output_tokens", "max_document_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise TraceOptionError(f"{name} must be a positive int, got {value!r}")

    def check(self, prompt: int, output: int, where: str) -> None:
        """Refuse a request of these sizes past a limit: a TraceFormatError after ``where``."""
        for what, length, limit in (
            ("prompt", prompt, self.max_prompt_tokens),
            ("output", output, self.max_output_tokens),
        ):
            if length > limit:
                raise TraceFormatError(
                    f"{where}: {what} of {length:,} tokens exceeds the limit of {limit:,} "
                    f"(--max-{what}-tokens)"
                )

    def line_bytes(self, numbers: int, number_bytes: int) -> tuple[int, str]:
        """The longest line a request within these limits can need (``numbers`` numbers
        of at most ``number_bytes`` bytes, plus 1 MiB for other fields), and what bounds it.
        """
        need = numbers * number_bytes + 2**20
        if need >= self.max_document_bytes:
            return self.max_document_bytes, "the document size limit"
        return need, (
            "more than a request within --max-prompt-tokens and --max-output-tokens needs"
        )


SESSION_ORDERS = ("interleaved", "sequential")
"""kv-cache-tester conversations: merged by time (concurrent agents), or one after another."""


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How a reader builds requests.

    Attributes:
        tokens_per_id: tokens each hash id stands for (``None``: the format's block size).
        vocab_size: token ids are drawn from ``[1, vocab_size)``.
        seed: selects the token content of hash ids.
        output: ``False`` empties every output (prompt-only replay).
        limits: size bounds checked before anything is built.
        block_cache_bytes: token bytes of recent hash-id blocks kept for reuse.
        sorted_arrivals: refuse a request that arrives before the one read before it
            (not checked for kv-cache-tester, whose times restart per conversation).
        session_order: kv-cache-tester conversations ``"interleaved"`` or ``"sequential"``.
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
        p, v, c = self.tokens_per_id, self.vocab_size, self.block_cache_bytes
        orders = ", ".join(SESSION_ORDERS)
        for name, ok, want in (
            ("session_order", self.session_order in SESSION_ORDERS, f"one of {orders}"),
            ("tokens_per_id", p is None or (type(p) is int and p > 0), "None or a positive int"),
            ("vocab_size", type(v) is int and v >= 2, "an int >= 2"),
            ("seed", type(self.seed) is int, "an int"),
            ("block_cache_bytes", type(c) is int and c >= 0, "an int >= 0"),
            ("limits", isinstance(self.limits, TraceLimits), "a TraceLimits"),
            ("sorted_arrivals", type(self.sorted_arrivals) is bool, "a bool"),
        ):
            if not ok:
                raise TraceOptionError(f"{name} must be {want}, got {getattr(self, name)!r}")


class ArrivalOrder:
    """Checks that requests come in arrival order (when ``enabled``), naming both places."""

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
