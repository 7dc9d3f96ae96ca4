"""Cost profiles: what one engine step costs on a given model and device.

A step's time is a fixed cost plus what its prefill chunks and decode rows add (the
decomposition Vidur and roofline models use):

    step = step_s
         + prefill_token_s     * (prefill tokens)
         + prefill_attention_s * (query x attended token pairs)
         + decode_seq_s        * (decode rows)
         + decode_context_s    * (context tokens decode rows read)

A chunk of ``q`` tokens after ``s`` cached ones attends to ``q * s + q * (q + 1) / 2``
pairs, so chunking does not change the attention term. The serving terms
(:data:`SERVING_TERMS`, :data:`SPREAD_TABLES`) price a served front end outside the
steps; they are 0 (empty) unless measured (:mod:`.serving_path`). A profile is a small
JSON file.
"""

from __future__ import annotations

import importlib.resources
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import atomic_writer

from .errors import ProfileError
from .serving_spread import QUANTILES

__all__ = [
    "COEFFICIENTS",
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "DEFAULT_PROFILE",
    "RANGE_KEYS",
    "CostProfile",
    "attention_pairs",
    "available_profiles",
    "load_profile",
    "save_profile",
    "shipped_json",
]

COEFFICIENTS = (
    "step_s",
    "prefill_token_s",
    "prefill_attention_s",
    "decode_seq_s",
    "decode_context_s",
)
"""The coefficient names every profile has, in seconds per unit."""

SERVING_TERMS = (
    "request_s",
    "stream_token_s",
    "frontend_request_cpu_s",
    "frontend_cpu_share",
    "wake_s",
    "wake_after_s",
    "admit_s",
    "pace_window_s",
)
"""The serving path's terms (outside the engine's steps), each 0 when not measured."""

SPREAD_TABLES = (
    "request_spread_s",
    "busy_request_spread_s",
    "pace_spread",
    "decoding_request_spread_s",
)
"""Quantile tables of the serving path's spread (:mod:`.serving_spread`) and of the
engine's pace; empty when not measured."""

HARDWARE = ("kv_bytes_per_token", "device_memory_bytes", "weight_bytes", "kv_cache_tokens")
"""The hardware the profile was measured on, each an int or ``None`` (unknown)."""

RANGE_KEYS = ("prefill_tokens", "context_tokens", "batch_size")
"""What a profile's ``covers`` bounds: prefill tokens a step, context tokens, decode rows a step."""

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's ``--gpu-memory-utilization`` default: the share of device memory it uses."""

MAX_COEFFICIENT_S = 1e3
"""The largest coefficient a profile may have, in seconds per unit (keeps every step finite)."""

DEFAULT_PROFILE = "llama2-70b-tp2-a100"
"""The shipped profile used when none is named."""


