"""Time you can trust: one axis at a time, closed-loop sessions, profiles that say
what they were measured on and what their hardware holds, capacity anchors, and
calibration from a served engine or ``vllm bench serve`` results (tiny sizes)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import warnings
from array import array
from pathlib import Path
from typing import Any

import pytest
from helpers import TEST_DATA, results_doc, run_cli

from prefixkv.adapters.lab.compare.anchors import knee
from prefixkv.adapters.lab.sim import (
    CostProfile,
    ProfileError,
    ProfileRangeWarning,
    SimRequest,
    load_profile,
    save_profile,
    simulate,
)
from prefixkv.adapters.lab.sim.bench_results import (
    CalibrationInputError,
    bench_samples,
    calibrate_from_vllm_bench,
    read_vllm_bench,
)
from prefixkv.adapters.lab.sim.calibration import fit_profile
from prefixkv.adapters.lab.traces import open_trace
from prefixkv.indexes import make_index

KVCT = TEST_DATA / "traces" / "kv_cache_tester"
BENCH = TEST_DATA / "vllm_bench" / "tiny-llama-cpu.json"
SMALL = ("--timing-repeats", "0", "-q", "--no-plots")


_run = run_cli
_doc = results_doc


def _arrival(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["runs"] if r["schedule"] == "arrival" and r["role"] == "table"]


# ----------------------------------------------------------------- one axis at a time


def test_equal_hits_under_the_default_scheduler_give_equal_ttft(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # hash_chain and radix:16 hit the same tokens; by default both run under vLLM's
    # scheduler, so nothing else differs and their times are equal to the bit.
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "40",
        "--index",
        "hash_chain,radix:16",
        "--request-rate",
        "3",
        *SMALL,
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    runs = {r["backend"]: r for r in _arrival(_doc(tmp_path))}
    assert runs["hash_chain"]["hit_tokens"] == runs["radix:16"]["hit_tokens"] > 0
    for key in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_p50_s", "queueing_mean_s"):
        assert runs["hash_chain"][key] == runs["radix:16"][key], key
    assert {r["engine"] for r in runs.values()} == {"vllm"}
    assert {r["varied"] for r in runs.values()} == {"index"}


def test_the_scheduler_is_its_own_axis_and_the_headline_says_which_moved(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "30",
        "--index",
        "hash_chain,radix",
        "--request-rate",
        "3",
        "--scheduler",
        "vllm,sglang",
        *SMALL,
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    runs = _arrival(_doc(tmp_path))
    assert [(r["backend"], r["scheduler"], r["engine"]) for r in runs] == [
        ("hash_chain", "vllm", "vllm"),
        ("radix", "vllm", "vllm"),
        ("hash_chain", "sglang", "sglang"),
        ("radix", "sglang", "sglang"),
    ]
    assert {r["varied"] for r in runs} == {"index and scheduler"}
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Index axis, scheduler held at vLLM-style (mixed batching, fcfs queue)" in md
    assert "Index axis, scheduler held at SGLang-style (prefill_first batching, fcfs queue)" in md
    assert "Scheduler axis, index held at hash_chain: TTFT p50 vLLM-style" in md
    assert "Scheduler axis, index held at radix" in md
    assert stdout.count("sglang, fcfs") == 2


def test_natural_engines_are_labelled_as_moving_both_axes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "20",
        "--index",
        "hash_chain,radix",
        "--request-rate",
        "3",
        "--scheduler",
        "natural",
        *SMALL,
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    runs = _arrival(_doc(tmp_path))
    assert [(r["backend"], r["engine"]) for r in runs] == [
        ("hash_chain", "vllm"),
        ("radix", "sglang"),
    ]
    md = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "Index and scheduler moved together" in md and "not the index's alone" in md


@pytest.mark.parametrize(
    ("flags", "fault"),
    [
        (("--scheduler", "vllm,vllm"), "distinct names"),
        (("--scheduler", "trt"), "distinct names"),
    ],
)
def test_bad_scheduler_flags_are_one_line(
    flags: tuple[str, ...], fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "seed",
        "--request-rate",
        "2",
        *flags,
        *SMALL,
        "--out",
        str(tmp_path),
    )
    assert code == 2 and fault in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ closed-loop sessions


def test_kv_cache_tester_think_time_is_read() -> None:
    think = {r.id: r.think_s for r in open_trace(str(KVCT), None)}
    # conv_a/1 says think_time 0; conv_a/2 comes 6 s after it, whose api_time is 1 s.
    assert think["conv_a/1"] == 0.0 and think["conv_a/2"] == 5.0
    assert think["conv_a/3"] is None and think["conv_b/1"] is None


def test_sessions_replay_closed_loop_by_default_and_open_loop_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # At 50 requests a second every turn arrives long before its predecessor can
    # finish: closed loop holds it back, open loop sends it anyway.
    def rows(out: Path) -> dict[str, dict[str, str]]:
        import csv

        with (out / "requests.csv").open(encoding="utf-8", newline="") as f:
            return {
                r["request_id"]: r
                for r in csv.DictReader(f)
                if r["schedule"] == "arrival" and r["backend"] == "hash_chain"
            }

    parents = {r.id: r.parent for r in open_trace(str(KVCT), None)}
    think = {r.id: r.think_s or 0.0 for r in open_trace(str(KVCT), None)}
    for flag, closed in (((), True), (("--open-loop",), False)):
        out = tmp_path / str(closed)
        code, _, err = _run(
            capsys,
            "compare",
            "--trace",
            str(KVCT),
            "--index",
            "hash_chain",
            "--request-rate",
            "50",
            *flag,
            *SMALL,
            "--out",
            str(out),
        )
        assert code == 0, err
        assert {r["closed_loop"] for r in _arrival(_doc(out))} == {closed}
        got = rows(out)
        waited = [
            float(got[rid]["arrival_s"]) >= float(got[p]["finish_s"]) + think[rid]
            for rid, p in parents.items()
            if p is not None
        ]
        assert all(waited) if closed else not all(waited)


# ------------------------------------------------------------ profiles and their range


def test_a_profile_says_what_it_was_measured_on_and_round_trips(tmp_path: Path) -> None:
    p = load_profile()
    assert p.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert p.kv_capacity_tokens() == 50_859  # 0.9 x 160 GiB less the fp16 weights
    assert p.kv_capacity_tokens(1.0) > p.kv_capacity_tokens(0.5) == 0
    assert p.covers["context_tokens"] == (1, 4096) and p.measured_on["machine"]
    assert p.extrapolation({"context_tokens": 135_000}) == [
        "context tokens up to 135,000, measured up to 4,096 (33.0x)"
    ]
    assert p.extrapolation({"context_tokens": 4096, "batch_size": 10**6}) == []
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p


@pytest.mark.parametrize(
    "change",
    [
        {"covers": {"context_tokens": (10, 5)}},
        {"covers": {"decode_tokens": (1, 5)}},
        {"kv_bytes_per_token": -1},
        {"request_s": float("nan")},
    ],
)
def test_bad_profile_metadata_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ProfileError):
        dataclasses.replace(load_profile(), **change)


def test_a_run_past_the_measured_range_warns_once_and_says_so() -> None:
    p = dataclasses.replace(load_profile(), covers={"prefill_tokens": (1, 8), "batch_size": (1, 2)})
    reqs = [
        SimRequest(f"r{i}", array("I", range(1 + 40 * i, 41 + 40 * i)), 3, 0.0) for i in range(4)
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = simulate(reqs, lambda: make_index("hash_chain", 4), 4096, profile=p)
    ranged = [w for w in caught if issubclass(w.category, ProfileRangeWarning)]
    assert len(ranged) == 1
    assert "prefill tokens up to 160, measured up to 8" in str(ranged[0].message)
    assert "batch size up to 4, measured up to 2" in res.labels["profile_range"]


def test_compare_warns_once_for_a_profile_taken_past_its_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = dataclasses.replace(load_profile(), name="narrow", covers={"prefill_tokens": (1, 64)})
    save_profile(p, tmp_path / "narrow.json")
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "20",
        "--request-rate",
        "2",
        "--profile",
        str(tmp_path / "narrow.json"),
        *SMALL,
        "--out",
        str(tmp_path / "o"),
    )
    assert code == 0
    lines = [ln for ln in err.splitlines() if "extrapolated" in ln]
    assert len(lines) == 1 and "in 3 arrival-time run(s)" in lines[0]
    assert lines[0].startswith("prefixkv: warning: profile 'narrow'")
    doc = _doc(tmp_path / "o")
    assert doc["warnings"] and all(r["profile_range"] for r in _arrival(doc))


# --------------------------------------------------------------------- physical capacity


def test_capacity_auto_and_gib_come_from_the_profiles_hardware(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "20",
        "--capacity-tokens",
        "auto",
        *SMALL,
        "--out",
        str(tmp_path / "a"),
    )
    assert code == 0, err
    assert _doc(tmp_path / "a")["workloads"][0]["capacity_tokens"] == 50_859
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "20",
        "--capacity-tokens",
        "auto",
        "--gpu-memory-utilization",
        "0.95",
        *SMALL,
        "--out",
        str(tmp_path / "b"),
    )
    assert code == 0 and _doc(tmp_path / "b")["workloads"][0]["capacity_tokens"] == 77_073
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "20",
        "--capacity-gib",
        "2",
        *SMALL,
        "--out",
        str(tmp_path / "c"),
    )
    assert (
        code == 0
        and _doc(tmp_path / "c")["workloads"][0]["capacity_tokens"] == 2 * 2**30 // 327_680
    )
    assert "warning" not in err


def test_a_capacity_beyond_the_hardware_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(
        capsys,
        "compare",
        "-w",
        "few_shot",
        "--max-requests",
        "20",
        "--capacity-tokens",
        "1m",
        "--profile",
        "llama2-70b-tp2-a100",
        *SMALL,
        "--out",
        str(tmp_path),
    )
    assert code == 0
    (line,) = [ln for ln in err.splitlines() if "hardware holds" in ln]
    assert "capacity 1,000,000 tokens: up to 19.7x" in line and "50,859 tokens" in line
    assert line in "\n".join(f"prefixkv: warning: {w}" for w in _doc(tmp_path)["warnings"])


def test_capacity_auto_without_the_hardware_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = dataclasses.replace(load_profile(), kv_bytes_per_token=None)
    save_profile(bare, tmp_path / "bare.json")
    out = ("--out", str(tmp_path / "o"), "-q", "--no-plots")
    cases = [
        (
            [
                "compare",
                "-w",
                "seed",
                "--capacity-tokens",
                "auto",
                "--profile",
                str(tmp_path / "bare.json"),
                *out,
            ],
            "does not say its KV bytes per token",
        ),
        (
            [
                "compare",
                "-w",
                "seed",
                "--capacity-gib",
                "1",
                "--profile",
                str(tmp_path / "bare.json"),
                *out,
            ],
            "--capacity-gib needs profile 'llama2-70b",
        ),
        (
            [
                "replay",
                str(KVCT),
                "--index",
                "radix",
                "--capacity-tokens",
                "auto",
                "-q",
                "--out",
                str(tmp_path / "h.jsonl"),
            ],
            "auto needs a cost profile",
        ),
    ]
    for argv, fault in cases:
        code, _, err = _run(capsys, *argv)
        assert code == 2 and err.startswith("prefixkv: error:") and fault in err, err
        assert len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------ capacity anchors


def test_knee_is_the_point_farthest_above_the_chord_on_log_capacity() -> None:
    points = [(1000, 0.0), (2000, 0.5), (4000, 0.55), (8000, 0.6)]
    assert knee(points) == (2000, 0.5)
    assert knee(list(reversed(points))) == (2000, 0.5)
    assert knee([(1000, 0.2), (4000, 0.2), (8000, 0.2)]) is None  # flat
    assert knee([(1000, 0.1), (8000, 0.5)]) is None  # too few points
    assert knee([(1000, 0.0), (2000, 0.1), (4000, 1.0)]) is None  # convex: below the chord


def test_compare_reports_the_infinite_cache_hit_ratio_and_the_knee(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, err = _run(
        capsys,
        "compare",
        "-w",
        "multi_turn",
        "--max-requests",
        "60",
        "--index",
        "hash_chain,radix",
        "--capacity-tokens",
        "3000",
        "--capacity-sweep",
        "--no-capacity-search",
        *SMALL,
        "--out",
        str(tmp_path),
    )
    assert code == 0, err
    doc = _doc(tmp_path)
    anchors = {a["backend"]: a for a in doc["anchors"]}
    sweep = [r for r in doc["runs"] if r["role"] == "sweep"]
    for backend, a in anchors.items():
        points = {r["capacity_tokens"]: r["hit_ratio"] for r in sweep if r["backend"] == backend}
        roomy = max(points)
        assert a["infinite_capacity_tokens"] == roomy and a["infinite_hit_ratio"] == points[roomy]
        assert a["knee_tokens"] in points and a["knee_hit_ratio"] == points[a["knee_tokens"]]
        assert a["knee_blocks"] == a["knee_tokens"] // a["block_size"]
        assert a["knee_gib"] == pytest.approx(a["knee_tokens"] * 327_680 / 2**30)
    assert "infinite-cache hit" in stdout and " GiB" in stdout
    assert "Capacity anchors (GiB of KV for meta-llama/Llama-2-70b-hf" in (
        tmp_path / "report.md"
    ).read_text(encoding="utf-8")


# --------------------------------------------------------------------------- calibration


def test_calibrate_list_shows_the_shipped_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "calibrate", "--list")
    assert code == 0 and out.startswith("llama2-70b-tp2-a100: meta-llama/Llama-2-70b-hf")
    assert "KV capacity: 50,859 tokens" in out and "context tokens 1-4,096" in out


def test_the_vllm_bench_fixture_reads_and_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    requests, meta = read_vllm_bench(BENCH)
    assert len(requests) == 28 and meta["backend"] == "vllm" and meta["max_concurrency"] == 1
    alone, decode = bench_samples(requests, max_num_batched_tokens=2048)
    assert len(alone) >= 6 and all(s.num_requests == 1 for s in alone)
    assert {s.num_decode for s in decode} >= {1, 4}
    code, _, err = _run(
        capsys,
        "calibrate",
        "--from-vllm-bench",
        str(BENCH),
        "--max-num-batched-tokens",
        "2048",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert code == 0, err
    p = load_profile(tmp_path / "p.json")
    assert p.request_s > 0 and p.covers["batch_size"] == (1, 4)
    assert p.measured_on["model"] == meta["model_id"] and "vllm-bench" in p.name


def _bench_doc(truth: CostProfile) -> dict[str, Any]:
    """A results document whose times follow ``truth`` exactly: requests one at a
    time, then four at once decoding together."""
    lens, outs, starts, ttfts, itls = [], [], [], [], []
    t = 0.0
    for p in (64, 256, 512, 1024, 1536):
        ttft = truth.request_s + truth.step_s + truth.prefill_s(p)
        gaps = [truth.step_time(0, 0, 1, p + k) for k in range(1, 6)]
        lens.append(p), outs.append(6), starts.append(t), ttfts.append(ttft), itls.append(gaps)
        t += ttft + sum(gaps) + 1.0
    batch = (100, 200, 300, 400)
    first = truth.request_s + truth.step_time(
        sum(batch), sum(q * (q + 1) // 2 for q in batch), 0, 0
    )
    gaps = [truth.step_time(0, 0, 4, sum(batch) + 4 * k) for k in range(1, 10)]
    for p in batch:
        lens.append(p), outs.append(10), starts.append(t), ttfts.append(first), itls.append(gaps)
    return {
        "date": "20260101-000000",
        "backend": "vllm",
        "model_id": "m",
        "input_lens": lens,
        "output_lens": outs,
        "start_times": starts,
        "ttfts": ttfts,
        "itls": itls,
        "errors": [""] * len(lens),
    }


def test_a_results_file_that_follows_a_profile_gives_that_profile_back(tmp_path: Path) -> None:
    truth = CostProfile("t", "m", "d", 0.002, 1e-5, 2e-8, 3e-4, 1e-7, request_s=0.006)
    path = tmp_path / "r.json"
    path.write_text(
        json.dumps(_bench_doc(truth))
        + "\n"
        + json.dumps(
            {
                **_bench_doc(truth),
                "start_times": [s + 1000 for s in _bench_doc(truth)["start_times"]],
            }
        )
    )
    requests, _ = read_vllm_bench(path)
    assert len(requests) == 18  # two runs appended, one a line
    fitted = calibrate_from_vllm_bench([path], max_num_batched_tokens=8192)
    for name in ("step_s", "prefill_token_s", "decode_seq_s", "decode_context_s", "request_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-3), name
    assert fitted.fit["relative_error_max"] < 1e-6


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ('{"duration": 1.0, "completed": 3}', "--save-detailed"),
        ("{not json", "not JSON"),
        (
            '{"input_lens": [1], "output_lens": [1, 2], "start_times": [0], "ttfts": [1], '
            '"itls": [[]]}',
            "different lengths",
        ),
        (
            '{"input_lens": [0], "output_lens": [1], "start_times": [0], "ttfts": [1], '
            '"itls": [[]]}',
            "prompt >= 1",
        ),
    ],
)
def test_a_bad_results_file_is_a_named_error(tmp_path: Path, text: str, fault: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(CalibrationInputError, match=fault):
        read_vllm_bench(path)


def test_a_results_file_without_requests_alone_says_how_to_rerun(tmp_path: Path) -> None:
    doc = _bench_doc(CostProfile("t", "m", "d", 0.002, 1e-5, 2e-8, 3e-4, 1e-7))
    doc["start_times"] = [0.0] * len(doc["start_times"])  # everything at once
    (tmp_path / "r.json").write_text(json.dumps(doc))
    with pytest.raises(CalibrationInputError, match="--max-concurrency 1"):
        calibrate_from_vllm_bench([tmp_path / "r.json"])


# --------------------------------------------------- calibration from a served engine


class FakeServer:
    """An OpenAI-compatible completions server over httpx.MockTransport: a prefix
    cache of 32-token blocks, streamed tokens, vLLM's /version and /metrics."""

    def __init__(
        self, *, report_cached: bool = True, fail: bool = False, max_model_len: int = 4096
    ) -> None:
        self.max_model_len = max_model_len
        self.blocks: set[tuple[int, ...]] = set()
        self.report_cached = report_cached
        self.fail = fail
        self.prompts: list[list[int]] = []

    def hit(self, prompt: list[int]) -> int:
        n = 0
        while (n + 1) * 32 <= len(prompt) - 1 and tuple(prompt[: (n + 1) * 32]) in self.blocks:
            n += 1
        for k in range(1, len(prompt) // 32 + 1):
            self.blocks.add(tuple(prompt[: k * 32]))
        return n * 32

    async def __call__(self, request: Any) -> Any:
        import httpx

        path = request.url.path
        if path == "/v1/models":
            models = [{"id": "tiny", "max_model_len": self.max_model_len}]
            return httpx.Response(200, json={"data": models})
        if path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if path == "/metrics":
            text = (
                'vllm:cache_config_info{block_size="32",gpu_memory_utilization="0.92",'
                'kv_cache_memory_bytes="1073741824",num_gpu_blocks="32768"} 1.0\n'
            )
            return httpx.Response(200, text=text)
        if self.fail:
            return httpx.Response(500, text="boom")
        body = json.loads(request.content)
        prompt, n = body["prompt"], body["max_tokens"]
        assert body["ignore_eos"] and body["stream"] and body["temperature"] == 0
        self.prompts.append(prompt)
        cached = self.hit(prompt)
        usage: dict[str, Any] = {"prompt_tokens": len(prompt), "completion_tokens": n}
        if self.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}

        async def stream() -> Any:
            for _ in range(n):
                await asyncio.sleep(0)
                yield b'data: {"choices": [{"text": ""}]}\n\n'
            yield ("data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n").encode()
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, content=stream())


