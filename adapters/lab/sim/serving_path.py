"""The serving path: what a served request costs outside the engine's steps.

:func:`measure_serving_path` sends requests one at a time and times each from both ends:
at the client, and by vLLM's ``/metrics`` (queue, prefill and decode histograms, the
API server's TTFT and CPU seconds). The kinds: **short** (one token), **long** (``k``
tokens), **share** (a long one while the API server is kept busy), **idle** (short ones
after a pause), **busy** (long ones while a background request streams) and
**decoding** (long ones after a pause). :func:`fit_serving_path` turns them into a
:class:`ServingPath` (pure); what a server does not export is left ``None``. The lab's
README (calibration) tells what each kind prices.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import os
import random
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from .errors import ProfileError
from .profile import CostProfile, attention_pairs
from .served import ServedEngine, ServerError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "BUSY_BACKGROUND_TOKENS",
    "BUSY_INTO_STEPS",
    "BUSY_PER_REPEAT",
    "DECODING_PAUSES_S",
    "IDLE_PAUSES_S",
    "METRICS",
    "PROMPT_TOKENS",
    "EngineModel",
    "HopSample",
    "HopSamples",
    "ServingPath",
    "SharePair",
    "busy_into",
    "engine_model",
    "fit_serving_path",
    "fresh_prompts",
    "measure_hops",
    "measure_serving_path",
    "metric_totals",
]

METRICS = {
    "queue": "vllm:request_queue_time_seconds_sum",
    "prefill": "vllm:request_prefill_time_seconds_sum",
    "decode": "vllm:request_decode_time_seconds_sum",
    "server_ttft": "vllm:time_to_first_token_seconds_sum",
    "done": "vllm:request_prefill_time_seconds_count",
    "cpu": "process_cpu_seconds_total",
}
"""What is read from ``/metrics``: vLLM's per-request histograms and the API server's CPU."""

PROMPT_TOKENS = 8
"""Prompt tokens of each request timing the serving path."""

IDLE_PAUSES_S = (0.05, 0.1, 0.2, 0.5)
"""Seconds the server idles before the idle requests (``repeats`` of each)."""

DECODING_PAUSES_S = (0.3, 1.2)
"""Seconds the server idles before each decoding request, in turn: either side of the
second vLLM's shared-memory queue readers busy-wait before they sleep."""

BUSY_PER_REPEAT = 2
"""Busy requests per repeat (the spread's upper quantiles need more)."""

BUSY_BACKGROUND_TOKENS = 96
"""Tokens each busy request's background request decodes."""

BUSY_INTO_STEPS = 5
"""The points of its background's stream a busy request is sent at, in turn."""


def fresh_prompts(seed: int | None, vocab_size: int) -> Callable[[int], list[int]]:
    """Fresh random prompts of a length, token ids in ``[3, vocab_size)`` (``seed=None``:
    a fresh seed, so nothing a server cached earlier hits)."""
    rng = random.Random(seed if seed is not None else os.urandom(16))
    return lambda n: [rng.randrange(3, vocab_size) for _ in range(n)]


def busy_into(k: int, background_tokens: int, tokens: int) -> int:
    """After how many of its background's streamed tokens the ``k``-th busy request (of
    ``tokens`` tokens) is sent: ``1 + (k mod BUSY_INTO_STEPS) x`` a tenth of what the
    background streams beyond it, so it ends before its background does."""
    step = max(1, (background_tokens - tokens) // (2 * BUSY_INTO_STEPS))
    return min(1 + (k % BUSY_INTO_STEPS) * step, background_tokens)


_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>[-+0-9.eEinfINFaN]+)",
    re.MULTILINE,
)


def metric_totals(text: str, names: Sequence[str] = tuple(METRICS.values())) -> dict[str, float]:
    """Each metric of ``names`` in Prometheus ``text``, summed over its label sets (absent
    ones left out)."""
    wanted = set(names)
    out: dict[str, float] = {}
    for m in _SAMPLE.finditer(text):
        name = m.group("name")
        if name in wanted:
            try:
                value = float(m.group("value"))
            except ValueError:
                continue
            out[name] = out.get(name, 0.0) + value
    return out