def attention_pairs(num_tokens: int, start: int) -> int:
    """(query, key) pairs of causal attention for tokens ``start .. start+num_tokens-1``."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


def _is_seconds(value: Any) -> bool:
    return (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and 0 <= value <= MAX_COEFFICIENT_S  # NaN compares False: refused
    )


@dataclass(frozen=True, slots=True)
class CostProfile:
    """Coefficients of the step-time model for one model on one device.

    The five coefficients are seconds per unit of the module's formula. The serving
    terms: ``request_s`` (a request's time outside the steps), ``stream_token_s`` (the
    front end's seconds per streamed token), ``frontend_request_cpu_s`` (its CPU per
    request), ``frontend_cpu_share`` (step seconds lost per front-end CPU second, in
    ``[0, 1]``), ``wake_s`` (paid by a step that starts an engine idle for
    ``wake_after_s``), ``admit_s`` (paid by a step that first schedules a request), the
    spread tables (quantiles at :data:`~.serving_spread.QUANTILES`) and ``pace_window_s``.
    ``measured_on`` and ``covers`` say what was measured and the range it spans
    (:data:`RANGE_KEYS`); :data:`HARDWARE` sizes the KV pool. Unmeasured values:
    ``weight_bytes=None`` is taken as 0 by ``kv_capacity_tokens``; ``kv_cache_tokens=None``:
    not measured on a server; empty ``busy_request_spread_s`` or ``decoding_request_spread_s``:
    the idle table (``request_spread_s``) stands in; empty ``pace_spread``: factor 1;
    ``pace_window_s=0``: not measured. ``request_spread_s``, when present, replaces
    ``request_s`` (each request draws its own).

    Raises:
        ProfileError: a coefficient or serving term not a number in ``[0,
            MAX_COEFFICIENT_S]`` (a share above 1), every coefficient zero, a bad range,
            table or byte count.
    """

    name: str
    model: str
    device: str
    step_s: float
    prefill_token_s: float
    prefill_attention_s: float
    decode_seq_s: float
    decode_context_s: float
    source: str = ""
    notes: str = ""
    fit: Mapping[str, Any] = field(default_factory=dict)
    request_s: float = 0.0
    stream_token_s: float = 0.0
    frontend_request_cpu_s: float = 0.0
    frontend_cpu_share: float = 0.0
    wake_s: float = 0.0
    wake_after_s: float = 0.0
    admit_s: float = 0.0
    request_spread_s: Sequence[float] = ()
    busy_request_spread_s: Sequence[float] = ()
    decoding_request_spread_s: Sequence[float] = ()
    pace_spread: Sequence[float] = ()
    pace_window_s: float = 0.0
    measured_on: Mapping[str, str] = field(default_factory=dict)
    covers: Mapping[str, Sequence[int]] = field(default_factory=dict)
    kv_bytes_per_token: int | None = None
    device_memory_bytes: int | None = None
    weight_bytes: int | None = None
    kv_cache_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in (*COEFFICIENTS, *SERVING_TERMS):
            value = getattr(self, name)
            if not _is_seconds(value):
                raise ProfileError(
                    f"profile {self.name!r}: {name} must be a number of seconds in "
                    f"[0, {MAX_COEFFICIENT_S:g}], got {value!r:.60}"
                )
        if self.frontend_cpu_share > 1:
            raise ProfileError(
                f"profile {self.name!r}: frontend_cpu_share must be in [0, 1], got "
                f"{self.frontend_cpu_share!r}"
            )
        if not any(getattr(self, name) for name in COEFFICIENTS):
            raise ProfileError(f"profile {self.name!r}: every coefficient is zero")
        for name in SPREAD_TABLES:
            object.__setattr__(self, name, self._spread_table(name, getattr(self, name)))
        object.__setattr__(
            self,
            "covers",
            {k: tuple(v) if isinstance(v, list) else v for k, v in self.covers.items()},
        )
        for key, span in self.covers.items():
            if (
                key not in RANGE_KEYS
                or not isinstance(span, Sequence)
                or len(span) != 2
                or any(type(v) is not int or v < 0 for v in span)
                or span[0] > span[1]
            ):
                raise ProfileError(
                    f"profile {self.name!r}: covers[{key!r}] must be [low, high] ints >= 0 "
                    f"of one of {RANGE_KEYS}, got {span!r:.80}"
                )
        for name in HARDWARE:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 0):
                raise ProfileError(
                    f"profile {self.name!r}: {name} must be an int >= 0 or null, got {value!r}"
                )

    def _spread_table(self, name: str, table: Any) -> tuple[float, ...]:
        """``table`` as a tuple: empty, or non-decreasing seconds, one per quantile."""
        ok = isinstance(table, (list, tuple)) and (
            not table
            or (
                len(table) == len(QUANTILES)
                and all(_is_seconds(v) for v in table)
                and all(a <= b for a, b in itertools.pairwise(table))
            )
        )
        if not ok:
            raise ProfileError(
                f"profile {self.name!r}: {name} must be empty or {len(QUANTILES)} "
                f"non-decreasing seconds in [0, {MAX_COEFFICIENT_S:g}], got {table!r:.80}"
            )
        return tuple(float(v) for v in table)

    def kv_capacity_tokens(
        self, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    ) -> int | None:
        """Tokens of KV the hardware holds, as vLLM sizes its pool (an upper bound:
        activations are not subtracted); else the measured server's pool; else ``None``.

        Raises:
            ProfileError: a utilization outside (0, 1].
        """
        if not (
            isinstance(gpu_memory_utilization, (int, float)) and 0 < gpu_memory_utilization <= 1
        ):
            raise ProfileError(
                f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}"
            )
        if not self.kv_bytes_per_token or self.device_memory_bytes is None:
            return self.kv_cache_tokens
        free = gpu_memory_utilization * self.device_memory_bytes - (self.weight_bytes or 0)
        return max(0, int(free // self.kv_bytes_per_token))

    def extrapolation(self, reached: Mapping[str, int]) -> list[str]:
        """What of ``reached`` (``{key: highest value a run reached}``) lies beyond the
        measured range, one phrase per key."""
        out = []
        for key in RANGE_KEYS:
            span = self.covers.get(key)
            value = reached.get(key, 0)
            if span is not None and value > span[1]:
                what = key.replace("_", " ")
                out.append(
                    f"{what} up to {value:,}, measured up to {span[1]:,} "
                    f"({value / max(1, span[1]):.1f}x)"
                )
        return out

    def prefill_s(self, num_tokens: int, num_cached: int = 0) -> float:
        """Marginal seconds (no ``step_s``) to prefill ``num_tokens`` after ``num_cached``."""
        pairs = attention_pairs(num_tokens, num_cached)
        return self.prefill_token_s * num_tokens + self.prefill_attention_s * pairs

    def decode_s(self, num_seqs: int, num_context_tokens: int) -> float:
        """Marginal seconds of ``num_seqs`` decode rows reading ``num_context_tokens``."""
        return self.decode_seq_s * num_seqs + self.decode_context_s * num_context_tokens

    def step_time(
        self, prefill_tokens: int, prefill_pairs: int, num_decode: int, decode_context: int
    ) -> float:
        """Seconds of one step with the given work."""
        return (
            self.step_s
            + self.prefill_token_s * prefill_tokens
            + self.prefill_attention_s * prefill_pairs
            + self.decode_seq_s * num_decode
            + self.decode_context_s * decode_context
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: metadata and a ``coefficients`` object."""
        return {
            **{k: getattr(self, k) for k in ("name", "model", "device")},
            "coefficients": {k: getattr(self, k) for k in COEFFICIENTS},
            **{k: getattr(self, k) for k in SERVING_TERMS},
            **{k: list(getattr(self, k)) for k in SPREAD_TABLES},
            **{k: getattr(self, k) for k in ("source", "notes")},
            "measured_on": dict(self.measured_on),
            "covers": {k: list(v) for k, v in self.covers.items()},
            **{k: getattr(self, k) for k in HARDWARE},
            "fit": dict(self.fit),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> CostProfile:
        """Read the JSON form written by :meth:`to_dict`.

        Raises:
            ProfileError: a missing field or coefficient, or a bad value.
        """
        if not isinstance(data, Mapping):
            raise ProfileError(f"{where}: a profile must be a JSON object, got {data!r:.80}")
        coefficients = data.get("coefficients")
        if not isinstance(coefficients, Mapping):
            raise ProfileError(f'{where}: missing the "coefficients" object')
        missing = [k for k in COEFFICIENTS if k not in coefficients]
        unknown = sorted(set(coefficients) - set(COEFFICIENTS))
        if missing or unknown:
            raise ProfileError(f"{where}: missing coefficients {missing}, unknown {unknown}")
        given: dict[str, Any] = {}
        for k in ("name", "model", "device", "source", "notes"):
            given[k] = data.get(k, "")
            if not isinstance(given[k], str):
                raise ProfileError(f'{where}: "{k}" must be a string, got {given[k]!r:.80}')
        for k in ("fit", "measured_on", "covers"):
            value = data.get(k, {})
            if not isinstance(value, Mapping):
                raise ProfileError(f'{where}: "{k}" must be an object, got {value!r:.80}')
            given[k] = dict(value)
        if any(not isinstance(v, str) for v in given["measured_on"].values()):
            raise ProfileError(f'{where}: "measured_on" must map names to strings')
        return cls(
            **{**given, "name": given["name"] or Path(where).stem},
            **{k: data.get(k, 0.0) for k in SERVING_TERMS},
            **{k: data.get(k, []) for k in SPREAD_TABLES},
            **{k: data[k] for k in HARDWARE if k in data},
            **{k: coefficients[k] for k in COEFFICIENTS},
        )


def shipped_json(folder: str) -> dict[str, Any]:
    """The JSON files shipped in this package's ``folder``, by name (no ``.json``)."""
    files = (importlib.resources.files(__package__) / folder).iterdir()
    return {p.name.removesuffix(".json"): p for p in files if p.name.endswith(".json")}


def available_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(shipped_json("profiles"))


def load_profile(name_or_path: str | os.PathLike[str] = DEFAULT_PROFILE) -> CostProfile:
    """A shipped profile by name, or a profile file by path.

    Raises:
        ProfileError: no such profile, unreadable JSON, or a bad profile.
    """
    text_name = os.fspath(name_or_path)
    shipped = shipped_json("profiles")
    if text_name in shipped:
        where, text = f"profile {text_name}", shipped[text_name].read_text(encoding="utf-8")
    else:
        path = Path(text_name)
        if not path.is_file():
            raise ProfileError(
                f"no profile {text_name!r}: not a file, and not one of the shipped "
                f"profiles ({', '.join(sorted(shipped))})"
            )
        where, text = str(path), path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{where}: not JSON ({e})") from None
    return CostProfile.from_dict(data, where)


def save_profile(profile: CostProfile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON (the form :func:`load_profile` reads), atomically."""
    with atomic_writer(path) as f:
        f.write((json.dumps(profile.to_dict(), indent=2) + "\n").encode())
