"""Write ``tests/data/sim_to_real/``: a tiny recorded sweep for ``--resimulate``'s tests.

No server: one rate (1 request a second), one run of six multi-turn requests, the
files ``sim_to_real.py`` writes (``results.json``, ``requests-1-1.jsonl``,
``profile.json``). The profile is fitted by ``fit_server`` to calibration samples of a
known step model (so it keeps samples to fit again); the measurements are its
predictions scaled a little, with one request sent 50 ms late and one stream read in
a burst (the client's stalls).

    python tests/serve/harness/make_sim_to_real_fixture.py --out tests/data/sim_to_real

(``sim_to_real`` is ``benchmarks/sim_to_real.py``: the virtual environment ``make`` creates
has ``benchmarks/`` and ``tests/serve/harness/`` on its path.)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import sim_to_real as s2r

from prefixkv.adapters.lab.sim import CostProfile, StepSample, attention_pairs, save_profile
from prefixkv.adapters.lab.sim.arrivals import poisson_arrivals
from prefixkv.adapters.lab.sim.server_calibration import fit_server
from prefixkv.adapters.lab.sim.serving_path import HopSample, HopSamples, SharePair

TRUTH = CostProfile("truth", "m", "d", 0.003, 1.2e-5, 1e-9, 2.5e-4, 0.0)
REQUEST_S, STREAM_S = 0.007, 0.0005


def samples() -> list[StepSample]:
    """One-token requests of three prompt lengths, half cached or not, and decode runs
    of 1 and 8 requests over 64 and 512 tokens, priced by :data:`TRUTH`."""
    out = []
    for q in (32, 256, 1024):
        for hit in (0, q // 2 // 32 * 32):
            n = q - hit
            pairs = attention_pairs(n, hit)
            seconds = REQUEST_S + STREAM_S + TRUTH.step_time(n, pairs, 0, 0)
            out.append(StepSample(n, pairs, 0, 0, seconds, 1, 1, 1))
    k = 11
    for b in (1, 8):
        for c in (64, 512):
            decode = sum(TRUTH.step_time(0, 0, b, b * (c + j)) for j in range(1, k + 1))
            pairs = b * attention_pairs(c, 0)
            seconds = REQUEST_S + TRUTH.step_time(b * c, pairs, 0, 0) + decode + STREAM_S * b
            out.append(
                StepSample(
                    b * c, pairs, k * b, b * (k * c + k * (k + 1) // 2), seconds, 1 + k, 1, b
                )
            )
    return out


def hops() -> HopSamples:
    """Serving-path requests of 8 prompt tokens: client TTFT, the server's split, CPU."""

    def hop(k: int, client: float, engine: float, cpu: float, decode: float = 0.0) -> HopSample:
        return HopSample(8, k, client, decode, client - 0.003, engine, decode, cpu, 0.001)

    short = [hop(1, 0.0108, 0.0055, 0.0026), hop(1, 0.0104, 0.0053, 0.0024)]
    long = [hop(32, 0.0112, 0.0056, 0.018, 0.1), hop(32, 0.0110, 0.0054, 0.018, 0.1)]
    loaded = long[0]._replace(engine_decode_s=0.11, frontend_cpu_s=0.05)
    return HopSamples(short, long, [SharePair(long[0], loaded)])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/data/sim_to_real")
    out = Path(ap.parse_args(argv).out)
    out.mkdir(parents=True, exist_ok=True)
    profile = fit_server(
        samples(), hops(), name="vllm-cpu-tiny-llama", model="tiny-llama",
        device="served at http://127.0.0.1:8000 (vllm 0.32.0)",
        source="synthetic: a test recording", notes="samples of a known step model",
        measured_on={"server": "http://127.0.0.1:8000", "block_size": "32"},
        covers={"prefill_tokens": [16, 1024], "context_tokens": [32, 1024],
                "batch_size": [1, 8]},
        kv_bytes_per_token=1024, kv_cache_tokens=1 << 20,
    )  # fmt: skip
    save_profile(profile, out / "profile.json")
    seed, salt = s2r.run_seed(0, 0), 12345
    requests = s2r.trace("multi_turn", 6, seed, salt, s2r.VOCAB)
    gen = poisson_arrivals(1.0, seed=seed)
    sent = [next(gen) + (0.05 if i == 2 else 0.0005 + 0.0002 * i) for i in range(len(requests))]
    predicted, _, _ = s2r.predict(requests, sent, profile, 1 << 20, 32)
    done = []
    for i, ((_, _, n), (hit, ttft, tpot)) in enumerate(zip(requests, predicted, strict=True)):
        t = round(ttft * (1.1 + 0.02 * i), 6)
        p = 3e-5 if i == 4 else round(tpot * (0.95 + 0.01 * i), 6)
        done.append(s2r.Measured(t, p, t + p * (n - 1), n, hit))
    s2r.write_requests(out / "requests-1-1.jsonl", requests, sent, done, predicted)
    doc = {
        "command": "benchmarks/sim_to_real.py --vllm vllm --workload multi_turn "
        "--max-requests 6 --request-rates 1 --repeats 1 --out rec",
        "workload": "multi_turn", "max_requests": 6, "request_rates": [1.0],
        "block_size": 32, "kv_cache_tokens": 1 << 20, "profile": profile.to_dict(),
        "runs": [{"rate": 1.0, "run": 1, "seed": seed, "salt": salt, "load_before": 0.3,
                  "load_after": 0.4}],
    }  # fmt: skip
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
