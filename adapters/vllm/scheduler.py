"""vLLM's scheduler with a prefixkv index as its prefix cache: what ``--scheduler-cls`` loads.

    vllm serve MODEL --scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler \\
        --additional-config '{"prefixkv": {"index": "radix"}}'

``PrefixKVScheduler`` is vLLM's own ``Scheduler`` (or ``AsyncScheduler`` when async
scheduling is on: the class picks it, as vLLM's default does) whose ``kv_cache_manager``
is prefixkv's :class:`~.kv_cache_manager.KVCacheManager`, answering with vLLM's own
block, stats and event types, over the index the ``prefixkv`` settings name: ``index``
(a registry name, default ``"hash_chain"``) and any other keys as the index's options
(``eviction``, ``hash_algorithm``, ``seed``...). The index's block size is vLLM's
``--block-size``. vLLM 0.32 and 0.33 are supported, one full-attention KV-cache group;
anything else is refused at start-up with one line naming it. The settings follow one
rule (:mod:`.settings`), which vLLM's general plug-in (:mod:`.plugin`) already applied
before the model loaded.
"""

from __future__ import annotations

import re
from typing import Any

from prefixkv.indexes.base import PrefixIndex

from ..errors import UnsupportedEngineFeatureError, engine_imports
from ..events.codec import as_engine_events
from ..events.wire import KVEvent
from .engine_types import EngineTypes
from .kv_cache_manager import KVCacheManager
from .settings import index_from_settings

SUPPORTED_VERSIONS = ((0, 32), (0, 33))
"""The vLLM releases (major, minor) whose scheduler and engine core this was checked in."""

# vLLM last, once its installed version is known to be one of these: otherwise one
# EngineNotInstalledError (an ImportError) naming them, before any vLLM module loads.
with engine_imports(
    __name__,
    "vllm",
    [f"{major}.{minor}" for major, minor in SUPPORTED_VERSIONS],
    "prefixkv.adapters.vllm.KVCacheManager (engine-free)",
):
    import vllm
    from vllm.config import VllmConfig
    from vllm.logger import init_logger
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import (
        KVCacheConfig,
        KVCacheSpecKind,
        get_kv_cache_spec_kind,
    )
    from vllm.v1.metrics.stats import PrefixCacheStats

__all__ = [
    "SUPPORTED_VERSIONS",
    "PrefixKVAsyncScheduler",
    "PrefixKVScheduler",
    "check_supported",
    "check_version",
    "index_from_config",
    "vllm_types",
]

# Under vLLM's own logger, which vLLM's logging configuration shows (a logger outside
# "vllm" would print nothing below WARNING in a server).
logger = init_logger("vllm.prefixkv")

_FULL_ATTENTION = (KVCacheSpecKind.FULL_ATTENTION, KVCacheSpecKind.MLA_ATTENTION)
_PLUGIN = "--scheduler-cls prefixkv.adapters.vllm.scheduler.PrefixKVScheduler"


def check_version(version: str) -> None:
    """Refuse a vLLM outside :data:`SUPPORTED_VERSIONS`, in one line.

    Raises:
        UnsupportedEngineFeatureError: naming the version and the supported range.
    """
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None or (int(m[1]), int(m[2])) not in SUPPORTED_VERSIONS:
        lo, hi = SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1]
        raise UnsupportedEngineFeatureError(
            f"prefixkv's vLLM scheduler supports vLLM {lo[0]}.{lo[1]} to {hi[0]}.{hi[1]}, "
            f"not vLLM {version}; install one of those or run without {_PLUGIN}"
        )


def vllm_types() -> EngineTypes:
    """vLLM's own block, block-list, prefix-cache-stats and KV-event types."""
    from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    event_type = BlockStored | BlockRemoved | AllBlocksCleared

    def block(block_id: int, is_null: bool) -> Any:
        return KVCacheBlock(block_id, is_null=is_null)

    def events(events: list[KVEvent]) -> list[Any]:
        # prefixkv's structs are vLLM's field for field: a msgpack round trip gives
        # vLLM's own classes, so the publisher and any consumer see what they expect.
        return as_engine_events(events, event_type)

    return EngineTypes(block, KVCacheBlocks, PrefixCacheStats, events)


def index_from_config(vllm_config: VllmConfig, block_size: int | None) -> PrefixIndex:
    """The index ``additional_config["prefixkv"]`` names, at vLLM's block size.

    The one rule of :func:`~.settings.index_from_settings`, which the start-up check
    (:mod:`.plugin`) ran on the same configuration before the model loaded. Prefix
    caching off (``--no-enable-prefix-caching``) gives the ``"none"`` index.

    Raises:
        EngineSettingsError: the settings are wrong (one line naming the key).
    """
    cache = vllm_config.cache_config
    return index_from_settings(
        vllm_config.additional_config,
        block_size=block_size,
        enable_prefix_caching=bool(cache.enable_prefix_caching),
        hash_algorithm=cache.prefix_caching_hash_algo,
    )


