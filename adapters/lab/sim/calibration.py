"""Measure the reference engine's forward pass and fit a cost profile to it.

Step shapes (prefill chunks, decode batches, mixes) run through
:class:`~prefixkv.adapters.engine.TinyTransformer` on whatever device is present, each
timed as the least of several runs; the coefficients are fitted by non-negative least
squares on relative error. The only simulator module that reads a clock or imports torch.
"""

from __future__ import annotations

import functools
import math
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from prefixkv.storage.extras import TORCH_EXTRA, extra_imports

from .config import DEFAULT_BLOCK_SIZE
from .errors import SimSettingsError
from .profile import COEFFICIENTS, CostProfile, attention_pairs

if TYPE_CHECKING:
    from prefixkv.adapters.engine import EngineConfig

__all__ = [
    "DEFAULT_DECODE_SHAPES",
    "DEFAULT_MIXED_SHAPES",
    "DEFAULT_PREFILL_SHAPES",
    "QUICK_SHAPES",
    "StepSample",
    "calibrate",
    "fit_profile",
    "measure_engine",
]

_WHAT = "the reference engine's calibration"

DEFAULT_PREFILL_SHAPES: tuple[tuple[int, int], ...] = (
    (16, 0), (64, 0), (256, 0), (512, 0), (1024, 0),
    (64, 512), (256, 512), (64, 1024), (256, 1024), (512, 1536),
)  # fmt: skip
"""``(q, s)``: a prefill chunk of ``q`` tokens after ``s`` cached ones."""
DEFAULT_DECODE_SHAPES: tuple[tuple[int, int], ...] = (
    (1, 64), (1, 1024), (4, 256), (8, 64), (8, 1024),
    (16, 256), (32, 64), (32, 512), (64, 128),
)  # fmt: skip
"""``(b, c)``: ``b`` decode rows, each over ``c`` tokens of context."""
DEFAULT_MIXED_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (64, 0, 8, 256), (256, 512, 16, 128), (512, 0, 4, 1024),
)  # fmt: skip
"""``(q, s, b, c)``: one prefill chunk and ``b`` decode rows in the same step."""

QUICK_SHAPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "prefill": ((8, 0), (32, 0), (32, 64), (64, 32)),
    "decode": ((1, 16), (4, 32), (8, 8)),
    "mixed": ((16, 0, 2, 16),),
}
"""A few small shapes (enough for the 5 coefficients): a rough profile in seconds."""


DEFAULT_MAX_BYTES = 8 * 2**30
"""The most memory a calibration may need before it is refused (a size typed wrong
fails in one line, not in the allocator)."""


class StepSample(NamedTuple):
    """One measurement: its work (the profile's units) and its seconds.

    One engine step by default; a served request's TTFT is ``num_steps`` steps plus
    ``num_requests`` request overheads plus ``num_streamed`` streamed tokens. ``runs``:
    how many timed runs its seconds are the median of (the fit weighs it by the root).
    """

    prefill_tokens: int
    prefill_pairs: int
    num_decode: int
    decode_context: int
    seconds: float
    num_steps: int = 1
    num_requests: int = 0
    num_streamed: int = 0
    runs: int = 1


def _steps(
    prefill: Sequence[tuple[int, int]],
    decode: Sequence[tuple[int, int]],
    mixed: Sequence[tuple[int, int, int, int]],
) -> list[tuple[list[tuple[int, int]], list[int]]]:
    """Each step as ``([(q, s)] prefill chunks, [c] decode rows)``, the shapes checked."""
    kinds = (
        ("prefill", prefill, (1, 0)),
        ("decode", decode, (1, 0)),
        ("mixed", mixed, (1, 0, 1, 0)),
    )
    for kind, shapes, lows in kinds:
        for shape in shapes:
            ok = isinstance(shape, tuple) and len(shape) == len(lows)
            if not ok or any(
                type(v) is not int or v < lo for v, lo in zip(shape, lows, strict=True)
            ):
                raise SimSettingsError(
                    f"{kind} shape {shape!r:.60}: want {len(lows)} ints, each >= {lows}"
                )
    steps: list[tuple[list[tuple[int, int]], list[int]]] = [([(q, s)], []) for q, s in prefill]
    steps += [([], [c] * b) for b, c in decode]
    steps += [([(q, s)], [c] * b) for q, s, b, c in mixed]
    return steps


