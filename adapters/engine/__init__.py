"""The reference engine: a tiny paged-attention transformer, a continuous-batching
scheduler and the equal-KV oracle (SPEC BB-6), over any registered prefix index."""

from .config import SUPPORTED_DTYPES, EngineConfig, EngineConfigError, ModelConfig
from .engine import Engine, EngineStats, FinishHook, RequestResult, StepHook
from .model import ReferenceOutput, SeqChunk, TinyTransformer
from .scheduler import EngineRequest, RequestStatus, ScheduledChunk, Scheduler, SchedulerOutput

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