class HopSample(NamedTuple):
    """One request timed at both ends (engine-side figures ``None`` when unknown).

    ``engine_ttft_s`` is the engine core's queue + prefill time, ``frontend_cpu_s`` the
    API server's CPU over the request less one ``/metrics`` read, ``idle_s`` how long the
    server idled before it.
    """

    prompt_tokens: int
    num_tokens: int
    client_ttft_s: float
    client_decode_s: float
    server_ttft_s: float | None = None
    engine_ttft_s: float | None = None
    engine_decode_s: float | None = None
    frontend_cpu_s: float | None = None
    client_cpu_s: float = 0.0
    idle_s: float = 0.0


class SharePair(NamedTuple):
    """The same long request alone and under extra CPU load."""

    alone: HopSample
    loaded: HopSample


@dataclass(frozen=True, slots=True)
class ServingPath:
    """The serving path's terms, as a profile carries them (``None``: not measured).

    ``hops`` holds the medians in seconds of ``client_ttft``, ``http`` (client to API
    server and back), ``frontend`` (API server to engine core and back) and ``engine``
    (queue + prefill), those known; ``engine_side`` and ``request_s_outside`` say whether
    the engine's time came from the server's metrics or from the step model.
    """

    request_s: float
    stream_token_s: float | None = None
    frontend_request_cpu_s: float | None = None
    frontend_cpu_share: float | None = None
    hops: Mapping[str, float] = field(default_factory=dict)
    engine_side: str = "metrics"
    request_s_outside: str = "engine metrics"
    wake_s: float | None = None
    wake_after_s: float | None = None

    def known(self) -> dict[str, float]:
        """The terms a profile fit takes as given (``fit_profile(known=...)``)."""
        out = {"request_s": self.request_s}
        if self.stream_token_s is not None:
            out["stream_token_s"] = self.stream_token_s
        return out


EngineModel = Callable[[int, int], tuple[float, float]]
"""``(prompt tokens, tokens decoded) -> (engine TTFT, engine decode seconds)`` of a lone request."""


def engine_model(profile: CostProfile) -> EngineModel:
    """A lone request's engine time by ``profile``'s steps: one prefill step, then one
    decode step of one row per further token."""

    def model(prompt_tokens: int, num_tokens: int) -> tuple[float, float]:
        ttft = profile.step_time(prompt_tokens, attention_pairs(prompt_tokens, 0), 0, 0)
        decode = sum(
            profile.step_time(0, 0, 1, prompt_tokens + j + 1) for j in range(num_tokens - 1)
        )
        return ttft, decode

    return model


def fit_serving_path(
    short: Sequence[HopSample],
    long: Sequence[HopSample],
    share: Sequence[SharePair] = (),
    engine_model: EngineModel | None = None,
    idle: Sequence[HopSample] = (),
) -> ServingPath:
    """The serving path from one-at-a-time requests: the medians of what each says.

    ``short`` requests decode one token, ``long`` ones the same ``k > 1`` tokens, ``share``
    pairs a long one alone and under load, ``idle`` short ones follow a pause (``wake_s``,
    ``wake_after_s``); ``engine_model`` stands for the engine's queue and prefill time
    where a sample does not say it.

    Raises:
        ValueError: no short sample, or one without its engine side and no ``engine_model``.
    """
    if not short:
        raise ValueError("need at least one short request")
    cpu_request, cpu_token = _frontend_cpu(short, long)
    # The client's TTFT less the engine's queue + prefill, less the first token's
    # streaming (which the simulator prices apart, after the step).
    request_s = max(
        0.0,
        statistics.median(s.client_ttft_s - _engine_ttft(s, engine_model) for s in short)
        - (cpu_token or 0.0),
    )
    hops = {
        "client_ttft": statistics.median(s.client_ttft_s for s in short),
        "engine": statistics.median(_engine_ttft(s, engine_model) for s in short),
    }
    if long:
        hops["client_ttft_decoding"] = statistics.median(s.client_ttft_s for s in long)
    wake = _wake(idle, short)
    if wake is not None:
        hops["client_ttft_after_idle"] = wake[0]
    hops.update(_split_hops(short))
    on_metrics = all(s.engine_ttft_s is not None for s in short)
    return ServingPath(
        request_s=request_s,
        stream_token_s=cpu_token,
        frontend_request_cpu_s=cpu_request,
        frontend_cpu_share=_share(share),
        hops=hops,
        engine_side="metrics" if on_metrics else "step model",
        request_s_outside="engine metrics" if on_metrics else "step model",
        wake_s=None if wake is None else wake[1],
        wake_after_s=None if wake is None else wake[2],
    )


