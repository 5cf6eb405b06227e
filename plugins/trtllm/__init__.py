"""TensorRT-LLM adapters: executor types ``trtllm`` (engine mode, TensorRT-LLM 1.2.x's C++
``Executor`` over a TensorRT engine) and ``trtllm-llmapi`` (LLM-API mode, the PyTorch
backend's ``tensorrt_llm.LLM``, TensorRT-LLM 1.2.1 and newer).

Importing this package does not import TensorRT-LLM; starting an executor does.
"""

from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.executor import TrtllmExecutor
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.llm_api.executor import TrtllmLlmApiExecutor

__all__ = [
    "TrtllmError",
    "TrtllmExecutor",
    "TrtllmExecutorConfig",
    "TrtllmLlmApiConfig",
    "TrtllmLlmApiExecutor",
    "TrtllmStalledError",
]
