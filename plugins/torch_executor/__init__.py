"""The embedded executor: our own paged-KV Llama forward in PyTorch (CPU).

Importing this package does not import torch; ``TorchExecutor.from_config`` does.
"""

from plugins.torch_executor.config import TorchExecutorConfig
from plugins.torch_executor.executor import TorchExecutor

__all__ = ["TorchExecutor", "TorchExecutorConfig"]
