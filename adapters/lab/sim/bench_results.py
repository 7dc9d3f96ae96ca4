"""Fit a cost profile to the per-request results of ``vllm bench serve``.

``vllm bench serve --save-result --save-detailed`` writes one JSON document (several,
one a line, with ``--append-result``) holding, per request, ``input_lens``,
``output_lens``, ``start_times`` (the client's ``perf_counter`` when it sent the
request), ``ttfts``, ``itls`` (the gaps between streamed tokens) and ``errors``
(vLLM's ``benchmarks/serve.py``). The engine's steps are read back from those times:

- a request that ran alone (no other request in flight between its sending and its
  first token) gives a TTFT sample: the request overhead plus the steps of its
  whole prompt's prefill;
- a decode step is a gap between two consecutive moments at which every request in
  flight streamed a token, while no request waited for its first token: ``b`` rows,
  each over its prompt plus the tokens it had generated.

The file does not say how many prompt tokens the server had cached, so the prompts
count as uncached: run the benchmark with ``--no-enable-prefix-caching`` on the
server, or a dataset without shared prefixes, for an exact fit. Streams that bundle
several tokens in one chunk (``--stream-interval`` > 1) are left out.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from .calibration import StepSample, fit_profile
from .errors import ProfileError
from .profile import CostProfile, attention_pairs

__all__ = [
    "BenchRequest",
    "CalibrationInputError",
    "bench_samples",
    "calibrate_from_vllm_bench",
    "read_vllm_bench",
]

_PER_REQUEST = ("input_lens", "output_lens", "start_times", "ttfts", "itls")


class CalibrationInputError(ProfileError):
    """A results file is not what ``vllm bench serve --save-detailed`` writes, or
    holds too few usable requests to fit a profile."""


class BenchRequest(NamedTuple):
    """One successful request of a results file (seconds on the client's clock)."""

    prompt_tokens: int
    output_tokens: int
    start_s: float
    ttft_s: float
    itl_s: tuple[float, ...]

    def token_times(self) -> list[float]:
        """When each of its tokens streamed."""
        t = self.start_s + self.ttft_s
        out = [t]
        for gap in self.itl_s:
            t += gap
            out.append(t)
        return out


def _documents(text: str, where: str) -> list[Mapping[str, Any]]:
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            break
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise CalibrationInputError(f"{where}: not JSON ({exc})") from None
        if not isinstance(doc, Mapping):
            raise CalibrationInputError(f"{where}: a result must be a JSON object")
        docs.append(doc)
    if not docs:
        raise CalibrationInputError(f"{where}: empty")
    return docs


def read_vllm_bench(path: str | os.PathLike[str]) -> tuple[list[BenchRequest], dict[str, Any]]:
    """The successful requests of a results file, and its run's metadata
    (``model_id``, ``date``, ``backend``, ``request_rate``, ...).

    Raises:
        CalibrationInputError: not JSON, a per-request list missing (the file was
            saved without ``--save-detailed``), lists of different lengths or a bad
            value.
        OSError: the file cannot be read.
    """
    where = str(path)
    requests: list[BenchRequest] = []
    meta: dict[str, Any] = {}
    for k, doc in enumerate(_documents(Path(path).read_text(encoding="utf-8"), where)):
        here = f"{where} (result {k + 1})"
        missing = [key for key in _PER_REQUEST if not isinstance(doc.get(key), list)]
        if missing:
            raise CalibrationInputError(
                f"{here}: no per-request {', '.join(missing)}; save it with "
                "vllm bench serve --save-result --save-detailed"
            )
        lists = [doc[key] for key in _PER_REQUEST]
        errors = doc.get("errors") or [""] * len(lists[0])
        if len({len(x) for x in [*lists, errors]}) != 1:
            raise CalibrationInputError(f"{here}: per-request lists of different lengths")
        for i, (p, o, s, t, itl, err) in enumerate(zip(*lists, errors, strict=True)):
            if err:
                continue  # a failed request: vLLM records ttft 0 and no gaps
            try:
                req = BenchRequest(int(p), int(o), float(s), float(t), tuple(map(float, itl)))
            except (TypeError, ValueError):
                raise CalibrationInputError(f"{here}: request {i}: a bad value") from None
            if req.prompt_tokens < 1 or req.ttft_s <= 0 or any(g < 0 for g in req.itl_s):
                raise CalibrationInputError(
                    f"{here}: request {i}: prompt {p}, ttft {t}: want a prompt >= 1 token, "
                    "a TTFT > 0 and gaps >= 0"
                )
            requests.append(req)
        for key in ("model_id", "date", "backend", "request_rate", "max_concurrency"):
            if key in doc and key not in meta:
                meta[key] = doc[key]
    return requests, meta


def bench_samples(
    requests: Sequence[BenchRequest],
    *,
    max_num_batched_tokens: int = 8192,
    same_step_s: float = 5e-4,
) -> tuple[list[StepSample], list[StepSample]]:
    """``(TTFT samples, decode-step samples)`` read back from the requests' times.

    Args:
        requests: from :func:`read_vllm_bench` (one run: one clock).
        max_num_batched_tokens: the server's step budget (a longer prompt took
            several steps).
        same_step_s: tokens streamed within this many seconds of each other count
            as one step's.
    """
    usable = [r for r in requests if len(r.itl_s) == r.output_tokens - 1]
    times = [r.token_times() for r in usable]
    spans = [(r.start_s, t[0], t[-1]) for r, t in zip(usable, times, strict=True)]
    ttft: list[StepSample] = []
    for i, r in enumerate(usable):
        start, first, _ = spans[i]
        alone = all(
            j == i or end < start or other_start > first
            for j, (other_start, _, end) in enumerate(spans)
        )
        if alone:
            p = r.prompt_tokens
            steps = -(-p // max_num_batched_tokens)
            ttft.append(StepSample(p, attention_pairs(p, 0), 0, 0, r.ttft_s, steps, 1))
    return ttft, _decode_steps(usable, times, spans, same_step_s)


def _decode_steps(
    usable: Sequence[BenchRequest],
    times: Sequence[list[float]],
    spans: Sequence[tuple[float, float, float]],
    same_step_s: float,
) -> list[StepSample]:
    events = sorted((t, i, k) for i, ts in enumerate(times) for k, t in enumerate(ts))
    steps: list[list[tuple[float, int, int]]] = []
    for e in events:
        if steps and e[0] - steps[-1][-1][0] <= same_step_s:
            steps[-1].append(e)
        else:
            steps.append([e])
    out = []
    for prev, step in itertools.pairwise(steps):
        t0, t1 = prev[-1][0], step[-1][0]
        emitters = {i: k for _, i, k in step}
        if len(emitters) != len(step) or any(k == 0 for k in emitters.values()):
            continue  # a first token: this step prefilled
        if any(s < t1 and first > t0 for s, first, _ in spans):
            continue  # a request waiting for its first token: a prefill may share it
        live = {i for i, (_, first, last) in enumerate(spans) if first <= t0 and last >= t1}
        if live != set(emitters):
            continue
        context = sum(usable[i].prompt_tokens + k for i, k in emitters.items())
        out.append(StepSample(0, 0, len(emitters), context, t1 - t0))
    return out


def calibrate_from_vllm_bench(
    paths: Iterable[str | os.PathLike[str]],
    *,
    name: str | None = None,
    max_num_batched_tokens: int = 8192,
) -> CostProfile:
    """Fit a profile to ``vllm bench serve --save-detailed`` results files.

    Each file is one run (one client clock); their samples are fitted together.

    Raises:
        CalibrationInputError: a bad file, or fewer than 3 requests that ran alone
            or 3 pure decode steps (run part of the benchmark at a low
            ``--request-rate`` or ``--max-concurrency 1``, and part with several
            requests at once).
    """
    ttft: list[StepSample] = []
    decode: list[StepSample] = []
    models: list[str] = []
    dates: list[str] = []
    files = [str(p) for p in paths]
    for path in files:
        requests, meta = read_vllm_bench(path)
        t, d = bench_samples(requests, max_num_batched_tokens=max_num_batched_tokens)
        ttft += t
        decode += d
        models.append(str(meta.get("model_id", "")))
        dates.append(str(meta.get("date", "")))
    lengths = len({s.prefill_tokens for s in ttft})
    if len(ttft) < 3 or len(decode) < 3 or lengths < 3:
        raise CalibrationInputError(
            f"{', '.join(files)}: {len(ttft)} requests ran alone ({lengths} prompt "
            f"lengths) and {len(decode)} pure decode steps; a fit needs 3 of each: "
            "run part of the benchmark at a low --request-rate or --max-concurrency 1, with "
            "varied prompt lengths, and part with several requests at once"
        )
    model = next((m for m in models if m), "unknown model")
    per_step = [min(s.prefill_tokens, max_num_batched_tokens) for s in ttft]
    contexts = [s.prefill_tokens for s in ttft] + [s.decode_context // s.num_decode for s in decode]
    return fit_profile(
        [*ttft, *decode],
        name=name or f"vllm-bench-{os.path.basename(model.rstrip('/')) or 'model'}",
        model=model,
        device="the server of the vllm bench serve run (the file does not say)",
        source="fitted by prefixkv calibrate --from-vllm-bench " + " ".join(files),
        notes=(
            f"{len(ttft)} requests that ran alone (TTFT) and {len(decode)} pure decode steps "
            "read back from the streamed token times; prompts counted as uncached (the "
            f"file does not say the hits); step budget {max_num_batched_tokens:,} tokens."
        ),
        measured_on={"model": model, "engine": "vllm bench serve results", "date": dates[0]},
        covers={
            "prefill_tokens": [min(per_step), max(per_step)],
            "context_tokens": [min(contexts), max(contexts)],
            "batch_size": [min(s.num_decode for s in decode), max(s.num_decode for s in decode)],
        },
    )