def test_calibrate_server_sweeps_over_http_and_records_what_it_measured() -> None:
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine
    from prefixkv.adapters.lab.sim.server_calibration import QUICK_SWEEP, calibrate_server

    fake = FakeServer()
    engine = ServedEngine("http://fake", transport=httpx.MockTransport(fake))
    sweep = dataclasses.replace(QUICK_SWEEP, seed=7, max_num_batched_tokens=2048)
    p = calibrate_server("http://fake", sweep=sweep, engine=engine)
    assert p.measured_on["server"] == "http://fake" and p.measured_on["engine_version"] == "0.32.0"
    assert p.measured_on["block_size"] == "32" and p.measured_on["date"]
    assert p.kv_bytes_per_token == 1024 and p.kv_capacity_tokens() == 32768 * 32
    assert p.covers == {
        "prefill_tokens": (32, 1024),
        "context_tokens": (32, 1024),
        "batch_size": (1, 8),
    }
    # prefill, decode and under 0 streams fitted; the TTFT under 8 streams kept, not fitted
    assert p.fit["num_samples"] == 3 * 2 + 2 * 2 + 1 and len(p.fit["samples"]) == 12
    # Prompts are token ids; a warm-up put each planned prefix in the cache first.
    assert all(isinstance(t, int) for prompt in fake.prompts for t in prompt)
    # 3 lengths x 2 fractions x 2 repeats, warm-ups where the prefix holds a block
    # (256 and 1024 at 0.5), and the decode batches.
    # Then a short request timed twice under 0 and under 8 background streams, and
    # the serving path: a short, a long and a loaded request, twice, then a short one
    # after each of the 4 idle pauses, twice, then 2 x 2 busy ones, each while a
    # background request of its own decodes, then a long one after each of the 2
    # decoding pauses, in turn, twice.
    busy = 2 * (2 * 2)
    decoding = 2 * 2
    assert (
        len(fake.prompts)
        == 3 * 2 * 2 + 2 * 2 + (1 + 8) * 2 * 2 + (0 + 2) + (8 + 2) + 7 * 2 + busy + decoding
    )
    assert p.fit["serving_path"]["engine_side"] == "step model"  # no vLLM histograms here


