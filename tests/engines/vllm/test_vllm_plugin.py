"""prefixkv inside vLLM: ``--scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler``.

vLLM's real ``Scheduler`` and ``AsyncScheduler``, built from a real ``VllmConfig`` and
stepped like ``EngineCore`` with a stand-in model runner (``vllm_oracle.SchedulerReplay``),
run each trace with vLLM's own ``KVCacheManager`` and with prefixkv's, under continuous
batching, chunked prefill, preemption and eviction. With the hash chain every request's
hit, vLLM's prefix-cache stats (the ``vllm:prefix_cache_*`` metrics), the preemptions
and the KV usage after every step equal the native run's; the radix tree (page = block
size, a combination vLLM does not offer) runs the same traces with conservation checked
after every step.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm_oracle
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)

from prefixkv.adapters.errors import UnsupportedEngineFeatureError
from prefixkv.adapters.vllm.scheduler import (
    PrefixKVAsyncScheduler,
    PrefixKVScheduler,
    check_supported,
    check_version,
)
from prefixkv.indexes.errors import PrefixKVError

PLUGIN = "prefixkv.adapters.vllm.scheduler.PrefixKVScheduler"
MAX_MODEL_LEN = 8192

# (block size, async scheduling, token budget per step, pool)
CONFIGS = [
    (16, False, 512, "roomy"),
    (16, False, 512, "tight"),
    (16, True, 512, "tight"),
    (4, False, 256, "tight"),
    (16, True, 4096, "roomy"),
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(
        json.dumps(dict(vllm_oracle.TINY_LLAMA, max_position_embeddings=MAX_MODEL_LEN))
    )
    return str(d)


def num_blocks(reqs: list[dict[str, Any]], bs: int, pool: str) -> int:
    longest = -(-max(len(r["tokens"]) + len(r["output"]) for r in reqs) // bs)
    return 1 + (100 * longest if pool == "roomy" else 2 * longest + 4)


def run(
    model_dir: str,
    reqs: list[dict[str, Any]],
    bs: int,
    async_: bool,
    budget: int,
    pool: str,
    cls: str | None = None,
    index: str | None = None,
) -> dict[str, Any]:
    sched, hasher = vllm_oracle.build_scheduler(
        block_size=bs,
        num_blocks=num_blocks(reqs, bs, pool),
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=8,
        max_num_batched_tokens=budget,
        async_scheduling=async_,
        scheduler_cls=cls,
        additional_config={"prefixkv": {"index": index}} if index else None,
        model_dir=model_dir,
    )
    usage: list[float] = []

    def after_step(s: Any) -> None:
        usage.append(s.get_kv_cache_usage())
        if cls is not None:
            s.kv_cache_manager.check_invariants()

    rp = vllm_oracle.SchedulerReplay(sched, hasher)
    for rec in reqs:
        rp.add(rec)
    rp.run(after_step=after_step)
    assert len(rp.hits) == len(reqs)
    if cls is not None:
        manager = sched.kv_cache_manager
        assert not manager.manager.running()
        manager.check_invariants()
    return {
        "hits": rp.hits,
        "stats": rp.stats,
        "preemptions": rp.num_preemptions,
        "usage": usage,
        "scheduler": sched,
    }


@pytest.mark.parametrize(("bs", "async_", "budget", "pool"), CONFIGS)
@pytest.mark.parametrize("trace", ["synthetic", "mixed", "mooncake"])
def test_hash_chain_inside_vllm_equals_kv_cache_manager(
    traces, report, model_dir, trace, bs, async_, budget, pool
) -> None:
    reqs = traces[trace]
    native = run(model_dir, reqs, bs, async_, budget, pool)
    ours = run(model_dir, reqs, bs, async_, budget, pool, PLUGIN, "hash_chain")
    radix = run(model_dir, reqs, bs, async_, budget, pool, PLUGIN, "radix")
    expected_cls = PrefixKVAsyncScheduler if async_ else PrefixKVScheduler
    assert type(ours["scheduler"]) is expected_cls
    diff = [r for r in native["hits"] if native["hits"][r] != ours["hits"][r]]
    report.add(
        engine="vllm",
        trace=trace,
        block_size=bs,
        async_scheduling=async_,
        token_budget=budget,
        pool=pool,
        num_gpu_blocks=num_blocks(reqs, bs, pool),
        requests=len(reqs),
        prompt_tokens=sum(len(r["tokens"]) for r in reqs),
        preemptions=native["preemptions"],
        hits_vllm=sum(native["hits"].values()),
        hits_prefixkv_hash_chain=sum(ours["hits"].values()),
        hits_prefixkv_radix=sum(radix["hits"].values()),
        preemptions_radix=radix["preemptions"],
        differences=len(diff),
    )
    assert not diff, f"{len(diff)} requests differ, first {diff[:5]}"
    assert ours["stats"] == native["stats"]
    assert ours["preemptions"] == native["preemptions"]
    assert ours["usage"] == pytest.approx(native["usage"])
    if pool == "tight" and trace != "synthetic":
        assert native["preemptions"] > 0 or native["stats"]["hits"] < sum(
            len(r["tokens"]) for r in reqs
        )


class Collected:
    """Stands in for vLLM's event publisher: keeps each published batch's events."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []

    def publish(self, batch: Any) -> None:
        self.batches.append(list(batch.events))

    def shutdown(self) -> None:
        pass


