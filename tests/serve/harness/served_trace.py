"""A shared-prefix trace built from a seed, replayed against a running ``vllm serve``.

The trace has two phases, both deterministic in what the engine sees:

* **sequential** (K=1): one request at a time, each answered before the next is sent.
  System prompts shared by many requests, multi-turn sessions (each turn is the
  previous turn's prompt, the reply the server gave, and new user tokens), exact
  repeats and long fresh prompts that push the shared blocks out of a small pool.
* **waves**: groups of requests that run concurrently. Concurrency would make the
  engine's view depend on timing -- which step a request arrives in decides what is
  cached when it is scheduled, and so its cached tokens and every later request's --
  so each wave is handed to the engine whole: the server is paused (``/pause?mode=
  keep``: requests queue, nothing is scheduled, the cache is kept), the wave's
  requests are sent one by one, each only after the server's log shows the previous
  one reached the engine core, then ``/resume``. The engine core takes its input from
  one socket in order (requests, then the resume), so it starts every wave with the
  same waiting queue in the same order, and nothing else arrives until the wave's
  last answer is in. From there vLLM's scheduler is deterministic (the CPU platform
  turns async scheduling off): the same steps, the same preemptions, on any server
  whose cache answers the same, however busy the machine is.

:class:`Replayer` sends it with the ``openai`` client (what users point at an
OpenAI-compatible server; ``max_retries=0`` so a failed request is never sent twice,
which would change what the engine sees), vLLM's extra fields through ``extra_body``
(``return_token_ids``, ``ignore_eos``) and the request id as ``X-Request-Id``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vllm_server import ServerError, VLLMServer

VOCAB = (3, 31999)  # token ids drawn from here: 0-2 are the tiny model's specials


@dataclass(frozen=True)
class Step:
    """One planned request.

    Attributes:
        id: the request id (``X-Request-Id``), unique in the trace.
        user: the new tokens this request appends.
        max_tokens: tokens to generate (``ignore_eos``: exactly this many).
        base: what the prompt starts with when it does not continue a session (a
            system prompt, a part of one, or nothing).
        session: a multi-turn session: the first request naming it starts it from
            ``base``; each later one continues the previous turn (its prompt and the
            reply the server gave).
    """

    id: str
    user: tuple[int, ...]
    max_tokens: int
    base: tuple[int, ...] = ()
    session: str | None = None


@dataclass(frozen=True)
class Plan:
    """The trace: the sequential phase, then the waves."""

    sequential: list[Step]
    waves: list[list[Step]]

    @property
    def num_requests(self) -> int:
        """Requests in both phases."""
        return len(self.sequential) + sum(len(w) for w in self.waves)


def build_plan(seed: int = 0, *, num_waves: int = 5, wave_size: int = 6) -> Plan:
    """The trace for a pool of about 64 blocks of 32 tokens (see the module docstring).

    Sequential phase: two system prompts (330 and 250 tokens, not block-aligned),
    three sessions of 3-4 turns, exact repeats, and fresh prompts of 700-1,100 tokens
    that evict. Waves: ``wave_size`` requests each, continuing the sessions, sharing
    the system prompts or fresh, generating 96-256 tokens: more than the pool holds
    at ``--max-num-seqs 4``, so decode preempts.
    """
    rng = random.Random(seed)

    def toks(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(*VOCAB) for _ in range(n))

    sys_a, sys_b = toks(330), toks(250)
    repeat = toks(60)
    seq = [
        Step("q00", toks(40), 24, sys_a, "a"),
        Step("q01", repeat, 16, sys_a),
        Step("q02", toks(30), 24, sys_b, "b"),
        Step("q03", toks(45), 24, session="a"),
        Step("q04", toks(700), 16),
        Step("q05", toks(50), 24, session="b"),
        Step("q06", toks(20), 16, sys_a),
        Step("q07", toks(900), 16),
        Step("q08", toks(30), 24, session="a"),
        Step("q09", repeat, 16, sys_a),
        Step("q10", toks(80), 32, sys_b, "c"),
        Step("q11", toks(1100), 8),
        Step("q12", toks(40), 24, session="c"),
        Step("q13", toks(10), 16, sys_b[:200]),
        Step("q14", toks(35), 24, session="b"),
        Step("q15", repeat, 16, sys_a),
    ]
    waves = []
    sessions = ["a", "b", "c"]
    for w in range(num_waves):
        wave: list[Step] = []
        open_sessions = list(sessions)
        rng.shuffle(open_sessions)
        for i in range(wave_size):
            rid, out = f"w{w}-{i}", rng.randrange(96, 257)
            roll = rng.random()
            if roll < 0.3 and open_sessions:  # a session's next turn (one per wave)
                turn = open_sessions.pop()
                wave.append(Step(rid, toks(rng.randrange(20, 60)), out, session=turn))
            elif roll < 0.75:  # a system prompt, whole or cut, and a question
                system = sys_a if rng.random() < 0.5 else sys_b
                cut = system[: rng.randrange(len(system) // 2, len(system) + 1)]
                new = None
                if rng.random() < 0.25:
                    new = f"s{len(sessions)}"
                    sessions.append(new)
                wave.append(Step(rid, toks(rng.randrange(30, 200)), out, cut, new))
            else:  # fresh
                wave.append(Step(rid, toks(rng.randrange(200, 500)), out))
        waves.append(wave)
    return Plan(seq, waves)


@dataclass
class Served:
    """What the server did with one request.

    Attributes:
        id: the request id.
        phase: ``"sequential"`` or ``"wave"``.
        wave: the wave's number (``-1`` in the sequential phase).
        prompt: the prompt's token ids as sent.
        output: the generated token ids (``return_token_ids``).
        cached_tokens: ``usage.prompt_tokens_details.cached_tokens``.
        prompt_tokens: ``usage.prompt_tokens``.
    """

    id: str
    phase: str
    wave: int
    prompt: list[int]
    output: list[int]
    cached_tokens: int
    prompt_tokens: int


@dataclass
class Replayer:
    """Sends a :class:`Plan` to one server, keeping each session's history.

    Args:
        server: a started server, paused and resumed between waves (so its
            ``env`` has ``VLLM_SERVER_DEV_MODE=1``) and logging added requests
            (``--enable-log-requests``).
        request_timeout: seconds per request.
        id_prefix: put before each request id sent (``X-Request-Id``), so that a
            trace replayed again on the same server has ids its log has not seen.
    """

    server: VLLMServer
    request_timeout: float = 300.0
    id_prefix: str = ""
    history: dict[str, list[int]] = field(default_factory=dict)
    _client: Any = None

    def __post_init__(self) -> None:
        import openai

        self._client = openai.OpenAI(
            base_url=self.server.url + "/v1",
            api_key="unused",
            max_retries=0,
            timeout=self.request_timeout,
        )

    def prompt_for(self, step: Step) -> list[int]:
        """The prompt ``step`` sends now: its session's history, or its base, and its
        new tokens."""
        if step.session is not None and step.session in self.history:
            return [*self.history[step.session], *step.user]
        return [*step.base, *step.user]

    def send(self, step: Step, phase: str, wave: int = -1) -> Served:
        """One greedy completion; a session's history grows by the prompt and reply.

        Raises:
            ServerError: the request failed, or the answer lacks vLLM's token ids.
        """
        prompt = self.prompt_for(step)
        try:
            out = self._client.completions.create(
                model=self.server.config.model,
                prompt=prompt,
                max_tokens=step.max_tokens,
                temperature=0,
                extra_body={"return_token_ids": True, "ignore_eos": True},
                extra_headers={"X-Request-Id": self.id_prefix + step.id},
            )
        except Exception as e:  # the client's errors: connection, status, timeout
            raise ServerError(f"{step.id}: {type(e).__name__}: {e}") from None
        choice = out.choices[0]
        ids = (choice.model_extra or {}).get("token_ids")
        details = out.usage.prompt_tokens_details if out.usage else None
        if ids is None or details is None:
            raise ServerError(f"{step.id}: no token_ids or prompt_tokens_details in the answer")
        if step.session is not None:
            self.history[step.session] = [*prompt, *ids]
        return Served(
            step.id, phase, wave, prompt, list(ids), int(details.cached_tokens or 0),
            int(out.usage.prompt_tokens),
        )  # fmt: skip

    def sequential(self, steps: Sequence[Step]) -> list[Served]:
        """The K=1 phase: each request after the previous one's answer."""
        return [self.send(step, "sequential") for step in steps]

    def run_wave(self, steps: Sequence[Step], wave: int, add_timeout: float = 60.0) -> list[Served]:
        """One wave, handed to the engine whole (see the module docstring).

        Raises:
            ServerError: a request failed or did not reach the engine in time.
        """
        futures: list[Future[Served]] = []
        with ThreadPoolExecutor(len(steps)) as pool:
            self.server.pause()
            try:
                for step in steps:
                    futures.append(pool.submit(self.send, step, "wave", wave))
                    self._wait_added(self.id_prefix + step.id, futures[-1], add_timeout)
            finally:
                self.server.resume()
            return [f.result() for f in futures]

    def _wait_added(self, request_id: str, sent: Future[Served], timeout: float) -> None:
        try:
            self.server.wait_added(f"cmpl-{request_id}-", timeout)
        except ServerError:
            if sent.done():
                sent.result()  # the request's own error says more
            raise

    def waves(self, waves: Sequence[Sequence[Step]]) -> list[Served]:
        """Every wave, each after the previous one's last answer."""
        return [s for w, steps in enumerate(waves) for s in self.run_wave(steps, w)]

    def replay(self, plan: Plan) -> list[Served]:
        """The sequential phase, then the waves."""
        return [*self.sequential(plan.sequential), *self.waves(plan.waves)]
