"""Cost profiles: what one engine step costs on a given model and device.

A step's time is a fixed cost plus what its prefill chunks and decode rows add,
the decomposition Vidur (MLSys 2024) and roofline models of LLM inference use:

    step = step_s
         + prefill_token_s     * (prefill tokens)                 linear layers, compute bound
         + prefill_attention_s * (query x attended token pairs)   causal attention
         + decode_seq_s        * (decode rows)                    per-row linear work, sampling
         + decode_context_s    * (context tokens decode rows read) KV reads, memory bound

A prefill chunk of ``q`` tokens after ``s`` cached ones attends to
``q * s + q * (q + 1) / 2`` (query, key) pairs, so splitting a prefill into chunks
does not change its attention term, and a prefix hit of ``h`` tokens saves exactly
``prefill_s(h, 0)``. A profile is a small JSON file: model, device, coefficients and
where they come from.
"""

from __future__ import annotations

import importlib.resources
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefixkv.adapters.outputs import atomic_writer

from .errors import ProfileError

__all__ = [
    "COEFFICIENTS",
    "DEFAULT_PROFILE",
    "MAX_COEFFICIENT_S",
    "CostProfile",
    "attention_pairs",
    "available_profiles",
    "load_profile",
    "save_profile",
]

COEFFICIENTS = (
    "step_s",
    "prefill_token_s",
    "prefill_attention_s",
    "decode_seq_s",
    "decode_context_s",
)
"""The coefficient names every profile has, in seconds per unit."""

MAX_COEFFICIENT_S = 1e3
"""The largest coefficient a profile may have, in seconds per unit: a thousand seconds
a step, a token or a (query, key) pair is far beyond any hardware, and bounding it
keeps every step time of a run finite (a 1e308 coefficient would overflow to
infinity mid-run and fail only when the results are written)."""

DEFAULT_PROFILE = "llama2-70b-tp2-a100"
"""The shipped profile used when none is named (derived from Vidur's profiling data)."""


def attention_pairs(num_tokens: int, start: int) -> int:
    """(query, key) pairs of causal attention for tokens ``start .. start+num_tokens-1``.

    Token ``i`` attends to ``i + 1`` tokens (itself and all before it).
    """
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


@dataclass(frozen=True, slots=True)
class CostProfile:
    """Coefficients of the step-time model for one model on one device.

    Attributes:
        name: short identifier (``llama2-70b-tp2-a100``).
        model: what was measured (model, precision, parallelism).
        device: where it was measured.
        step_s: fixed seconds per step (scheduling, launch, the weight reads every
            forward pass pays).
        prefill_token_s: seconds per prefill token (its linear layers).
        prefill_attention_s: seconds per (query, attended key) pair in prefill.
        decode_seq_s: seconds per decode row in a step.
        decode_context_s: seconds per context token a decode row reads.
        source: where the coefficients come from (a citation, a command).
        notes: method and fit quality, free text.
        fit: optional numbers about the fit (residuals, ranges), kept as given.

    Raises:
        ProfileError: a coefficient that is not a number in ``[0, MAX_COEFFICIENT_S]``,
            or all zero.
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

    def __post_init__(self) -> None:
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= MAX_COEFFICIENT_S  # NaN compares False: refused
            ):
                raise ProfileError(
                    f"profile {self.name!r}: {name} must be a number of seconds in "
                    f"[0, {MAX_COEFFICIENT_S:g}], got {value!r:.60}"
                )
        if not any(getattr(self, name) for name in COEFFICIENTS):
            raise ProfileError(f"profile {self.name!r}: every coefficient is zero")

    def prefill_s(self, num_tokens: int, num_cached: int = 0) -> float:
        """Marginal seconds to prefill ``num_tokens`` tokens after ``num_cached`` cached ones.

        Excludes ``step_s``, which a step pays once whatever it computes. Additive
        over chunks: ``prefill_s(a, s) + prefill_s(b, s + a) == prefill_s(a + b, s)``.
        """
        pairs = attention_pairs(num_tokens, num_cached)
        return self.prefill_token_s * num_tokens + self.prefill_attention_s * pairs

    def decode_s(self, num_seqs: int, num_context_tokens: int) -> float:
        """Marginal seconds of ``num_seqs`` decode rows reading ``num_context_tokens`` in all."""
        return self.decode_seq_s * num_seqs + self.decode_context_s * num_context_tokens

    def step_time(
        self,
        prefill_tokens: int,
        prefill_pairs: int,
        num_decode: int,
        decode_context: int,
    ) -> float:
        """Seconds of one step with the given work (see the module docstring)."""
        return (
            self.step_s
            + self.prefill_token_s * prefill_tokens
            + self.prefill_attention_s * prefill_pairs
            + self.decode_seq_s * num_decode
            + self.decode_context_s * decode_context
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: metadata and a ``coefficients`` object."""
        d = asdict(self)
        return {
            "name": d["name"],
            "model": d["model"],
            "device": d["device"],
            "coefficients": {k: d[k] for k in COEFFICIENTS},
            "source": d["source"],
            "notes": d["notes"],
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
        meta: dict[str, str] = {}
        for k in ("name", "model", "device", "source", "notes"):
            value = data.get(k, "")
            if not isinstance(value, str):
                raise ProfileError(f'{where}: "{k}" must be a string, got {value!r:.80}')
            meta[k] = value
        fit = data.get("fit", {})
        if not isinstance(fit, Mapping):
            raise ProfileError(f'{where}: "fit" must be an object, got {fit!r:.80}')
        return cls(
            name=meta["name"] or Path(where).stem,
            model=meta["model"],
            device=meta["device"],
            source=meta["source"],
            notes=meta["notes"],
            fit=dict(fit),
            **{k: coefficients[k] for k in COEFFICIENTS},
        )


def _builtin_dir() -> Any:
    return importlib.resources.files(__package__) / "profiles"


def available_profiles() -> list[str]:
    """Names of the shipped profiles."""
    return sorted(
        p.name.removesuffix(".json") for p in _builtin_dir().iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str | os.PathLike[str] = DEFAULT_PROFILE) -> CostProfile:
    """A shipped profile by name, or a profile file by path.

    Raises:
        ProfileError: no such profile, unreadable JSON, or a bad profile.
    """
    text_name = os.fspath(name_or_path)
    if text_name in available_profiles():
        resource = _builtin_dir() / f"{text_name}.json"
        where, text = f"profile {text_name}", resource.read_text(encoding="utf-8")
    else:
        path = Path(text_name)
        if not path.is_file():
            raise ProfileError(
                f"no profile {text_name!r}: not a file, and not one of the shipped "
                f"profiles ({', '.join(available_profiles())})"
            )
        where, text = str(path), path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ProfileError(f"{where}: not JSON ({e})") from None
    return CostProfile.from_dict(data, where)


def save_profile(profile: CostProfile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON (the form :func:`load_profile` reads), atomically.

    Missing folders are created; an interrupted write leaves the old file.
    """
    with atomic_writer(path) as f:
        f.write((json.dumps(profile.to_dict(), indent=2) + "\n").encode())
