"""The live fleet's trace: chat sessions over shared system prompts, deterministic.

Each session opens with one of a few system prompts and goes on for some turns; turn
``t``'s prompt is the whole conversation so far (the system prompt, then each earlier
turn's user and assistant tokens) and this turn's user tokens, the shape of
Mooncake's conversation trace and of any chat front end. The assistant tokens are the
trace's, not what the server generated, so the trace is a fixed file the simulator
reads too. Sessions interleave in a seeded order, and a few requests repeat an
earlier prompt exactly (a regenerate button): a prompt cached whole, which vLLM
serves one block short (it recomputes the last token).

Token ids are drawn from 3..31998: never the simulator's filler token (0) nor the
tiny model's BOS/EOS (1, 2).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from prefixkv.adapters.lab.traces.base import TraceRequest

__all__ = ["LiveRequest", "TraceShape", "as_trace_requests", "make_trace"]


@dataclass(frozen=True)
class LiveRequest:
    """One request of the trace (what ``Router.route`` reads: id, prompt, output_len).

    Attributes:
        id: ``s<session>t<turn>`` (``...r`` for a repeat).
        prompt: the token ids, ``array('I')``.
        output_len: ``max_tokens`` (greedy, EOS ignored: exactly this many).
        session: the session's number.
        turn: the turn's number in the session (from 0).
    """

    id: str
    prompt: array[int]
    output_len: int
    session: int
    turn: int


@dataclass(frozen=True)
class TraceShape:
    """The trace's size (every length in tokens).

    Attributes:
        sessions: conversations.
        turns: turns each.
        system_prompts: distinct system prompts the sessions share.
        system_tokens: a system prompt's length (a multiple of 32: a repeat of the
            system prompt alone is served one block short).
        user_tokens: (least, most) of a user turn.
        assistant_tokens: (least, most) of an assistant turn.
        max_tokens: tokens generated per request.
        repeats: requests that repeat an earlier prompt exactly.
        seed: seeds everything.
    """

    sessions: int = 6
    turns: int = 4
    system_prompts: int = 2
    system_tokens: int = 320
    user_tokens: tuple[int, int] = (20, 120)
    assistant_tokens: tuple[int, int] = (20, 90)
    max_tokens: int = 4
    repeats: int = 3
    seed: int = 0

    @property
    def num_requests(self) -> int:
        """Requests in the trace."""
        return self.sessions * self.turns + self.repeats


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 31999) for _ in range(n)]


def make_trace(shape: TraceShape) -> list[LiveRequest]:
    """The trace's requests in sending order (a pure function of ``shape``)."""
    rng = random.Random(shape.seed)
    systems = [_tokens(rng, shape.system_tokens) for _ in range(shape.system_prompts)]
    history = [list(systems[s % len(systems)]) for s in range(shape.sessions)]
    turn = [0] * shape.sessions
    out: list[LiveRequest] = []
    while any(t < shape.turns for t in turn):
        s = rng.choice([i for i, t in enumerate(turn) if t < shape.turns])
        prompt = history[s] + _tokens(rng, rng.randint(*shape.user_tokens))
        out.append(LiveRequest(f"s{s}t{turn[s]}", array("I", prompt), shape.max_tokens, s, turn[s]))
        history[s] = prompt + _tokens(rng, rng.randint(*shape.assistant_tokens))
        turn[s] += 1
    # The repeats: a system prompt alone first (a whole multiple of the block size),
    # then earlier prompts, each placed after the request it repeats.
    for k in range(shape.repeats):
        if k == 0:
            first = min(i for i, r in enumerate(out) if r.session == 0)
            src = LiveRequest("sys0", array("I", systems[0]), shape.max_tokens, -1, 0)
        else:
            first = rng.randrange(len(out) // 2)
            while out[first].id.endswith("r") or f"{out[first].id}r" in {q.id for q in out}:
                first = rng.randrange(len(out) // 2)  # each request repeated once at most
            r = out[first]
            src = LiveRequest(f"{r.id}r", r.prompt, r.output_len, r.session, r.turn)
        at = rng.randrange(first + 1, len(out) + 1)
        out.insert(at, src)
    return out


def as_trace_requests(
    requests: Sequence[LiveRequest],
    arrivals: Iterable[float],
    outputs: Iterable[Sequence[int]],
) -> list[TraceRequest]:
    """The requests as prefixkv trace requests (``write_trace`` writes the file
    ``prefixkv cluster --trace`` reads): prompts, what was generated, when each was
    sent, and the session and turn (from 1) they belong to."""
    return [
        TraceRequest(
            r.id,
            r.prompt,
            list(out),
            round(at, 6),
            None if r.session < 0 else f"s{r.session}",
            None,
            r.turn + 1,
        )
        for r, at, out in zip(requests, arrivals, outputs, strict=True)
    ]