def check_supported(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> None:
    """Refuse what prefixkv does not model, naming the feature and its flag.

    Raises:
        UnsupportedEngineFeatureError: the first unsupported feature found.
    """

    def refuse(feature: str) -> None:
        raise UnsupportedEngineFeatureError(
            f"prefixkv's vLLM scheduler does not support {feature}; "
            f"run without it or without {_PLUGIN}"
        )

    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        kinds = sorted({get_kv_cache_spec_kind(g.kv_cache_spec).value for g in groups})
        refuse(f"hybrid KV-cache layouts ({len(groups)} KV-cache groups: {', '.join(kinds)})")
    spec = groups[0].kv_cache_spec
    kind = get_kv_cache_spec_kind(spec)
    if kind not in _FULL_ATTENTION:
        refuse(f"{kind.value.replace('_', ' ')} layers (only full attention is supported)")
    if getattr(spec, "sliding_window", None) is not None:
        refuse("sliding-window attention")
    if getattr(spec, "attention_chunk_size", None) is not None:
        refuse("chunked local attention")
    if spec.prefix_replay_tokens:
        refuse("sliding-window bounded prefix replay")
    if kv_cache_config.needs_kv_cache_zeroing:
        refuse("KV caches that need zeroing (Mamba or mixed precision)")
    model = vllm_config.model_config
    if model.is_encoder_decoder:
        refuse("encoder-decoder models (cross-attention)")
    if model.is_multimodal_model:
        # vLLM hashes each image's (or audio's) identity into the blocks it covers;
        # prefixkv's keys are token ids, so two images behind the same placeholder
        # tokens would share KV.
        refuse("multimodal models (their inputs enter vLLM's block hashes)")
    if model.enable_prompt_embeds:
        refuse("prompt embeddings (--enable-prompt-embeds; they enter vLLM's block hashes)")
    if vllm_config.kv_transfer_config is not None:
        refuse("KV connectors (--kv-transfer-config)")
    if vllm_config.speculative_config is not None:
        refuse("speculative decoding (lookahead slots; --speculative-config)")
    if vllm_config.parallel_config.decode_context_parallel_size > 1:
        refuse("decode context parallelism (--decode-context-parallel-size)")
    if vllm_config.aux_output_config.enabled:
        refuse("auxiliary-output connectors")
    if vllm_config.observability_config.kv_cache_metrics:
        refuse("KV-cache residency metrics (--kv-cache-metrics)")


class PrefixKVScheduler(Scheduler):  # type: ignore[misc]
    """vLLM's scheduler, its prefix cache a prefixkv index.

    Constructed by vLLM's engine core with the ``Scheduler`` arguments. With async
    scheduling on, constructing it gives a :class:`PrefixKVAsyncScheduler`.

    Raises:
        UnsupportedEngineFeatureError: at construction, for an unsupported vLLM
            version or feature.
        EngineSettingsError: bad ``prefixkv`` settings.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> PrefixKVScheduler:
        config = kwargs.get("vllm_config", args[0] if args else None)
        if (
            cls is PrefixKVScheduler
            and config is not None
            and config.scheduler_config.async_scheduling
        ):
            cls = PrefixKVAsyncScheduler
        return super().__new__(cls)  # type: ignore[no-any-return]

    def __init__(
        self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, *args: Any, **kwargs: Any
    ) -> None:
        check_version(vllm.__version__)
        check_supported(vllm_config, kv_cache_config)
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        index = index_from_config(vllm_config, self.block_size)
        # The native manager Scheduler.__init__ built is replaced before any request.
        self.kv_cache_manager = KVCacheManager(
            index,
            kv_cache_config.num_blocks,
            max_model_len=self.max_model_len,
            enable_caching=bool(self.cache_config.enable_prefix_caching),
            log_stats=bool(self.log_stats),
            watermark=float(self.scheduler_config.watermark),
            enable_kv_cache_events=bool(self.enable_kv_cache_events),
            engine_types=vllm_types(),
            kv_cache_spec=kv_cache_config.kv_cache_groups[0].kv_cache_spec,
            kv_cache_config=kv_cache_config,
        )
        logger.info(
            "prefixkv: %s index (block size %d) over %d KV blocks, vLLM %s%s",
            type(index).__name__,
            self.block_size,
            kv_cache_config.num_blocks,
            vllm.__version__,
            " (async scheduling)" if isinstance(self, AsyncScheduler) else "",
        )


class PrefixKVAsyncScheduler(PrefixKVScheduler, AsyncScheduler):  # type: ignore[misc]
    """vLLM's ``AsyncScheduler`` with a prefixkv index (picked when async scheduling is on)."""