def events_of(model_dir: str, reqs: list[dict[str, Any]], algo: str, cls: str | None) -> Any:
    sched, hasher = vllm_oracle.build_scheduler(
        block_size=16,
        num_blocks=num_blocks(reqs, 16, "tight"),
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=8,
        max_num_batched_tokens=512,
        async_scheduling=False,
        scheduler_cls=cls,
        additional_config={"prefixkv": {"index": "hash_chain"}} if cls else None,
        hash_algo=algo,
        kv_events=True,
        model_dir=model_dir,
    )
    sched.kv_event_publisher = collected = Collected()
    rp = vllm_oracle.SchedulerReplay(sched, hasher)
    for rec in reqs:
        rp.add(rec)
    rp.run()
    return collected.batches


@pytest.mark.parametrize("algo", ["sha256_cbor", "sha256"])
def test_kv_events_inside_vllm_equal_the_native_ones(
    model_dir, traces, algo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scheduler publishes one batch per step; with prefixkv's hash chain the batches
    # (hashes, parents, tokens, removals) equal what vLLM's own manager publishes,
    # through chunked prefill, preemption and eviction.
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    reqs = traces["mixed"][:60]
    native = events_of(model_dir, reqs, algo, None)
    ours = events_of(model_dir, reqs, algo, PLUGIN)
    assert sum(map(len, native)) > 100
    assert any(type(e).__name__ == "BlockRemoved" for b in native for e in b)
    assert ours == native


def test_radix_index_from_additional_config(model_dir, traces) -> None:
    out = run(model_dir, traces["synthetic"][:10], 16, False, 512, "roomy", PLUGIN, "radix")
    manager = out["scheduler"].kv_cache_manager
    assert type(manager.manager.index).__name__ == "RadixIndex"
    assert manager.manager.index.block_size == 16


def test_unknown_index_refused_at_start_up(model_dir, traces) -> None:
    with pytest.raises(PrefixKVError, match="no_such_index"):
        run(model_dir, traces["synthetic"][:2], 16, False, 512, "roomy", PLUGIN, "no_such_index")


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"prefixkv": {"block_size": 7}}, "block_size"),
        ({"prefixkv": {"name": "radix"}}, "name"),
        ({"PrefixKV": {"index": "radix"}}, "PrefixKV"),
        ({"prefix_kv": {}}, "prefix_kv"),
        ({"prefixkv": {"index": "radx"}}, "index"),
        ({"prefixkv": {"index": "radix", "eviction": "sometimes"}}, "radix"),
    ],
)
@pytest.mark.parametrize("caching", [True, False])
def test_bad_settings_stop_vllm_where_it_builds_its_config(
    model_dir, monkeypatch, extra, key, caching
) -> None:
    # vLLM loads prefixkv's general plug-in (the vllm.general_plugins entry point) when
    # EngineArgs is made; the VllmConfig it builds is checked there, before any engine
    # process or model. This machine has no GPU: vLLM's CPU platform stands in.
    import vllm.engine.arg_utils as arg_utils
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    from prefixkv.adapters.errors import EngineSettingsError

    cpu = CpuPlatform()
    monkeypatch.setattr(platforms, "_current_platform", cpu)
    monkeypatch.setattr(arg_utils, "current_platform", cpu)
    args = arg_utils.EngineArgs(
        model=model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=1024,
        scheduler_cls=PLUGIN,
        additional_config=extra,
        enable_prefix_caching=caching,
    )
    with pytest.raises(EngineSettingsError, match=key):
        args.create_engine_config()
    args.additional_config = {"prefixkv": {"index": "radix"}}
    assert args.create_engine_config().additional_config == args.additional_config


def test_reset_prefix_cache_only_when_idle(model_dir, traces) -> None:
    out = run(model_dir, traces["synthetic"][:20], 16, False, 512, "roomy", PLUGIN, "hash_chain")
    sched = out["scheduler"]
    assert sched.kv_cache_manager.manager.index.stats().num_cached_blocks > 0
    assert sched.reset_prefix_cache()
    assert sched.kv_cache_manager.manager.index.stats().num_cached_blocks == 0
    stats = sched.kv_cache_manager.make_prefix_cache_stats()
    assert stats is not None and stats.reset


