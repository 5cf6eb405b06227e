"""A fake ``tensorrt_llm.bindings.executor`` (TensorRT-LLM 1.2.x) holding exactly the
names plugins/trtllm/names.py lists: pass this module where the adapter takes
``bindings``. See ``_engine`` for the executor behaviour it reproduces."""

from tests.trtllm.fake_tensorrt_llm._engine import Executor
from tests.trtllm.fake_tensorrt_llm._types import (
    CapacitySchedulerPolicy,
    CommunicationMode,
    CommunicationType,
    ExecutorConfig,
    ExtendedRuntimePerfKnobConfig,
    FinishReason,
    IterationStats,
    KvCacheConfig,
    KvCacheStats,
    ModelType,
    OrchestratorConfig,
    OutputConfig,
    ParallelConfig,
    Request,
    Response,
    Result,
    SamplingConfig,
    SchedulerConfig,
)

__all__ = [
    "CapacitySchedulerPolicy",
    "CommunicationMode",
    "CommunicationType",
    "Executor",
    "ExecutorConfig",
    "ExtendedRuntimePerfKnobConfig",
    "FinishReason",
    "IterationStats",
    "KvCacheConfig",
    "KvCacheStats",
    "ModelType",
    "OrchestratorConfig",
    "OutputConfig",
    "ParallelConfig",
    "Request",
    "Response",
    "Result",
    "SamplingConfig",
    "SchedulerConfig",
]