def estimate_bytes(
    config: EngineConfig, steps: Sequence[tuple[Sequence[tuple[int, int]], Sequence[int]]]
) -> int:
    """An upper estimate of what measuring ``steps`` on ``config``'s model allocates:
    weights, a KV cache and activations for the largest step (pure int arithmetic)."""
    m = config.model
    elem = 8 if "64" in str(config.torch_dtype) else 4
    hidden, mlp, vocab = m.hidden_size, m.mlp_size, m.vocab_size
    q_width, kv_width = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    per_layer = 2 * hidden + 2 * hidden * q_width + 2 * hidden * kv_width + 3 * hidden * mlp
    weights = 2 * vocab * hidden + m.num_layers * per_layer + hidden
    largest = max(vocab * hidden, hidden * mlp, hidden * q_width)
    bs = config.block_size or DEFAULT_BLOCK_SIZE
    kv_blocks = tokens = scores = 0
    for pre, dec in steps:
        rows = [*pre, *((1, c) for c in dec)]
        kv_blocks = max(kv_blocks, sum(-(-(s + q) // bs) for q, s in rows))
        tokens = max(tokens, sum(q for q, _ in rows))
        scores = max(scores, sum(q * (s + q) for q, s in rows) * m.num_heads)
    kv = 2 * m.num_layers * kv_blocks * bs * kv_width
    activations = 4 * tokens * (hidden + q_width + 2 * kv_width + 2 * mlp + vocab) + 2 * scores
    return elem * (weights + kv + activations) + 8 * largest


def measure_engine(
    config: EngineConfig | None = None,
    *,
    prefill: Sequence[tuple[int, int]] = DEFAULT_PREFILL_SHAPES,
    decode: Sequence[tuple[int, int]] = DEFAULT_DECODE_SHAPES,
    mixed: Sequence[tuple[int, int, int, int]] = DEFAULT_MIXED_SHAPES,
    repeats: int = 5,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
    progress: Callable[[int], object] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[StepSample]:
    """Time the reference engine's forward pass (``config``: default ``EngineConfig()``)
    on each step shape, the least of ``repeats`` timed runs after ``warmup`` untimed ones;
    one sample per shape, prefill, decode, then mixed. ``progress`` is called with 1 after
    each forward pass.

    Raises:
        SimSettingsError: a bad shape, ``repeats`` or ``warmup``, or a model and
            shapes needing more than ``max_bytes`` (by :func:`estimate_bytes`).
    """
    with extra_imports(*TORCH_EXTRA, _WHAT):
        import torch

    from prefixkv.adapters.engine import EngineConfig, TinyTransformer

    cfg = EngineConfig() if config is None else config
    _check_counts(
        repeats=(repeats, 1, 1000), warmup=(warmup, 0, 1000), max_bytes=(max_bytes, 1, 2**63)
    )
    bs = cfg.block_size or DEFAULT_BLOCK_SIZE
    steps = _steps(prefill, decode, mixed)
    _check_memory(cfg, steps, max_bytes)
    rows = [[*pre, *((1, c) for c in dec)] for pre, dec in steps]
    model = TinyTransformer(cfg.model, dtype=cfg.torch_dtype, device=cfg.torch_device)
    kv = model.make_kv_cache(max(sum(-(-(s + q) // bs) for q, s in r) for r in rows), bs)
    batches = [_step_chunks(row, bs, cfg.model.vocab_size) for row in rows]
    device = cfg.torch_device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    forwards = [functools.partial(model.forward, chunks, kv) for chunks in batches]
    best = _least_seconds(forwards, warmup, repeats, clock, sync, progress)
    return [_sample(pre, dec, t) for (pre, dec), t in zip(steps, best, strict=True)]


def _sample(pre: list[tuple[int, int]], dec: list[int], seconds: float) -> StepSample:
    return StepSample(
        prefill_tokens=sum(q for q, _ in pre),
        prefill_pairs=sum(attention_pairs(q, s) for q, s in pre),
        num_decode=len(dec),
        decode_context=sum(c + 1 for c in dec),
        seconds=seconds,
    )


def _check_counts(**counts: tuple[object, int, int]) -> None:
    for name, (value, low, high) in counts.items():
        if type(value) is not int or not low <= value <= high:
            raise SimSettingsError(f"{name} must be an int in [{low}, {high}], got {value!r:.60}")


def _check_memory(
    cfg: EngineConfig, steps: list[tuple[list[tuple[int, int]], list[int]]], max_bytes: int
) -> None:
    need = estimate_bytes(cfg, steps)
    if need > max_bytes:
        m = cfg.model
        raise SimSettingsError(
            f"calibrating a model of {m.num_layers} layers, {m.num_heads} heads x {m.head_dim}, "
            f"vocab {m.vocab_size} needs about {need / 2**30:,.1f} GiB, over the limit of "
            f"{max_bytes / 2**30:,.1f} GiB (max_bytes); choose smaller sizes"
        )


def _step_chunks(row: list[tuple[int, int]], bs: int, vocab: int) -> list[Any]:
    # One step's SeqChunks: each (q, s) sequence gets its own blocks and q fresh tokens.
    from prefixkv.adapters.engine import SeqChunk

    chunks, first = [], 0
    for q, s in row:
        n = -(-(s + q) // bs)
        tokens = [(first + i) % (vocab - 1) + 1 for i in range(q)]
        chunks.append(SeqChunk(tokens, s, list(range(first, first + n))))
        first += n
    return chunks


def _least_seconds(
    forwards: Sequence[Callable[[], object]],
    warmup: int,
    repeats: int,
    clock: Callable[[], float],
    sync: Callable[[], object] | None,
    progress: Callable[[int], object] | None,
) -> list[float]:
    # round robin over the shapes, so a burst of other work spoils no shape's every run
    best = [math.inf] * len(forwards)
    for i in range(warmup + repeats):
        for k, forward in enumerate(forwards):
            if sync is not None:
                sync()
            t0 = clock()
            forward()
            if sync is not None:
                sync()
            if i >= warmup:
                best[k] = min(best[k], clock() - t0)
            if progress is not None:
                progress(1)
    return best


_UNITS = {
    "step_s": "num_steps",
    "prefill_token_s": "prefill_tokens",
    "prefill_attention_s": "prefill_pairs",
    "decode_seq_s": "num_decode",
    "decode_context_s": "decode_context",
    "request_s": "num_requests",
    "stream_token_s": "num_streamed",
}
"""The :class:`StepSample` field each fitted coefficient multiplies."""

EXACT_WEIGHT = 1000.0
"""How many times an ``exact`` sample's relative error counts in :func:`fit_profile`."""


def fit_profile(
    samples: Sequence[StepSample],
    *,
    name: str,
    model: str,
    device: str,
    source: str,
    notes: str = "",
    known: Mapping[str, float] | None = None,
    exact: Sequence[StepSample] = (),
    **metadata: Any,
) -> CostProfile:
    """Fit the profile's coefficients to measured steps (NNLS on relative error).

    Each sample's error counts ``sqrt(runs)`` times, the ``exact`` ones' (timed inside
    the engine) :data:`EXACT_WEIGHT` times more. ``request_s`` and ``stream_token_s``
    are fitted where samples count them, unless ``known`` gives them (then their part is
    taken off first). ``metadata`` goes to :class:`CostProfile` as is.

    Raises:
        ValueError: fewer samples than coefficients; a ``known`` name other than
            ``request_s`` or ``stream_token_s``.
    """
    import numpy as np

    fixed = dict(known or {})
    names = _fitted_names(samples, fixed)
    samples = [*samples, *exact]
    work = np.array([[getattr(s, _UNITS[k]) for k in names] for s in samples], dtype=float)
    measured = np.array([s.seconds for s in samples])
    outside = np.array(
        [sum(v * getattr(s, _UNITS[k]) for k, v in fixed.items()) for s in samples], dtype=float
    )
    weight = np.sqrt([max(1, s.runs) for s in samples])
    weight[len(samples) - len(exact) :] *= EXACT_WEIGHT
    coef = _relative_nnls(work, measured, outside, weight)
    error = np.abs(work @ coef + outside - measured) / measured
    fitted: dict[str, Any] = {k: float(v) for k, v in zip(names, coef, strict=True)}
    fitted.update(fixed)
    return CostProfile(
        name=name,
        model=model,
        device=device,
        source=source,
        notes=notes,
        fit={
            "num_samples": len(samples),
            "relative_error_p50": round(float(np.percentile(error, 50)), 4),
            "relative_error_max": round(float(error.max()), 4),
            "seconds_range": [float(measured.min()), float(measured.max())],
        },
        **fitted,
        **metadata,
    )


def _fitted_names(samples: Sequence[StepSample], fixed: Mapping[str, float]) -> list[str]:
    """The coefficients to fit: the step's, and ``request_s`` and ``stream_token_s`` where
    ``samples`` count them and ``fixed`` does not give them."""
    if not set(fixed) <= {"request_s", "stream_token_s"}:
        raise ValueError(f"known: only request_s and stream_token_s, got {sorted(fixed)}")
    names = [*COEFFICIENTS]
    for k in ("request_s", "stream_token_s"):
        if k not in fixed and any(getattr(s, _UNITS[k]) for s in samples):
            names.append(k)
    if len(samples) < len(names):
        raise ValueError(f"need at least {len(names)} samples, got {len(samples)}")
    return names


def _relative_nnls(work: Any, measured: Any, outside: Any, weight: Any) -> Any:
    """Non-negative coefficients of ``work`` fitting ``measured - outside`` by weighted
    relative error."""
    import numpy as np
    from scipy.optimize import nnls

    # a sample the known terms explain whole keeps 1% of its time: its weight stays bounded
    seconds = np.maximum(measured - outside, 0.01 * measured)
    # columns scaled to unit norm: their units differ by orders of magnitude
    weighted = work * (weight / seconds)[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(weighted / scale, weight)
    return coef / scale


def calibrate(
    config: EngineConfig | None = None,
    *,
    name: str | None = None,
    repeats: int = 5,
    progress: Callable[[int], object] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    **shapes: Sequence[tuple[int, ...]],
) -> CostProfile:
    """Measure the reference engine (``config``: default ``EngineConfig()`` on CUDA when
    available, else on the CPU) by :func:`measure_engine` and fit a profile (``name``:
    default ``reference-engine-<device>``).

    Raises:
        SimSettingsError: see :func:`measure_engine`.
    """
    with extra_imports(*TORCH_EXTRA, _WHAT):
        import torch

    from prefixkv.adapters.engine import EngineConfig

    if config is None:
        config = EngineConfig(device="cuda" if torch.cuda.is_available() else "cpu")
    samples = measure_engine(
        config,
        repeats=repeats,
        progress=progress,
        max_bytes=max_bytes,
        **shapes,  # type: ignore[arg-type]
    )
    dev = config.torch_device
    m = config.model
    return fit_profile(
        samples,
        name=name or f"reference-engine-{dev.type}",
        model=(
            f"prefixkv TinyTransformer: {m.num_layers} layers, {m.num_heads} heads "
            f"({m.num_kv_heads} KV) x {m.head_dim}, MLP {m.mlp_size}, vocab {m.vocab_size}, "
            f"{str(config.torch_dtype).removeprefix('torch.')}"
        ),
        device=_device_name(dev),
        source=f"measured by prefixkv calibrate (torch {torch.__version__})",
        notes=(
            f"Forward pass only (least of {repeats} runs), block size "
            f"{config.block_size or DEFAULT_BLOCK_SIZE}; the scheduler's own time is not "
            "included."
        ),
    )


def _device_name(dev: Any) -> str:
    """The GPU's name, or the CPU's architecture and torch's thread count."""
    import torch

    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return f"CPU {platform.machine()} ({torch.get_num_threads()} torch threads)"
