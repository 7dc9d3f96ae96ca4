"""Capacity for your model and your GPU: KV bytes per token and the pool from a Hugging
Face config (hand-computed answers), requests refused for their length as vLLM refuses
them, and the working set and knee found by bisection over replays."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import results_doc, run_cli
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixkv.adapters.lab.admission import AdmissionRule, admit
from prefixkv.adapters.lab.backends import CapacityError, CompareError
from prefixkv.adapters.lab.compare import CompareOptions, compare_backends
from prefixkv.adapters.lab.compare.anchors import (
    KNEE_SHARE,
    PRECISION,
    CapacitySearch,
    smallest_reaching,
)
from prefixkv.adapters.lab.sim.metrics import RunMetrics
from prefixkv.adapters.lab.sim.model_config import (
    ModelConfigError,
    available_model_configs,
    load_model_config,
)
from prefixkv.adapters.lab.sim.profile import load_profile
from prefixkv.adapters.lab.sim.runs import KLiveHits
from prefixkv.adapters.lab.workloads import load_workloads

SMALL = ("--timing-repeats", "0", "-q", "--no-plots", "--index", "hash_chain")
GiB = 2**30


_run = run_cli
_doc = results_doc


def _config(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields), encoding="utf-8")
    return path


# ------------------------------------------------------------------ the model's KV size


def test_llama_3_8b_kv_bytes_weights_and_pool_match_the_hand_computed_values() -> None:
    m = load_model_config("llama-3-8b")
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert m.num_parameters == 8_030_261_248  # the model card's 8.03B
    assert m.weight_bytes == 2 * 8_030_261_248
    assert m.max_position_embeddings == 8192
    # the pool as --model-config llama-3-8b --gpu-memory G sizes it (vLLM's rule)
    on = {
        gib: dataclasses.replace(
            load_profile(),
            kv_cache_tokens=None,
            kv_bytes_per_token=m.kv_bytes_per_token,
            weight_bytes=m.weight_bytes,
            device_memory_bytes=gib * GiB,
        )
        for gib in (80, 16)
    }
    assert on[80].kv_capacity_tokens(0.9) == int((0.9 * 80 * GiB - m.weight_bytes) // 131_072)
    assert on[80].kv_capacity_tokens(0.9) == 467_291
    assert on[16].kv_capacity_tokens(0.9) == 0  # the weights alone do not fit


def test_every_shipped_config_reads_and_names_its_source() -> None:
    names = available_model_configs()
    assert {"llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mistral-7b", "llama-2-70b"} <= set(names)
    for name in names:
        m = load_model_config(name)
        assert m.kv_bytes_per_token > 0 and m.num_parameters > 10**9
    # the shipped Llama-2-70B matches the cost profile's hardware figures
    l2 = load_model_config("llama-2-70b")
    assert l2.kv_bytes_per_token == 327_680 and l2.weight_bytes == 137_953_296_384


def test_absent_fields_default_as_transformers_does(tmp_path: Path) -> None:
    path = _config(
        tmp_path, num_hidden_layers=4, num_attention_heads=8, hidden_size=512, torch_dtype="float16"
    )
    m = load_model_config(str(path))
    assert (m.num_kv_heads, m.head_dim) == (8, 64)  # no GQA; hidden / heads
    assert m.kv_bytes_per_token == 2 * 4 * 8 * 64 * 2
    assert load_model_config(str(tmp_path)).kv_bytes_per_token == m.kv_bytes_per_token  # folder
    assert load_model_config(str(path), "fp8").kv_bytes_per_token == 2 * 4 * 8 * 64


def test_float32_is_served_in_16_bits_and_a_text_config_is_the_language_model(
    tmp_path: Path,
) -> None:
    path = _config(
        tmp_path,
        torch_dtype="float32",
        text_config={"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 32, "hidden_size": 128},
    )  # fmt: skip
    assert load_model_config(str(path)).kv_bytes_per_token == 2 * 2 * 2 * 32 * 2


def test_mla_counts_one_latent_and_its_rope_key_per_layer(tmp_path: Path) -> None:
    # DeepSeek-V2-Lite's attention: kv_lora_rank 512, qk_rope_head_dim 64, 27 layers
    path = _config(
        tmp_path, num_hidden_layers=27, num_attention_heads=16, hidden_size=2048,
        kv_lora_rank=512, qk_rope_head_dim=64, torch_dtype="bfloat16",
        num_parameters=15_700_000_000,
    )  # fmt: skip
    m = load_model_config(str(path))
    assert m.mla == (512, 64) and m.kv_bytes_per_token == 27 * (512 + 64) * 2
    assert m.num_parameters == 15_700_000_000 and "MLA" in m.describe()


def test_a_sliding_window_is_noted_not_applied(tmp_path: Path) -> None:
    path = _config(
        tmp_path, num_hidden_layers=2, num_attention_heads=4, hidden_size=256, sliding_window=4096
    )
    m = load_model_config(str(path))
    assert m.sliding_window == 4096 and "sliding window 4,096 not applied" in m.describe()
    assert load_model_config("qwen2.5-7b").sliding_window is None  # use_sliding_window false


def test_a_model_in_the_local_hugging_face_cache_is_found_and_nothing_is_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(
        json.dumps({"num_hidden_layers": 3, "num_attention_heads": 2, "hidden_size": 64})
    )
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    assert load_model_config("acme/tiny").kv_bytes_per_token == 2 * 3 * 2 * 32 * 2
    with pytest.raises(ModelConfigError, match="nothing is downloaded"):
        load_model_config("acme/absent")


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("{", "not JSON"),
        ("[1]", "is an object"),
        ('{"num_attention_heads": 4, "hidden_size": 64}', "'num_hidden_layers' is missing"),
        ('{"num_hidden_layers": 0, "num_attention_heads": 4}', "positive int"),
        ('{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, '
         '"torch_dtype": "int3"}', "dtype 'int3' unknown"),
    ],
)  # fmt: skip
def test_a_bad_config_is_a_named_error(tmp_path: Path, text: str, fault: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ModelConfigError, match=fault):
        load_model_config(str(path))


def test_compare_sizes_the_pool_for_the_model_and_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "20", "--model-config",
        "llama-3-8b", "--gpu-memory", "80", "--capacity-tokens", "auto", *SMALL,
        "--out", str(tmp_path / "a"),
    )  # fmt: skip
    assert code == 0, err
    assert _doc(tmp_path / "a")["workloads"][0]["capacity_tokens"] == 467_291
    assert "capacity: hash_chain: 467,291 tokens give " in out  # against the working set
    assert out.startswith("capacity: meta-llama/Meta-Llama-3-8B: 32 layers x 8 KV heads")
    assert "pool 467,291 tokens" in out and "upper bound" in out
    report = (tmp_path / "a" / "report.md").read_text(encoding="utf-8")
    assert "- model and GPU: meta-llama/Meta-Llama-3-8B" in report
    code, out, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "20", "--model-config",
        "llama-3-8b", "--gpu-memory", "80", "--tensor-parallel-size", "2", "--non-kv-memory",
        "5", "--capacity-tokens", "auto", *SMALL, "--out", str(tmp_path / "b"),
    )  # fmt: skip
    assert code == 0, err
    expected = int((0.9 * 160 * GiB - 2 * 8_030_261_248 - 5 * GiB) // 131_072)
    assert _doc(tmp_path / "b")["workloads"][0]["capacity_tokens"] == expected
    code, _, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "20", "--model-config",
        "llama-3-8b", "--capacity-gib", "1", *SMALL, "--out", str(tmp_path / "c"),
    )  # fmt: skip
    assert code == 0, err
    assert _doc(tmp_path / "c")["workloads"][0]["capacity_tokens"] == GiB // 131_072


@pytest.mark.parametrize(
    ("argv", "fault"),
    [
        (["--model-config", "nope"], "no model config 'nope'"),
        (["--model-config", "llama-3-8b", "--capacity-tokens", "auto"], "needs --gpu-memory"),
        (["--tensor-parallel-size", "2"], "need --model-config or --gpu-memory"),
        (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype needs --model-config"),
    ],
)
def test_bad_model_flags_are_one_line(
    argv: list[str], fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run(capsys, "compare", "-w", "seed", *argv, *SMALL, "--out", str(tmp_path))
    assert code == 2 and fault in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------- refused for their length


def test_long_requests_are_rejected_and_counted_or_abort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (w,) = load_workloads(["multi_turn"], None, max_requests=60)
    longest = max(len(r.tokens) + len(r.output) for r in w.requests)
    limit = longest - 1
    code, out, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "60", "--max-model-len",
        str(limit), *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    too_long = [r for r in w.requests if len(r.tokens) + len(r.output) > limit]
    doc = _doc(tmp_path)["workloads"][0]
    assert doc["num_requests"] == 60 - len(too_long) >= 1
    assert f"{len(too_long)} of 60 requests rejected before scheduling" in out
    assert too_long[0].id in out
    code, _, err = _run(
        capsys, "compare", "-w", "multi_turn", "--max-requests", "60", "--max-model-len",
        str(limit), "--on-long-request", "abort", *SMALL, "--out", str(tmp_path / "x"),
    )  # fmt: skip
    assert code == 2 and f"request {too_long[0].id!r} is too long" in err
    assert not (tmp_path / "x").exists()


def test_a_request_longer_than_the_pool_is_rejected_not_an_abort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (w,) = load_workloads(["long_document"], None, max_requests=40)
    cap = w.stats.largest[0] - 64  # the largest request cannot fit alone
    code, out, err = _run(
        capsys, "compare", "-w", "long_document", "--max-requests", "40", "--capacity-tokens",
        str(cap), *SMALL, "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0, err
    assert (
        "rejected before scheduling" in out
        and f"alone in the KV pool (capacity {cap:,} tokens)" in out
    )
    assert _doc(tmp_path)["workloads"][0]["num_requests"] < 40


@given(st.integers(1, 400), st.integers(16, 2000))
@settings(max_examples=30, deadline=None)
def test_admission_keeps_exactly_what_fits_and_counts_the_rest(max_len: int, pool: int) -> None:
    (w,) = load_workloads(["multi_turn"], None, max_requests=40)
    rule = AdmissionRule(max_model_len=max_len, pool_tokens=pool, block_size=16)
    fits = [r for r in w.requests if rule.reason(len(r.tokens), len(r.output)) is None]
    if not fits:
        with pytest.raises(CapacityError, match="all 40 requests are too long"):
            admit(w, rule)
        return
    kept, rejected = admit(w, rule)
    assert [r.id for r in kept.requests] == [r.id for r in fits]
    assert kept.stats.num_requests + rejected.count == w.stats.num_requests
    assert kept.stats.prompt_tokens + rejected.prompt_tokens == w.stats.prompt_tokens
    assert all(len(r.tokens) + max(1, len(r.output)) <= max_len for r in kept.requests)
    if rejected.count:
        with pytest.raises(CapacityError, match="is too long"):
            admit(w, rule, abort=True)


def test_the_python_api_rejects_and_counts_long_requests_as_the_cli_does() -> None:
    (w,) = load_workloads(["multi_turn"], None, max_requests=60)
    longest = max(len(r.tokens) + max(1, len(r.output)) for r in w.requests)
    opts = CompareOptions(
        ["multi_turn"], indexes="hash_chain", max_requests=60, timing_repeats=0,
        capacity_search=False, request_rate=1.0,
    )  # fmt: skip
    at = compare_backends(opts, max_model_len=longest).comparison.workloads[0]
    assert (at.num_requests, at.rejected_requests) == (60, 0)  # exactly at the limit: admitted
    over = compare_backends(opts, max_model_len=longest - 1)  # one token over: rejected
    res = over.comparison.workloads[0]
    assert res.rejected_requests >= 1
    assert res.num_requests + res.rejected_requests == 60  # served + rejected == sent
    assert res.row()["rejected_requests"] == res.rejected_requests
    assert any("rejected before scheduling" in n for n in res.notes)
    assert all(t.part(RunMetrics).num_requests == res.num_requests for t in res.arrival_runs)
    assert res.backends[0].part(KLiveHits).num_requests == res.num_requests
    with pytest.raises(CapacityError, match="is too long"):
        compare_backends(opts, max_model_len=longest - 1, on_long_request="abort")
    for field, bad in (("max_model_len", 0), ("max_model_len", 2.5), ("on_long_request", "x")):
        with pytest.raises(CompareError, match=f"{field} must be"):
            compare_backends(opts, **{field: bad})


@given(st.integers(1, 10**6), st.integers(0, 10**5))
def test_a_request_exactly_at_max_model_len_is_admitted_and_one_token_over_is_not(
    prompt: int, output: int
) -> None:
    total = prompt + max(1, output)  # an engine decodes at least one token
    assert AdmissionRule(max_model_len=total).reason(prompt, output) is None
    why = AdmissionRule(max_model_len=total - 1).reason(prompt, output)
    assert why is not None and f"exceed max_model_len {total - 1:,}" in why


# ----------------------------------------------------------------- working set and knee


def test_bisection_finds_a_step_within_its_precision() -> None:
    calls: list[int] = []

    def hit(c: int) -> float:
        calls.append(c)
        return 0.5 if c >= 12_345 else 0.1

    found = smallest_reaching(hit, 100, 10**7, 0.5)
    assert 12_345 <= found <= 12_345 * (1 + PRECISION)
    assert len(calls) <= 12
    search = CapacitySearch(hit, [(20_000, 0.5), (5_000, 0.1)])
    assert 12_345 <= search.smallest(0.5, 100, 10**7) <= 12_345 * (1 + PRECISION)
    assert all(5_000 < c < 20_000 for c in calls[-search.replays :])  # the known bracket


@pytest.mark.parametrize("workload", ["multi_turn", "few_shot", "tree_of_thought"])
def test_the_working_set_reaches_the_infinite_cache_hit_and_the_knee_98_percent(
    workload: str,
) -> None:
    t = compare_backends(
        CompareOptions([workload], indexes="hash_chain,radix", max_requests=60, timing_repeats=0)
    )
    for a in t.comparison.workloads[0].anchors:
        assert a.working_set_tokens is not None and a.knee_tokens is not None
        assert a.knee_tokens <= a.working_set_tokens <= a.infinite_capacity_tokens
        assert a.knee_hit_ratio is not None
        assert a.knee_hit_ratio >= KNEE_SHARE * a.infinite_hit_ratio - 1e-12
        at_ws = compare_backends(
            CompareOptions(
                [workload], indexes=a.backend, max_requests=60, timing_repeats=0,
                capacity_tokens=a.working_set_tokens, capacity_search=False,
            )
        ).comparison.workloads[0].backends[0]  # fmt: skip
        assert at_ws.part(KLiveHits).hit_ratio == a.infinite_hit_ratio
        assert a.row()["working_set_gib"] is None or a.row()["working_set_gib"] > 0
