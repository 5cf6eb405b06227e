"""Options of the TensorRT-LLM executor; importable without TensorRT-LLM so config files
validate on any machine."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

CapacitySchedulerPolicy = Literal["MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"]


class TrtllmExecutorConfig(BaseModel):
    """``executor: {type: trtllm, ...}`` options (engine mode).

    ``engine_dir`` is a build output folder from ``build-engines``: it holds
    ``manifest.json`` and the engine folder the manifest names. The engine's limits
    (batch size, tokens per step, sequence length, KV block size) come from the manifest.

    Run-time knobs left at ``None`` take the value the build recorded in the manifest's
    LLM-API options:

    - ``kv_cache_free_gpu_memory_fraction``: share of the GPU memory left after weights
      and buffers that the KV cache takes.
    - ``kv_cache_max_tokens``: an upper bound on the KV cache, in tokens (``None``: as
      many as the memory fraction gives).
    - ``enable_block_reuse``: KV block reuse across requests; it makes the re-prefill of
      a preempted request cheap.
    - ``enable_chunked_context``, ``cuda_graph_mode``, ``cuda_graph_cache_size`` (graphs
      kept) and ``capacity_scheduler_policy``: the executor's own batching settings.

    Adapter settings:

    - ``pad_id``: the padding token id handed to the executor (``None``: not set).
    - ``seed``: seeds the generator that draws a seed for each sampled request that has
      none (``None``: fresh entropy per executor).
    - ``step_timeout_s``: longest wait, in seconds, for the tokens of one step before
      the executor is declared stalled.
    - ``startup_timeout_s``: longest wait, in seconds, for the warm-up request that
      measures the KV cache at start.
    - ``stats_interval_s``: how often, at most, in seconds, the executor's KV statistics
      are read during serving (its free blocks go to the scheduler).
    - ``executor_worker_path``: TensorRT-LLM's ``executorWorker`` binary, used when the
      engine spans several GPUs (``None``: the one inside the installed package).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine_dir: Path
    kv_cache_free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    kv_cache_max_tokens: int | None = Field(None, ge=1)
    enable_block_reuse: bool | None = None
    enable_chunked_context: bool | None = None
    cuda_graph_mode: bool | None = None
    cuda_graph_cache_size: int | None = Field(None, ge=0)
    capacity_scheduler_policy: CapacitySchedulerPolicy | None = None
    pad_id: int | None = Field(None, ge=0)
    seed: int | None = None
    step_timeout_s: float = Field(600.0, gt=0)
    startup_timeout_s: float = Field(600.0, gt=0)
    stats_interval_s: float = Field(1.0, gt=0)
    executor_worker_path: Path | None = None
