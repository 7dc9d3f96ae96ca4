"""Engine tests: prefixkv inside the real vLLM 0.33 and SGLang 0.5.23 schedulers, on CPU.

Collected only by ``make test-engines``, which runs each file with its engine's side
environment (``recorders/setup_env.sh``); the default ``pytest`` run ignores this
folder. The replay drivers are the oracles' own (``recorders/``, on pytest's path by
``pyproject.toml``), so the engines and prefixkv are driven by the same code.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIDELITY = ROOT / "tests" / "data" / "fidelity"


def synthetic_trace(seed: int, n: int = 120) -> list[dict[str, Any]]:
    """Shared system prompts, multi-turn sessions that extend earlier turns, fresh
    prompts, cuts at unaligned positions and outputs of 1..40 tokens."""
    rng = random.Random(seed)
    systems = [[rng.randrange(3, 30000) for _ in range(rng.randrange(40, 400))] for _ in range(4)]
    sessions: list[list[int]] = []
    reqs = []
    for i in range(n):
        roll = rng.random()
        if roll < 0.35 and sessions:
            s = rng.randrange(len(sessions))
            prompt = sessions[s] + [rng.randrange(3, 30000) for _ in range(rng.randrange(5, 80))]
            sessions[s] = prompt
        elif roll < 0.8:
            sys_prompt = rng.choice(systems)
            prompt = sys_prompt[: rng.randrange(len(sys_prompt) // 2, len(sys_prompt) + 1)]
            prompt = prompt + [rng.randrange(3, 30000) for _ in range(rng.randrange(1, 200))]
            if rng.random() < 0.3:
                sessions.append(prompt)
        else:
            prompt = [rng.randrange(3, 30000) for _ in range(rng.randrange(2, 300))]
        output = [rng.randrange(3, 30000) for _ in range(rng.randrange(1, 41))]
        reqs.append({"id": f"r{i}", "tokens": prompt, "output": output})
    return reqs


def fixture_trace(name: str, limit: int) -> list[dict[str, Any]]:
    """The head of a fidelity trace, through prefixkv's loaders."""
    from prefixkv.adapters.lab.traces import load_any

    files = {
        "mixed": ("mixed.jsonl.gz", {}),
        "mooncake": ("mooncake_conversation_head.jsonl", {"tokens_per_id": 16}),
    }
    fname, opts = files[name]
    reqs = load_any(FIDELITY / fname, max_requests=limit, **opts)  # type: ignore[arg-type]
    return [{"id": r.id, "tokens": list(r.tokens), "output": list(r.output)} for r in reqs]


TRACES = {
    "synthetic": lambda: synthetic_trace(7),
    "mixed": lambda: fixture_trace("mixed", 120),
    "mooncake": lambda: fixture_trace("mooncake", 100),
}


@pytest.fixture(scope="session")
def traces() -> dict[str, list[dict[str, Any]]]:
    return {name: make() for name, make in TRACES.items()}


class Report:
    """Per-configuration figures, written to ``$PREFIXKV_ENGINE_REPORT`` (JSON lines)."""

    def __init__(self) -> None:
        self.path = os.environ.get("PREFIXKV_ENGINE_REPORT")

    def add(self, **row: Any) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")


@pytest.fixture(scope="session")
def report() -> Report:
    return Report()
