"""Fit a cost profile to a running OpenAI-compatible server (vLLM, SGLang, ...).

The sweep (:func:`measure_server`) sends, over HTTP (:mod:`.served`), fresh random
prompts: one request at a time of each prompt length and cached fraction (its TTFT),
``b`` requests at once decoding ``k`` tokens (timed to the slowest one's last token:
:func:`batch_sample`), and a short request while ``n`` others stream. The serving path
is timed apart (:mod:`.serving_path`), and :func:`~.calibration.fit_profile` fits the
step model to what is left (:func:`fit_server`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import itertools
import math
import os
import platform
import re
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .calibration import StepSample, fit_profile
from .config import DEFAULT_BLOCK_SIZE
from .engine_decode import decode_samples, fit_admit_s
from .errors import ProfileError
from .http_limits import RequestLimits
from .profile import CostProfile, attention_pairs
from .replica import step_charge
from .served import ServedEngine, ServerError, ServerInfo
from .serving_path import (
    DECODING_PAUSES_S,
    PROMPT_TOKENS,
    EngineModel,
    HopSample,
    HopSamples,
    ServingPath,
    engine_model,
    fit_serving_path,
    fresh_prompts,
    measure_hops,
)
from .serving_spread import is_burst, pace_table, pace_window, quantile_table

__all__ = [
    "KEPT_FIELDS",
    "QUICK_SWEEP",
    "ServerSweep",
    "batch_sample",
    "calibrate_server",
    "client_machine",
    "cpu_model",
    "decoding_excess",
    "fit_server",
    "is_under_streams",
    "kept_samples",
    "refit_server_profile",
]


@dataclass(frozen=True, slots=True)
class ServerSweep:
    """What :func:`measure_server` sends.

    Each shape is run ``repeats`` times and the median kept; ``max_num_batched_tokens``
    is the server's step budget; ``seed=None`` draws a fresh seed, so nothing cached
    earlier hits; ``serving_repeats`` requests of each kind time the serving path (0:
    none), with ``decoding_pauses_s`` before its decoding ones.

    Raises:
        ProfileError: a size out of range.
    """

    prompt_lengths: tuple[int, ...] = (16, 64, 256, 512, 1024, 2048)
    cached_fractions: tuple[float, ...] = (0.0, 0.5, 0.9)
    batch_sizes: tuple[int, ...] = (1, 4, 16, 32)
    decode_contexts: tuple[int, ...] = (64, 512, 1024)
    decode_tokens: int = 24
    background_streams: tuple[int, ...] = (0, 8, 24)
    repeats: int = 3
    max_num_batched_tokens: int = 2048
    vocab_size: int = 32000
    seed: int | None = None
    serving_repeats: int = 10
    decoding_pauses_s: tuple[float, ...] = DECODING_PAUSES_S

    def __post_init__(self) -> None:
        if type(self.serving_repeats) is not int or not 0 <= self.serving_repeats <= 1000:
            raise ProfileError(
                f"serving_repeats must be an int in [0, 1000], got {self.serving_repeats!r}"
            )
        for name in ("prompt_lengths", "batch_sizes", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(type(v) is not int or v < 1 for v in values):
                raise ProfileError(f"{name} must be positive ints, got {values!r}")
        if not self.cached_fractions or any(not 0 <= f < 1 for f in self.cached_fractions):
            raise ProfileError(f"cached_fractions must be in [0, 1), got {self.cached_fractions!r}")
        for name in ("decode_tokens", "repeats", "max_num_batched_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ProfileError(f"{name} must be a positive int, got {value!r}")
        if self.decode_tokens < 8:
            raise ProfileError(f"decode_tokens must be >= 8, got {self.decode_tokens}")
        if any(
            isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 60
            for p in self.decoding_pauses_s
        ):
            raise ProfileError(
                f"decoding_pauses_s must be seconds in [0, 60], got {self.decoding_pauses_s!r}"
            )


QUICK_SWEEP = ServerSweep(
    prompt_lengths=(32, 256, 1024),
    cached_fractions=(0.0, 0.5),
    batch_sizes=(1, 8),
    decode_contexts=(64, 512),
    decode_tokens=12,
    background_streams=(0, 8),
    repeats=2,
    serving_repeats=2,
)
"""A small sweep: a rough profile in seconds."""


def batch_sample(
    b: int, ctx: int, num_tokens: int, seconds: float, sweep: ServerSweep
) -> StepSample:
    """A decode run as one sample: ``b`` requests of ``ctx`` prompt tokens sent at once,
    each generating ``num_tokens``, timed to the slowest one's last token (which a front
    end streaming in bursts does not move): ``ceil(b x ctx / budget)`` prefill steps,
    then ``num_tokens - 1`` decode steps of ``b`` rows."""
    n = num_tokens - 1
    return StepSample(
        prefill_tokens=b * ctx,
        prefill_pairs=b * attention_pairs(ctx, 0),
        num_decode=n * b,
        decode_context=b * (n * ctx + n * (n + 1) // 2),
        seconds=seconds,
        num_steps=-(-b * ctx // sweep.max_num_batched_tokens) + n,
        num_requests=1,
        num_streamed=b,
        runs=sweep.repeats,
    )


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else :mod:`platform`)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return cpu


def client_machine() -> str:
    """``"Linux-... x86_64, <cpu model>, 2 CPUs"``: where the client ran."""
    return f"{platform.platform()}, {cpu_model()}, {os.cpu_count()} CPUs"


async def measure_server(
    engine: ServedEngine,
    sweep: ServerSweep = ServerSweep(),
    *,
    progress: Callable[[int], object] | None = None,
) -> tuple[ServerInfo, list[StepSample]]:
    """Run the sweep against ``engine``; one sample per shape.

    Raises:
        ServerError: the server fails a request, or reports no cached tokens.
    """
    fresh = fresh_prompts(sweep.seed, sweep.vocab_size)

    def tick() -> None:
        if progress is not None:
            progress(1)

    async with engine.client() as client:
        info = await engine.info(client)
        bs = info.block_size or DEFAULT_BLOCK_SIZE
        longest = _longest_request(sweep)
        if info.max_model_len and longest > info.max_model_len:
            raise ServerError(
                f"{info.url} serves at most {info.max_model_len:,} tokens; the sweep needs "
                f"{longest:,}"
            )
        samples = []
        for length, fraction in itertools.product(sweep.prompt_lengths, sweep.cached_fractions):
            prefix_len = int(length * fraction) // bs * bs
            samples.append(
                await _prefill_sample(engine, client, sweep, length, prefix_len, fresh, tick)
            )
        for b, ctx in itertools.product(sweep.batch_sizes, sweep.decode_contexts):
            slowest = []  # b requests of ctx tokens at once, timed to the slowest
            for _ in range(sweep.repeats):
                batch = [fresh(ctx) for _ in range(b)]
                done = await asyncio.gather(
                    *(engine.complete(client, p, sweep.decode_tokens) for p in batch)
                )
                slowest.append(max(c.latency_s for c in done))
                tick()
            seconds = statistics.median(slowest)
            samples.append(batch_sample(b, ctx, sweep.decode_tokens, seconds, sweep))
        for n in sweep.background_streams:
            samples.append(await _under_streams(engine, client, n, sweep, fresh))
            tick()
    return info, samples


async def _prefill_sample(
    engine: ServedEngine,
    client: Any,
    sweep: ServerSweep,
    length: int,
    prefix_len: int,
    fresh: Callable[[int], list[int]],
    tick: Callable[[], None],
) -> StepSample:
    """A ``length``-token prompt whose first ``prefix_len`` tokens were sent just before:
    the median TTFT, at the median hit the server reported."""
    runs: list[tuple[float, int]] = []
    for _ in range(sweep.repeats):
        prefix = fresh(prefix_len)
        if prefix:
            await engine.complete(client, [*prefix, *fresh(1)], 1)
        c = await engine.complete(client, [*prefix, *fresh(length - prefix_len)], 1)
        if c.cached_tokens is None:
            raise ServerError(
                f"{engine.url} reports no cached tokens; start vLLM with "
                "--enable-prompt-tokens-details"
            )
        runs.append((c.ttft_s, c.cached_tokens))
        tick()
    hit = statistics.median_low(h for _, h in runs)
    q = length - hit
    return StepSample(
        q, attention_pairs(q, hit), 0, 0, statistics.median(t for t, _ in runs),
        num_steps=-(-q // sweep.max_num_batched_tokens), num_requests=1, num_streamed=1,
        runs=sweep.repeats,
    )  # fmt: skip


_PROBE, _BACKGROUND = 128, 64  # prompt tokens of the timed request and of each stream
_STREAMED = 1024  # tokens each background stream decodes


def _longest_request(sweep: ServerSweep) -> int:
    """The most tokens, prompt and output, that one request of ``sweep`` holds."""
    longest = max(*sweep.prompt_lengths, *sweep.decode_contexts) + sweep.decode_tokens
    if any(sweep.background_streams):
        longest = max(longest, _BACKGROUND + _STREAMED)
    return longest


def is_under_streams(sample: StepSample) -> bool:
    """Whether ``sample`` is a TTFT taken while other requests streamed (one step that
    both prefills and decodes: only :func:`_under_streams` makes those)."""
    return sample.num_steps == 1 and sample.num_decode > 0


async def _under_streams(
    engine: ServedEngine, client: Any, n: int, sweep: ServerSweep, fresh: Callable[[int], list[int]]
) -> StepSample:
    """The median TTFT of a short request while ``n`` others stream."""
    background = [
        asyncio.ensure_future(engine.complete(client, fresh(_BACKGROUND), _STREAMED))
        for _ in range(n)
    ]
    try:
        await asyncio.sleep(0.05 + 0.01 * n)  # every stream past its prefill
        ttfts = []
        for _ in range(sweep.repeats):
            ttfts.append((await engine.complete(client, fresh(_PROBE), 1)).ttft_s)
            await asyncio.sleep(0.01)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
    q = _PROBE
    return StepSample(
        q, attention_pairs(q, 0), n, n * (_BACKGROUND + 64), statistics.median(ttfts),
        num_steps=1, num_requests=1, num_streamed=n + 1, runs=sweep.repeats,
    )  # fmt: skip


def calibrate_server(
    url: str,
    *,
    model: str | None = None,
    sweep: ServerSweep = ServerSweep(),
    name: str | None = None,
    progress: Callable[[int], object] | None = None,
    engine: ServedEngine | None = None,
    limits: RequestLimits | None = None,
) -> CostProfile:
    """Measure the server at ``url`` with ``sweep`` and fit a profile to it.

    ``model``: default the first it serves; ``name``: default ``served-<model>``;
    ``progress`` is called with 1 after each measured shape and repeat; ``engine`` stands
    in for one made from ``url`` and ``limits`` (tests pass a mock transport's).

    Raises:
        ServerError: the server fails, answers past a deadline or byte budget, answers
            another shape or a number out of range, or reports no cached tokens.
    """
    served = engine or ServedEngine(url, model, limits=limits)
    info, samples = asyncio.run(measure_server(served, sweep, progress=progress))
    hops = None
    if sweep.serving_repeats:
        hops = measure_hops(
            served,
            repeats=sweep.serving_repeats,
            seed=sweep.seed,
            vocab_size=sweep.vocab_size,
            progress=progress,
            decoding_pauses_s=sweep.decoding_pauses_s,
        )
    return fit_server(samples, hops, **_described(info, sweep, samples, name))


def _described(
    info: ServerInfo, sweep: ServerSweep, samples: Sequence[StepSample], name: str | None
) -> dict[str, Any]:
    """What a profile of ``info`` says besides its coefficients."""
    pre = [s for s in samples if s.num_requests and not s.num_decode]
    num_decode_runs = len(sweep.batch_sizes) * len(sweep.decode_contexts)
    per_step = [min(s.prefill_tokens, sweep.max_num_batched_tokens) for s in pre]
    contexts = [*sweep.prompt_lengths, *(c + sweep.decode_tokens for c in sweep.decode_contexts)]
    covers = {
        "prefill_tokens": [min(per_step), max(per_step)],
        "context_tokens": [min(contexts), max(contexts)],
        "batch_size": [min(sweep.batch_sizes), max(*sweep.batch_sizes, *sweep.background_streams)],
    }
    engine_name = f"{info.engine} {info.engine_version}".strip() or "unknown engine"
    return {
        "name": name or f"served-{os.path.basename(info.model.rstrip('/')) or 'model'}",
        "model": info.model,
        "device": f"served at {info.url} ({engine_name})",
        "source": f"measured over HTTP by prefixkv calibrate --server {info.url}",
        "notes": (
            f"{len(pre)} prefill shapes (one request at a time, TTFT), {num_decode_runs} decode "
            f"runs (concurrent requests, timed to the slowest one's last token) and TTFT under "
            f"{', '.join(map(str, sweep.background_streams))} streams (fitted under streams "
            f"only where the serving path is not timed), median of "
            f"{sweep.repeats} runs each; step budget {sweep.max_num_batched_tokens:,} "
            "tokens; request_s and stream_token_s are the serving front end's time outside "
            "the engine's steps (HTTP, input processing, streaming), as the client sees it."
        ),
        "measured_on": {
            "server": info.url,
            "model": info.model,
            "engine": info.engine,
            "engine_version": info.engine_version,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": client_machine(),
            "block_size": str(info.block_size or ""),
            "num_gpu_blocks": str(info.num_gpu_blocks or ""),
            "gpu_memory_utilization": info.gpu_memory_utilization,
        },
        "covers": covers,
        "kv_bytes_per_token": info.kv_bytes_per_token,
        "kv_cache_tokens": info.kv_cache_tokens or None,
    }


KEPT_FIELDS = (
    "name", "model", "device", "source", "notes", "measured_on", "covers",
    "kv_bytes_per_token", "device_memory_bytes", "weight_bytes", "kv_cache_tokens",
)  # fmt: skip
"""What a profile fitted again keeps of the one it was fitted from."""


def fit_server(
    samples: Sequence[StepSample], hops: HopSamples | None, **described: Any
) -> CostProfile:
    """Fit a server's profile to its sweep's samples and its serving path's (or ``None``).

    The serving path is fitted first (the steps alone standing for the engine where the
    server does not say), then the steps to what is left. With ``hops``, both step fits
    leave out the TTFTs taken under streams (:func:`is_under_streams`): the serving
    path's busy table prices a request sent while others stream. All the samples are
    kept in the profile's ``fit`` for :func:`refit_server_profile`; ``described`` holds
    the profile's other fields.
    """
    saved = {"samples": [s._asdict() for s in samples]}
    if hops is None:
        profile = fit_profile(samples, **described)
        return dataclasses.replace(profile, fit={**profile.fit, **saved})
    # the serving path prices a request sent while others stream (its busy table); its
    # TTFT under streams holds the client's and the front end's wait for a core, which
    # no step coefficient can fit (on a 2-core CPU server it set every per-token one to 0)
    fit = functools.partial(
        fit_profile, [s for s in samples if not is_under_streams(s)], **described
    )
    profile = fit()
    path = fit_serving_path(
        hops.short, hops.long, hops.share, engine_model=engine_model(profile), idle=hops.idle
    )
    # the lone long requests' decode as the engine core timed it: no client stall in it
    profile = fit(known=path.known(), exact=decode_samples(hops.long))
    return _with_serving_path(profile, path, hops, saved)


def _with_serving_path(
    profile: CostProfile, path: ServingPath, hops: HopSamples, saved: dict[str, Any]
) -> CostProfile:
    """``profile`` (its steps fitted) with the serving path's terms and spreads."""
    model = engine_model(profile)
    admit_s = _admit_beyond_share(hops.short, model, path)  # back to back: no waking
    stream_s = path.stream_token_s or 0.0
    busy_outside = _outside(hops.busy, stream_s)
    pace = pace_table(hops.long)
    served = dataclasses.replace(
        profile,
        admit_s=admit_s or 0.0,
        request_spread_s=quantile_table(_outside(hops.idle or hops.short, stream_s)),
        busy_request_spread_s=quantile_table(busy_outside),
        pace_spread=pace,
        pace_window_s=pace_window(hops.long) if pace else 0.0,
        frontend_request_cpu_s=path.frontend_request_cpu_s or 0.0,
        frontend_cpu_share=path.frontend_cpu_share or 0.0,
        wake_s=path.wake_s or 0.0,
        wake_after_s=path.wake_after_s or 0.0,
    )
    excess = decoding_excess(hops.decoding, model, served)
    fitted = {
        **profile.fit,
        **saved,
        "serving_path": {
            **dataclasses.asdict(path),
            "admit_s": admit_s,
            "busy_samples_kept": len(busy_outside),
            "busy_bursts": sum(1 for s in hops.busy if is_burst(s)),
            "busy_tokens": max((s.num_tokens for s in hops.busy), default=0),
            "decoding_samples_kept": len(excess),
            "decoding_bursts": sum(1 for s in hops.decoding if is_burst(s)),
            "samples": hops.to_json(),
        },
    }
    return dataclasses.replace(served, fit=fitted, decoding_request_spread_s=quantile_table(excess))


def _admit_beyond_share(
    lone: Sequence[HopSample], model: EngineModel, path: ServingPath
) -> float | None:
    """``admit_s`` less the front end's share of the step that takes a request in (which
    the simulator charges that step too): the median over ``lone`` of each ``a`` where
    ``a + share x min(cpu, step + a)`` is what its engine time exceeds its step's price
    by (``None``: no request says its engine side)."""
    share, cpu = path.frontend_cpu_share or 0.0, path.frontend_request_cpu_s or 0.0
    admits = []
    for s in lone:
        excess = fit_admit_s([s], model)
        if excess is None:
            continue
        step = model(s.prompt_tokens, s.num_tokens)[0]
        # a + share x min(cpu, step + a) grows with a: the inverse of the minimum of
        # two increasing lines is the maximum of their inverses.
        admits.append(max(excess - share * cpu, (excess - share * step) / (1 + share)))
    return max(0.0, statistics.median(admits)) if admits else None


def _outside(samples: Sequence[HopSample], stream_s: float) -> list[float]:
    """What each request spent outside the engine core's queue + prefill, less its first
    token's streaming (``stream_s``), but for streams the client read in one burst."""
    return [
        s.client_ttft_s - s.engine_ttft_s - stream_s
        for s in samples
        if s.engine_ttft_s is not None and not is_burst(s)
    ]


def decoding_excess(
    decoding: Sequence[HopSample], model: EngineModel, profile: CostProfile
) -> list[float]:
    """Each decoding request's client TTFT (sent after the server idled ``idle_s``) less
    what the simulator charges it: its first step as :func:`~.replica.step_charge` prices
    it with ``profile``'s serving terms and ``model``'s step, plus ``stream_token_s``;
    streams read in one burst left out."""
    p = profile
    out = []
    for s in decoding:
        if is_burst(s):
            continue
        step = step_charge(
            p,
            model(s.prompt_tokens, 1)[0],
            wakes=s.idle_s >= p.wake_after_s,
            admits=True,
            frontend_busy_s=p.frontend_request_cpu_s,
        )
        out.append(s.client_ttft_s - step - p.stream_token_s)
    return out


def refit_server_profile(profile: CostProfile) -> CostProfile:
    """Fit ``profile`` again from the samples ``calibrate --server`` kept in it, keeping
    its name, provenance and range; a profile that kept only its serving path's medians
    gets its ``request_s`` again from those, its steps as they are.

    Raises:
        ProfileError: the profile keeps neither samples nor serving-path medians
            (not made by ``calibrate --server``), or they are not samples.
    """
    rows = profile.fit.get("samples")
    if not isinstance(rows, list) or not rows:
        return _refit_from_hops(profile, f"profile {profile.name!r}")
    samples, hops = kept_samples(profile)
    try:
        return fit_server(samples, hops, **{k: getattr(profile, k) for k in KEPT_FIELDS})
    except ValueError as exc:
        raise ProfileError(
            f"profile {profile.name!r}: cannot fit its samples again ({exc})"
        ) from None


_RUNS = re.compile(r"median of (\d{1,4}) runs each")


def kept_samples(profile: CostProfile) -> tuple[list[StepSample], HopSamples | None]:
    """The sweep's and the serving path's samples kept in ``profile`` (``None``: no
    serving path was timed).

    Raises:
        ProfileError: it keeps no samples, or they are not samples.
    """
    where = f"profile {profile.name!r}"
    rows = profile.fit.get("samples")
    if not isinstance(rows, list) or not rows:
        raise ProfileError(
            f"{where} keeps no calibration samples (not made by calibrate --server); "
            "calibrate --server again"
        )
    m = _RUNS.search(profile.notes)  # the runs of samples kept before they said it
    runs = max(1, int(m.group(1))) if m else 1
    try:
        samples = [StepSample(**{"runs": runs, **row}) for row in rows]
    except TypeError as exc:
        raise ProfileError(f"{where}: a sample is not a step sample ({exc})") from None
    for s in samples:
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in s) or not (
            math.isfinite(s.seconds) and s.seconds > 0
        ):
            raise ProfileError(f"{where}: a sample with a bad value: {s!r:.120}")
    path = profile.fit.get("serving_path")
    hops = None
    if isinstance(path, dict) and "samples" in path:
        hops = HopSamples.from_json(path["samples"], f"{where}: serving path samples")
    return samples, hops


def _refit_from_hops(profile: CostProfile, where: str) -> CostProfile:
    found = profile.fit.get("serving_path")
    path: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
    hops = path.get("hops")
    ttft = hops.get("client_ttft") if isinstance(hops, dict) else None
    if isinstance(ttft, bool) or not isinstance(ttft, (int, float)) or not 0 < ttft < 1e3:
        raise ProfileError(
            f"{where} keeps no calibration samples or serving-path medians to fit again; "
            "calibrate --server again"
        )
    engine = hops.get("engine") if isinstance(hops, dict) else None
    if isinstance(engine, (int, float)) and not isinstance(engine, bool) and 0 <= engine < ttft:
        inside, outside = engine, "engine"
    else:
        inside, outside = engine_model(profile)(PROMPT_TOKENS, 1)[0], "step model"
    request_s = max(0.0, ttft - inside - profile.stream_token_s)
    fitted = {
        **profile.fit,
        "serving_path": {**path, "request_s": request_s, "request_s_outside": outside},
        "refit": "request_s from the serving path's medians (no samples kept); steps as fitted",
    }
    return dataclasses.replace(profile, request_s=request_s, fit=fitted)
