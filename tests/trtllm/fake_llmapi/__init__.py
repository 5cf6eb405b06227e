"""A fake ``tensorrt_llm.llmapi`` (the PyTorch backend's LLM API) holding exactly the
names plugins/trtllm/names.py lists in ``LLM_API_BINDINGS``: pass this module where the
LLM-API executor takes ``llmapi``. See ``_llm`` for the behaviour it reproduces."""

from tests.trtllm.fake_llmapi._llm import LLM, CompletionOutput, RequestOutput
from tests.trtllm.fake_llmapi._options import (
    CapacitySchedulerPolicy,
    CudaGraphConfig,
    GuidedDecodingParams,
    KvCacheConfig,
    SamplingParams,
    SchedulerConfig,
)

__all__ = [
    "LLM",
    "CapacitySchedulerPolicy",
    "CompletionOutput",
    "CudaGraphConfig",
    "GuidedDecodingParams",
    "KvCacheConfig",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
]