def test_a_server_too_short_for_any_request_of_the_sweep_is_refused_before_the_first() -> None:
    # The background streams of the TTFT under streams (64 prompt + 1,024 decoded tokens)
    # are the quick sweep's longest requests: a server serving fewer is told so at once,
    # not after minutes of sweep by a failed stream.
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine, ServerError
    from prefixkv.adapters.lab.sim.server_calibration import QUICK_SWEEP, calibrate_server

    fake = FakeServer(max_model_len=1087)
    engine = ServedEngine("http://fake", transport=httpx.MockTransport(fake))
    with pytest.raises(ServerError, match="serves at most 1,087 tokens; the sweep needs 1,088"):
        calibrate_server("http://fake", sweep=QUICK_SWEEP, engine=engine)
    assert not fake.prompts
    quiet = dataclasses.replace(QUICK_SWEEP, background_streams=(0,), serving_repeats=0)
    calibrate_server("http://fake", sweep=quiet, engine=engine)  # no stream: it fits
    assert fake.prompts


def test_a_decode_run_is_timed_to_its_last_token_as_prefill_and_decode_steps() -> None:
    from prefixkv.adapters.lab.sim.server_calibration import ServerSweep, batch_sample

    p = CostProfile("p", "m", "d", 1e-3, 2e-5, 3e-8, 4e-4, 5e-7, request_s=6e-3)
    for b, ctx, budget in ((4, 64, 2048), (32, 1024, 2048), (1, 512, 256)):
        sweep = ServerSweep(max_num_batched_tokens=budget)
        s = batch_sample(b, ctx, 24, 0.5, sweep)
        # By hand: the batch's prefill in ceil(b x ctx / budget) steps, then 23 decode
        # steps of b rows, the j-th reading ctx + j tokens a row.
        chunks = -(-b * ctx // budget)
        expected = p.request_s + chunks * p.step_s + p.prefill_s(ctx, 0) * b
        expected += sum(p.step_time(0, 0, b, b * (ctx + j)) for j in range(1, 24))
        got = (
            p.request_s * s.num_requests
            + p.step_s * s.num_steps
            + p.prefill_token_s * s.prefill_tokens
            + p.prefill_attention_s * s.prefill_pairs
            + p.decode_seq_s * s.num_decode
            + p.decode_context_s * s.decode_context
        )
        assert got == pytest.approx(expected, rel=1e-12)
        assert s.seconds == 0.5 and s.num_streamed == b


@pytest.mark.parametrize(
    ("server", "fault"),
    [
        (FakeServer(report_cached=False), "--enable-prompt-tokens-details"),
        (FakeServer(fail=True), "HTTP 500"),
    ],
)
def test_calibrate_server_failures_are_named(server: FakeServer, fault: str) -> None:
    pytest.importorskip("httpx")
    import httpx

    from prefixkv.adapters.lab.sim.served import ServedEngine, ServerError
    from prefixkv.adapters.lab.sim.server_calibration import QUICK_SWEEP, calibrate_server

    engine = ServedEngine("http://fake", transport=httpx.MockTransport(server))
    with pytest.raises(ServerError, match=fault):
        calibrate_server("http://fake", sweep=QUICK_SWEEP, engine=engine)


def test_a_served_ttft_sample_fits_request_s_apart_from_the_step() -> None:
    truth = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7, request_s=0.006)
    from prefixkv.adapters.lab.sim import StepSample

    samples = [
        StepSample(q, 0, 0, 0, truth.request_s + truth.step_s + truth.prefill_token_s * q, 1, 1)
        for q in (16, 256, 1024, 2048)
    ] + [
        StepSample(0, 0, b, b * c, truth.step_time(0, 0, b, b * c))
        for b in (1, 8)
        for c in (64, 900)
    ]
    fitted = fit_profile(samples, name="f", model="m", device="d", source="s")
    assert fitted.request_s == pytest.approx(0.006, rel=1e-6)
    assert fitted.step_s == pytest.approx(0.002, rel=1e-6)