def _engine_ttft(s: HopSample, model: EngineModel | None) -> float:
    if s.engine_ttft_s is not None:
        return s.engine_ttft_s
    if model is None:
        raise ValueError("a sample has no engine-side TTFT and there is no engine model")
    return model(s.prompt_tokens, s.num_tokens)[0]


def _wake(
    idle: Sequence[HopSample], short: Sequence[HopSample]
) -> tuple[float, float, float] | None:
    """``(client TTFT after the longest pause, wake_s, wake_after_s)``: how much longer
    than ``short`` the idle requests took after the longest pause, and the shortest pause
    after which they took over half that. Where the server says every engine side, only
    the engine core's time counts (the time outside it is in the idle spread)."""
    if not idle:
        return None
    engine_side = all(s.engine_ttft_s is not None for s in (*idle, *short))

    def took(s: HopSample) -> float:
        return s.engine_ttft_s if engine_side and s.engine_ttft_s is not None else s.client_ttft_s

    base = statistics.median(took(s) for s in short)
    by_pause: dict[float, list[HopSample]] = {}
    for s in idle:
        by_pause.setdefault(s.idle_s, []).append(s)
    excess = {p: statistics.median(took(s) for s in v) - base for p, v in by_pause.items()}
    longest = max(excess)
    wake_s = max(0.0, excess[longest])
    wake_after_s = min((p for p, e in excess.items() if e >= wake_s / 2), default=longest)
    return statistics.median(s.client_ttft_s for s in by_pause[longest]), wake_s, wake_after_s


def _split_hops(short: Sequence[HopSample]) -> dict[str, float]:
    """The medians of ``http`` and ``frontend``, those the server says."""
    http = _median(
        [s.client_ttft_s - s.server_ttft_s for s in short if s.server_ttft_s is not None]
    )
    front = _median(
        [
            s.server_ttft_s - s.engine_ttft_s
            for s in short
            if s.server_ttft_s is not None and s.engine_ttft_s is not None
        ]
    )
    return {k: v for k, v in (("http", http), ("frontend", front)) if v is not None}


def _frontend_cpu(
    short: Sequence[HopSample], long: Sequence[HopSample]
) -> tuple[float | None, float | None]:
    """The front end's CPU seconds per request and per streamed token (means: the counter
    ticks in 10 ms steps)."""
    cpu_short = _mean([s.frontend_cpu_s for s in short if s.frontend_cpu_s is not None])
    cpu_long = _mean([s.frontend_cpu_s for s in long if s.frontend_cpu_s is not None])
    k = statistics.median(s.num_tokens for s in long) if long else 1
    if cpu_short is None or cpu_long is None or k <= 1:
        return None, None
    cpu_token = max(0.0, (cpu_long - cpu_short) / (k - 1))
    return max(0.0, cpu_short - cpu_token), cpu_token


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _share(pairs: Sequence[SharePair]) -> float | None:
    """Median step seconds lost per CPU second of other work, in ``[0, 1]``."""
    shares = []
    for alone, loaded in pairs:
        if alone.engine_decode_s is None or loaded.engine_decode_s is None:
            continue
        if alone.frontend_cpu_s is None or loaded.frontend_cpu_s is None:
            continue
        extra_cpu = (loaded.frontend_cpu_s - alone.frontend_cpu_s) + (
            loaded.client_cpu_s - alone.client_cpu_s
        )
        if extra_cpu <= 0:
            continue
        lost = loaded.engine_decode_s - alone.engine_decode_s
        shares.append(min(1.0, max(0.0, lost / extra_cpu)))
    return statistics.median(shares) if shares else None


# ------------------------------------------------------------------ measuring


async def _metrics(client: httpx.AsyncClient) -> dict[str, float]:
    import httpx

    try:
        r = await client.get("/metrics")
    except httpx.HTTPError:
        return {}
    return metric_totals(r.text) if r.status_code == 200 else {}


def _delta(after: Mapping[str, float], before: Mapping[str, float], *keys: str) -> float | None:
    names = [METRICS[k] for k in keys]
    if any(n not in after or n not in before for n in names):
        return None
    return sum(after[n] - before[n] for n in names)