def _config(model_dir: str) -> Any:
    sched, _ = vllm_oracle.build_scheduler(
        block_size=16,
        num_blocks=64,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=2,
        max_num_batched_tokens=512,
        async_scheduling=False,
        scheduler_cls=None,
        model_dir=model_dir,
    )
    return sched.vllm_config


def _kv_config(*specs: Any) -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layers.{i}.attn"], s) for i, s in enumerate(specs)],
    )


FULL = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32)
SLIDING = SlidingWindowSpec(
    block_size=16, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=128
)


@pytest.mark.parametrize(
    ("specs", "feature"), [((SLIDING,), "sliding window"), ((FULL, SLIDING), "hybrid")]
)
def test_unsupported_layouts_refused_by_name(model_dir, specs, feature) -> None:
    config, kv = _config(model_dir), _kv_config(*specs)
    with pytest.raises(UnsupportedEngineFeatureError, match=feature):
        check_supported(config, kv)
    with pytest.raises(UnsupportedEngineFeatureError, match=feature):
        PrefixKVScheduler(
            vllm_config=config,
            kv_cache_config=kv,
            structured_output_manager=None,
            block_size=16,
            log_stats=True,
        )


@pytest.mark.parametrize(
    ("field", "feature"),
    [("kv_transfer_config", "KV connectors"), ("speculative_config", "speculative decoding")],
)
def test_unsupported_features_refused_by_name(model_dir, field, feature) -> None:
    config = _config(model_dir)
    object.__setattr__(config, field, types.SimpleNamespace())
    with pytest.raises(UnsupportedEngineFeatureError, match=feature):
        check_supported(config, _kv_config(FULL))


@pytest.mark.parametrize(
    ("part", "field", "feature"),
    [
        ("model_config", "enable_prompt_embeds", "prompt embeddings"),
        ("observability_config", "kv_cache_metrics", "KV-cache residency metrics"),
    ],
)
def test_features_vllm_hashes_or_measures_per_block_refused(model_dir, part, field, feature):
    config = _config(model_dir)
    object.__setattr__(getattr(config, part), field, True)
    with pytest.raises(UnsupportedEngineFeatureError, match=feature):
        check_supported(config, _kv_config(FULL))


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "dev"])
def test_other_vllm_versions_refused_at_start_up_in_one_line(
    model_dir, traces, version, monkeypatch
) -> None:
    with pytest.raises(UnsupportedEngineFeatureError, match=r"supports vLLM 0\.32 to 0\.33") as e:
        check_version(version)
    assert "\n" not in str(e.value) and version in str(e.value)
    check_version("0.32.0+cpu")
    check_version("0.33.0")
    import vllm

    monkeypatch.setattr(vllm, "__version__", version)
    with pytest.raises(UnsupportedEngineFeatureError, match="supports vLLM"):
        run(model_dir, traces["synthetic"][:1], 16, False, 512, "roomy", PLUGIN, "hash_chain")


def test_engine_core_start_up_reads_the_managers_groups(model_dir, traces) -> None:
    # What EngineCore.__init__ runs after building the scheduler (the crash of the
    # first `vllm serve --scheduler-cls ...`), and the metadata Dynamo asks for.
    from vllm.v1.engine.core import EngineCore

    sched = run(model_dir, traces["synthetic"][:3], 16, False, 512, "roomy", PLUGIN, "radix")
    sched = sched["scheduler"]
    core = types.SimpleNamespace(vllm_config=sched.vllm_config, scheduler=sched)
    EngineCore._initialize_effective_attention_block_size(core)
    assert sched.vllm_config.cache_config.effective_attention_block_size == 16
    (meta,) = EngineCore.get_kv_cache_group_metadata(core)
    assert meta == {
        "group_idx": 0,
        "kind": "full_attention",
        "block_size": 16,
        "sliding_window": None,
    }
    assert sched.make_stats().kv_cache_usage == sched.kv_cache_manager.usage


def test_async_scheduling_picks_the_async_variant(model_dir, traces) -> None:
    out = run(model_dir, traces["synthetic"][:4], 16, True, 512, "roomy", PLUGIN, "hash_chain")
    assert isinstance(out["scheduler"], AsyncScheduler)
    assert isinstance(out["scheduler"], PrefixKVScheduler)


def test_plugin_module_is_not_imported_by_prefixkv_adapters() -> None:
    import subprocess
    import sys

    code = (
        "import sys, prefixkv.adapters; "
        "print(any(m.startswith(('vllm', 'sglang')) for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    )
    assert out.stdout.strip() == "False"
