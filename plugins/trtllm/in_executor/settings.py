"""What the scheduler inside TensorRT-LLM's loop is built from, as LLM-API mode's
settings hand it down (``llm_api.settings.with_scheduling`` fills it in)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core import EngineConfig


@dataclass(frozen=True)
class InExecutorCore:
    """What the scheduler inside TensorRT-LLM's loop is built from: the engine config
    (its scheduler and cache sections: the same policies as in front), the context
    limit (``max_model_len``, tokens) and the tensor-parallel ranks it runs on (above 1,
    every rank is a worker process: ``in_executor.workers``)."""

    engine: EngineConfig
    max_model_len: int
    tensor_parallel_size: int = 1