@dataclass(frozen=True, slots=True)
class _Sender:
    """Fresh prompts to one server, each request timed at both ends."""

    engine: ServedEngine
    client: httpx.AsyncClient
    prompt: Callable[[], list[int]]
    scrape_cpu_s: float
    progress: Callable[[int], object] | None

    async def timed(self, num_tokens: int, *, load: bool = False, idle_s: float = 0.0) -> HopSample:
        """One request with ``/metrics`` read before and after, then :meth:`tick`. ``load``:
        keep the API server busy meanwhile; ``idle_s``: idle that long after the read
        before, so the request, not the read, wakes the server."""
        prompt, client = self.prompt(), self.client
        before = await _metrics(client)
        if idle_s:
            await asyncio.sleep(idle_s)
        cpu0 = time.process_time()
        stop = asyncio.Event()

        async def busy() -> None:
            while not stop.is_set():
                await _metrics(client)
                await asyncio.sleep(0)  # a transport that answers at once still lets go

        loader = asyncio.ensure_future(busy()) if load else None
        try:
            c = await self.engine.complete(client, prompt, num_tokens)
        finally:
            stop.set()
            if loader is not None:
                await loader
        client_cpu = time.process_time() - cpu0
        after = await _metrics(client)
        for _ in range(20):  # the API server records a request's figures as it finishes it
            counted = _delta(after, before, "done")
            if counted is None or counted >= 1:
                break
            await asyncio.sleep(0.01)
            after = await _metrics(client)
        whole = _delta(after, before, "done") == 1  # exactly this request's figures
        cpu = _delta(after, before, "cpu")
        self.tick()
        return HopSample(
            prompt_tokens=len(prompt),
            num_tokens=num_tokens,
            client_ttft_s=c.ttft_s,
            client_decode_s=c.latency_s - c.ttft_s,
            server_ttft_s=_delta(after, before, "server_ttft") if whole else None,
            engine_ttft_s=_delta(after, before, "queue", "prefill") if whole else None,
            engine_decode_s=_delta(after, before, "decode") if whole else None,
            frontend_cpu_s=None if cpu is None else cpu - self.scrape_cpu_s,
            client_cpu_s=client_cpu,
            idle_s=idle_s,
        )

    def tick(self) -> None:
        """Count one request in ``progress``."""
        if self.progress is not None:
            self.progress(1)


async def measure_serving_path(
    engine: ServedEngine,
    client: httpx.AsyncClient,
    fresh: Callable[[int], list[int]],
    *,
    repeats: int = 5,
    prompt_tokens: int = PROMPT_TOKENS,
    long_tokens: int = 32,
    idle_pauses_s: Sequence[float] = IDLE_PAUSES_S,
    progress: Callable[[int], object] | None = None,
    busy_background_tokens: int = BUSY_BACKGROUND_TOKENS,
    decoding_pauses_s: Sequence[float] = DECODING_PAUSES_S,
) -> HopSamples:
    """Send ``engine`` (through ``client``) ``repeats`` short, long, share, idle, busy and
    decoding requests of ``prompt_tokens`` fresh tokens each (``fresh``: nothing cached
    hits them). ``long_tokens``: what each long, busy and decoding request decodes; an
    empty ``idle_pauses_s`` or ``decoding_pauses_s``, or ``busy_background_tokens=0``,
    sends none of that kind; ``progress`` is called with 1 after each request.

    Raises:
        ServerError: a bad size, or the server fails a request.
    """
    if repeats < 1 or prompt_tokens < 1 or long_tokens < 2:
        raise ServerError(
            f"serving path: repeats >= 1, prompt_tokens >= 1 and long_tokens >= 2, got "
            f"{repeats}, {prompt_tokens}, {long_tokens}"
        )
    prompt = functools.partial(fresh, prompt_tokens)
    sender = _Sender(engine, client, prompt, await _scrape_cpu_s(client), progress)
    short, long, share = [], [], []
    for _ in range(repeats):  # a one-token request, a long one, and a long one under load
        short.append(await sender.timed(1))
        long.append(await sender.timed(long_tokens))
        share.append(SharePair(long[-1], await sender.timed(long_tokens, load=True)))
    idle = await _idle(sender, idle_pauses_s, repeats)
    decoding = await _idle(sender, decoding_pauses_s, repeats, tokens=long_tokens, in_turn=True)
    busy = []
    if busy_background_tokens:
        busy = await _busy(sender, BUSY_PER_REPEAT * repeats, busy_background_tokens, long_tokens)
    return HopSamples(short, long, share, idle, busy, decoding)


async def _scrape_cpu_s(client: httpx.AsyncClient) -> float:
    """What one ``/metrics`` read costs the API server (a mean: the counter ticks in 10 ms)."""
    reads = [await _metrics(client) for _ in range(16)]
    cpu = METRICS["cpu"]
    gaps = [b[cpu] - a[cpu] for a, b in itertools.pairwise(reads) if cpu in a and cpu in b]
    return statistics.fmean(gaps) if gaps else 0.0