def test_a_front_end_streaming_cost_delays_what_clients_see() -> None:
    base = CostProfile("t", "m", "d", 0.002, 1e-5, 0.0, 3e-4, 1e-7, request_s=0.005)
    slow = dataclasses.replace(base, stream_token_s=0.0005)
    reqs = [
        SimRequest(f"r{i}", array("I", range(1 + 50 * i, 51 + 50 * i)), 4, 0.0) for i in range(3)
    ]
    a = simulate(reqs, lambda: make_index("hash_chain", 16), 4096, profile=base)
    b = simulate(reqs, lambda: make_index("hash_chain", 16), 4096, profile=slow)
    # The three prefill in one step and sample three tokens: each first token reaches
    # its client 1.5 ms later; the front end keeps up (1.5 ms of streaming a step of
    # about 3 ms), so every later token too; the engine's steps are the same.
    for x, y in zip(a.requests, b.requests, strict=True):
        assert y.first_token_s == pytest.approx(x.first_token_s + 0.0015)
        assert y.finish_s == pytest.approx(x.finish_s + 0.0015)
    assert a.run.busy_s == b.run.busy_s
    assert a.requests[0].ttft_s == pytest.approx(0.005 + base.step_time(150, 3 * 1275, 0, 0))


# ------------------------------------------------------------------- the cluster's sessions


