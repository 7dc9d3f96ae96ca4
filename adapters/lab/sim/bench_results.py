"""Fit a cost profile to the per-request results of ``vllm bench serve``.

``vllm bench serve --save-result --save-detailed`` writes, per request, ``input_lens``,
``output_lens``, ``start_times``, ``ttfts``, ``itls`` and ``errors``. The steps are read
back from those times: a request that ran alone gives a TTFT sample, and a gap between
two moments at which every request in flight streamed a token, while none waited for its
first, a decode step. Prompts count as uncached (the file does not say the hits). A
results file is input: a regular file, bounded in bytes and values, every number checked.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from prefixkv.adapters.inputs import read_input

from ..messages import one_line
from .calibration import StepSample, fit_profile
from .config import DEFAULT_MAX_NUM_BATCHED_TOKENS
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

MAX_RESULTS_BYTES = 256 * 2**20
"""Most bytes of one results file."""
MAX_RESULTS_VALUES = 2**24
"""Most JSON values of one results file, counted before it is parsed."""

# past these ranges a per-request number is a fault in the file
_MAX_TOKENS = 2**24
_MAX_CLOCK_S = 1e10
_MIN_TTFT_S, _MAX_SPAN_S = 1e-6, 1e6
_SPACE = re.compile(r"\s*")


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
        return list(itertools.accumulate(self.itl_s, initial=self.start_s + self.ttft_s))


def _documents(text: str, where: str) -> list[Mapping[str, Any]]:
    """The JSON documents of ``text`` one after another (``--append-result``)."""
    decoder = json.JSONDecoder()
    docs, pos = [], 0
    while True:
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # \s* always matches
        if pos == len(text):
            break
        try:
            doc, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:  # a 5,000-digit number, deep nesting
            raise CalibrationInputError(f"{where}: not JSON ({one_line(str(exc), 160)})") from None
        if not isinstance(doc, Mapping):
            raise CalibrationInputError(f"{where}: a result must be a JSON object")
        docs.append(doc)
    if not docs:
        raise CalibrationInputError(f"{where}: empty")
    return docs


def _read_text(path: str | os.PathLike[str], max_bytes: int, max_values: int) -> str:
    where = os.fspath(path)
    data = read_input(path, max_bytes, what="results file", error=CalibrationInputError)
    # Every JSON value but a document follows a comma, a colon or an opening bracket.
    values = sum(data.count(c) for c in (b",", b":", b"["))
    if values > max_values:
        raise CalibrationInputError(
            f"{where}: about {values:,} JSON values, more than the {max_values:,} a results "
            "file may hold"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CalibrationInputError(f"{where}: not UTF-8 (byte {exc.start:,})") from None


def _count(value: Any, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{_show(value)} is not a whole number in [{low:,}, {high:,}]")
    return value


def _seconds(value: Any, low: float, high: float) -> float:
    if type(value) not in (int, float) or not low <= value <= high:  # NaN fails both
        raise ValueError(f"{_show(value)} is not a number of seconds in [{low:g}, {high:g}]")
    return float(value)


def _request(p: Any, o: Any, s: Any, t: Any, itl: Any) -> BenchRequest:
    if not isinstance(itl, list):
        raise ValueError(f"itls {_show(itl)} is not a list")
    return BenchRequest(
        _count(p, 1, _MAX_TOKENS),
        _count(o, 0, _MAX_TOKENS),
        _seconds(s, -_MAX_CLOCK_S, _MAX_CLOCK_S),
        _seconds(t, _MIN_TTFT_S, _MAX_SPAN_S),
        tuple(_seconds(g, 0.0, _MAX_SPAN_S) for g in itl),
    )


def _show(value: Any) -> str:
    if type(value) is int and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit number"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _name(value: Any) -> str:
    """A text field of the run: ``""`` unless text of at most 1,024 characters."""
    return value if isinstance(value, str) and len(value) <= 1024 else ""


def read_vllm_bench(
    path: str | os.PathLike[str],
    *,
    max_bytes: int = MAX_RESULTS_BYTES,
    max_values: int = MAX_RESULTS_VALUES,
) -> tuple[list[BenchRequest], dict[str, Any]]:
    """The successful requests of a results file, and its run's metadata
    (``model_id``, ``date``, ``backend``, ``request_rate``, ...).

    Raises:
        CalibrationInputError: not a regular file, past ``max_bytes`` or ``max_values``
            (JSON values, counted before parsing), unreadable, not UTF-8 or JSON, a
            per-request list missing or of another length, or a bad value.
    """
    where = os.fspath(path)
    requests: list[BenchRequest] = []
    meta: dict[str, Any] = {}
    for k, doc in enumerate(_documents(_read_text(path, max_bytes, max_values), where)):
        here = f"{where} (result {k + 1})"
        missing = [key for key in _PER_REQUEST if not isinstance(doc.get(key), list)]
        if missing:
            raise CalibrationInputError(
                f"{here}: no per-request {', '.join(missing)}; save it with "
                "vllm bench serve --save-result --save-detailed"
            )
        lists = [doc[key] for key in _PER_REQUEST]
        errors = doc.get("errors")
        if errors is None:
            errors = [""] * len(lists[0])
        if not isinstance(errors, list):
            raise CalibrationInputError(f"{here}: errors is not a list")
        if len({len(x) for x in [*lists, errors]}) != 1:
            raise CalibrationInputError(f"{here}: per-request lists of different lengths")
        for i, (p, o, s, t, itl, err) in enumerate(zip(*lists, errors, strict=True)):
            if err is not None and not isinstance(err, str):
                raise CalibrationInputError(f"{here}: request {i}: errors {_show(err)} is not text")
            if err:
                continue  # a failed request: vLLM records ttft 0 and no gaps
            try:
                requests.append(_request(p, o, s, t, itl))
            except ValueError as exc:
                raise CalibrationInputError(
                    f"{here}: request {i}: {exc}; want a prompt >= 1 token, a TTFT > 0 and "
                    "gaps >= 0, all finite"
                ) from None
        for key in ("model_id", "date", "backend", "request_rate", "max_concurrency"):
            if key in doc and key not in meta:
                meta[key] = doc[key]
    return requests, meta


def bench_samples(
    requests: Sequence[BenchRequest],
    *,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    same_step_s: float = 5e-4,
) -> tuple[list[StepSample], list[StepSample]]:
    """``(TTFT samples, decode-step samples)`` read back from one run's requests.

    Linear after one sort: who was in flight is a count of sorted times.

    Args:
        requests: from :func:`read_vllm_bench`.
        max_num_batched_tokens: the server's step budget.
        same_step_s: tokens streamed within this many seconds count as one step's.
    """
    import numpy as np

    if not same_step_s >= 0:
        raise CalibrationInputError(f"same_step_s must be >= 0, got {same_step_s!r}")
    usable = [r for r in requests if len(r.itl_s) == r.output_tokens - 1]
    times = [r.token_times() for r in usable]
    spans = _Spans(
        np.array([r.start_s for r in usable], dtype=np.float64),
        np.array([t[0] for t in times], dtype=np.float64),
        np.array([t[-1] for t in times], dtype=np.float64),
    )
    # alone: of the requests sent by its first token, all but itself ended before it
    in_flight = spans.sent_by(spans.first, "right") - spans.ended_before(spans.start)
    ttft: list[StepSample] = []
    for i in np.flatnonzero(in_flight == 1).tolist():
        r = usable[i]
        p = r.prompt_tokens
        steps = -(-p // max_num_batched_tokens)
        ttft.append(StepSample(p, attention_pairs(p, 0), 0, 0, r.ttft_s, steps, 1))
    return ttft, _decode_steps(usable, times, spans, same_step_s)


class _Spans:
    """Each request's start, first-token and last-token times, and counts of them."""

    def __init__(self, start: Any, first: Any, last: Any) -> None:
        import numpy as np

        self.start, self.first, self.last = start, first, last
        self._start, self._first, self._last = np.sort(start), np.sort(first), np.sort(last)

    def sent_by(self, t: Any, side: Literal["left", "right"]) -> Any:
        return self._start.searchsorted(t, side=side)

    def ended_before(self, t: Any) -> Any:
        return self._last.searchsorted(t, side="left")

    def first_by(self, t: Any) -> Any:
        return self._first.searchsorted(t, side="right")


