"""The reference engine: a tiny paged-attention transformer, a continuous-batching
scheduler and the equal-KV oracle (SPEC BB-6), over any registered prefix index.

It runs on torch, which ``pip install 'prefixkv[torch]'`` adds: without it, importing
this package (or any module in it) raises one
:class:`~prefixkv.storage.extras.ExtraNotInstalledError` naming that extra."""

from prefixkv.storage.extras import TORCH_EXTRA, extra_imports

with extra_imports(*TORCH_EXTRA, "prefixkv.adapters.engine (the reference engine)"):
    from .config import SUPPORTED_DTYPES, EngineConfig, EngineConfigError, ModelConfig
    from .engine import Engine, EngineStats, FinishHook, RequestResult, StepHook
    from .model import ReferenceOutput, SeqChunk, TinyTransformer
    from .scheduler import (
        EngineRequest,
        RequestStatus,
        ScheduledChunk,
        Scheduler,
        SchedulerOutput,
    )

__all__ = [
    "SUPPORTED_DTYPES",
    "Engine",
    "EngineConfig",
    "EngineConfigError",
    "EngineRequest",
    "EngineStats",
    "FinishHook",
    "ModelConfig",
    "ReferenceOutput",
    "RequestResult",
    "RequestStatus",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerOutput",
    "SeqChunk",
    "StepHook",
    "TinyTransformer",
]