def test_a_cluster_replays_sessions_closed_loop_and_flags_a_policy_above_pooled() -> None:
    from prefixkv.adapters.lab.cluster.run import ClusterSettings, run_cluster
    from prefixkv.adapters.lab.outputs.cluster import POOLED_MEANING, report_notes
    from prefixkv.adapters.lab.sim.arrivals import sim_requests
    from prefixkv.adapters.lab.workloads import make_workload

    w = make_workload("multi_turn", num_sessions=12, turns=(2, 5), system_len=64, seed=3)
    cfg = ClusterSettings(num_replicas=2, capacity_tokens=4096, block_size=16)
    links = {r.id: r for r in sim_requests(w, request_rate=40.0)}
    assert any(r.after for r in links.values())
    closed = run_cluster(sim_requests(w, request_rate=40.0), "round_robin", cfg)
    opened = run_cluster(sim_requests(w, request_rate=40.0, closed_loop=False), "round_robin", cfg)
    for res, is_closed in ((closed, True), (opened, False)):
        done = {r.request_id: r for r in res.requests}
        assert len(done) == len(links)
        late = []
        for rid, req in links.items():
            if req.after is None:
                continue
            sent, before = done[rid].arrival_s, done[req.after].finish_s
            late.append(sent >= before + req.think_s)
            if is_closed:
                assert (
                    sent <= max(req.arrival or 0.0, before + req.think_s) + cfg.closed_loop_tick_s
                )
        assert all(late) if is_closed else not all(late)
    # A policy above the pooled figure is named, and what pooled is, said.
    fake = dataclasses.replace(closed, labels={**closed.labels, "policy": "pooled"})
    worse = dataclasses.replace(
        fake, run=dataclasses.replace(closed.run, hit_ratio=closed.run.hit_ratio - 0.1)
    )
    notes = [n for n in report_notes([closed], [closed, worse]) if "pooled" in n]
    assert len(notes) == 1 and notes[0].startswith("**Above the pooled figure.** round_robin")
    assert "admit them later" in notes[0]
    assert "bounds a policy's hits only when admissions happen" in POOLED_MEANING
    assert not [n for n in report_notes([closed], [closed, fake]) if "pooled" in n]
