"""TensorRT-LLM adapter, engine mode: executor type ``trtllm``.

Importing this package does not import TensorRT-LLM; starting an executor does.
"""

from plugins.trtllm.config import TrtllmExecutorConfig
from plugins.trtllm.errors import TrtllmError, TrtllmStalledError
from plugins.trtllm.executor import TrtllmExecutor

__all__ = [
    "TrtllmError",
    "TrtllmExecutor",
    "TrtllmExecutorConfig",
    "TrtllmStalledError",
]