async def _idle(
    sender: _Sender,
    pauses_s: Sequence[float],
    repeats: int,
    *,
    tokens: int = 1,
    in_turn: bool = False,
) -> list[HopSample]:
    """``repeats`` requests after each of ``pauses_s``: all of one pause, then the next,
    or (``in_turn``) one of each pause in turn, so a drift meets every pause alike."""
    plan = (
        [p for _ in range(repeats) for p in pauses_s]
        if in_turn
        else [p for p in pauses_s for _ in range(repeats)]
    )
    return [await sender.timed(tokens, idle_s=pause) for pause in plan]


async def _busy(
    sender: _Sender, n: int, background_tokens: int, tokens: int = 1
) -> list[HopSample]:
    """``n`` requests, each sent once a background request of its own has streamed
    :func:`busy_into` tokens. A request the server drops is no sample.

    Raises:
        ServerError: over half the requests failed (the last failure).
    """
    out = []
    dropped = 0
    for k in range(n):
        into = busy_into(k, background_tokens, tokens)
        streamed = asyncio.Event()

        def seen(count: int, into: int = into, streamed: asyncio.Event = streamed) -> None:
            if count >= into:
                streamed.set()

        background = asyncio.ensure_future(
            sender.engine.complete(sender.client, sender.prompt(), background_tokens, on_token=seen)
        )
        waiter = asyncio.ensure_future(streamed.wait())
        try:
            await asyncio.wait({background, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if not streamed.is_set():
                await background  # its failure, if it failed
                raise ServerError(f"a background request ended before its token {into}")
            out.append(await sender.timed(tokens))
        except ServerError:
            dropped += 1
            if 2 * dropped > n:
                raise
            sender.tick()
        finally:
            waiter.cancel()
            # the background runs to its end: the next request meets an idle server
            await asyncio.gather(background, waiter, return_exceptions=True)
    return out


class HopSamples(NamedTuple):
    """What :func:`measure_hops` sent (older profiles lack the later kinds)."""

    short: list[HopSample]
    long: list[HopSample]
    share: list[SharePair]
    idle: Sequence[HopSample] = ()
    busy: Sequence[HopSample] = ()
    decoding: Sequence[HopSample] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON object (a profile keeps it, so that it can be fitted again)."""
        return {
            f: [[p.alone._asdict(), p.loaded._asdict()] for p in self.share]
            if f == "share"
            else [s._asdict() for s in getattr(self, f)]
            for f in self._fields
        }

    @classmethod
    def from_json(cls, data: Any, where: str = "serving path samples") -> HopSamples:
        """Read what :meth:`to_json` wrote.

        Raises:
            ProfileError: another shape, or a field that is not a number.
        """
        try:
            return cls(
                [_hop(s) for s in data["short"]],
                [_hop(s) for s in data["long"]],
                [SharePair(_hop(a), _hop(b)) for a, b in data["share"]],
                *([_hop(s) for s in data.get(f, [])] for f in ("idle", "busy", "decoding")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProfileError(
                f"{where}: not the samples calibrate --server saves ({exc})"
            ) from None


def _hop(data: Mapping[str, Any]) -> HopSample:
    sample = HopSample(**data)
    for name, value in sample._asdict().items():
        optional = HopSample._field_defaults.get(name, 0.0) is None
        if (value is None and optional) or (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        ):
            continue
        raise ValueError(f"{name} is {value!r:.40}")
    return sample


def measure_hops(
    engine: ServedEngine,
    *,
    repeats: int = 5,
    seed: int | None = None,
    vocab_size: int = 32000,
    progress: Callable[[int], object] | None = None,
    decoding_pauses_s: Sequence[float] = DECODING_PAUSES_S,
) -> HopSamples:
    """Measure the serving path of ``engine`` with fresh random prompts (``seed``-ed).

    Raises:
        ServerError: the server fails a request.
    """
    fresh = fresh_prompts(seed, vocab_size)

    async def measure() -> HopSamples:
        async with engine.client() as client:
            await engine.info(client)
            return await measure_serving_path(
                engine, client, fresh, repeats=repeats, progress=progress,
                decoding_pauses_s=decoding_pauses_s,
            )  # fmt: skip

    return asyncio.run(measure())