def _decode_steps(
    usable: Sequence[BenchRequest], times: Sequence[list[float]], spans: _Spans, same_step_s: float
) -> list[StepSample]:
    """The pure decode steps (see the module docstring)."""
    import numpy as np

    if not times:
        return []
    when = np.fromiter(itertools.chain.from_iterable(times), np.float64)
    who = np.repeat(np.arange(len(times)), [len(t) for t in times])
    nth = np.concatenate([np.arange(len(t)) for t in times])
    order = np.lexsort((nth, who, when))  # by time, then request, then token
    when, who, nth = when[order], who[order], nth[order]
    # a step: a run of tokens each within same_step_s of the one before
    cut = np.flatnonzero(np.diff(when) > same_step_s) + 1
    bounds = np.concatenate(([0], cut, [len(when)]))
    ends = when[bounds[1:] - 1]  # each step's last token
    t0, t1 = ends[:-1], ends[1:]  # the gap from each step to the next
    # sent before t1 with no first token by t0: waiting; first token by t0, not done: live
    first_by = spans.first_by(t0)
    waiting = spans.sent_by(t1, "left") - first_by
    live = first_by - spans.ended_before(t1)
    out = []
    for g in np.flatnonzero(waiting == 0).tolist():
        lo, hi = int(bounds[g + 1]), int(bounds[g + 2])
        emitters = dict(zip(who[lo:hi].tolist(), nth[lo:hi].tolist(), strict=True))
        if len(emitters) != hi - lo or 0 in emitters.values():
            continue  # a first token (this step prefilled), or two tokens of one request
        if live[g] != len(emitters) or not all(
            spans.first[i] <= t0[g] and spans.last[i] >= t1[g] for i in emitters
        ):
            continue  # a request in flight that streamed nothing, or one that ended
        context = sum(usable[i].prompt_tokens + k for i, k in emitters.items())
        out.append(StepSample(0, 0, len(emitters), context, float(t1[g] - t0[g])))
    return out


def calibrate_from_vllm_bench(
    paths: Iterable[str | os.PathLike[str]],
    *,
    name: str | None = None,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> CostProfile:
    """Fit a profile to ``vllm bench serve --save-detailed`` results files (each one run).

    Raises:
        CalibrationInputError: a bad file, or under 3 requests that ran alone or 3 pure
            decode steps.
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
        models.append(_name(meta.get("model_id")))
        dates.append(_name(meta.get("date")))
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
