"""Options of the TensorRT-LLM LLM-API executor; importable without TensorRT-LLM so config
files validate on any machine."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from plugins.trtllm.config import CapacitySchedulerPolicy


class TrtllmLlmApiConfig(BaseModel):
    """``executor: {type: trtllm-llmapi, ...}`` options (LLM-API mode, PyTorch backend).

    Exactly one of:

    - ``build_dir``: a ``build-engines`` output folder of a ``backend: pytorch`` build
      (``manifest.json``, the quantised checkpoint it names, its LLM-API options); the
      limits and run-time settings come from the manifest;
    - ``model``: a Hugging Face Hub id or a local Hugging Face checkpoint folder, run
      with the settings below (and TensorRT-LLM's defaults for those left unset).

    Run-time knobs left at ``None`` keep the build's value (or, with ``model``, the
    default named): ``tensor_parallel_size`` and ``pipeline_parallel_size`` (1);
    ``kv_cache_free_gpu_memory_fraction`` (0.9: share of the GPU memory left after
    weights and buffers that the KV cache takes); ``enable_block_reuse`` (true: makes
    the re-prefill of a preempted request cheap); ``tokens_per_block`` (32, the KV block
    size, tokens); ``kv_cache_dtype`` (``auto``); ``max_batch_size`` (256, sequences);
    ``max_num_tokens`` (8192, tokens per iteration); ``max_input_len`` and
    ``max_seq_len`` (tokens; unset: the model's); ``enable_chunked_prefill`` (true);
    ``cuda_graphs`` (true), ``cuda_graph_batch_sizes`` (unset: graphs up to
    ``max_batch_size``), ``cuda_graph_padding`` (true); ``capacity_scheduler_policy``
    (``GUARANTEED_NO_EVICT``).

    ``scheduling``: ``front`` (the default) keeps TensorRT-LLM's own capacity and
    micro-batch schedulers deciding each iteration, with our scheduler in front
    (admission, order of submission, preemption by abort and resubmit);
    ``in_executor`` also puts our scheduler inside TensorRT-LLM's executor loop, where it
    decides each iteration's batch, chunk sizes and preemptions (checked releases only,
    one GPU rank; docs/trtllm.md, "In-executor scheduling").

    Adapter settings: ``seed`` seeds the seeds drawn for sampled requests that carry
    none (``None``: fresh entropy); ``step_timeout_s`` is the longest wait, in seconds,
    for one step's tokens; ``startup_timeout_s`` bounds the model load and the warm-up
    request that measures the KV cache; ``stats_interval_s`` is how often, at most, the
    executor's KV statistics are read during serving.

    ``guided_decoding_backend`` (``xgrammar`` or ``llguidance``) starts TensorRT-LLM with
    that grammar backend, so constrained requests (structured outputs, tool calls) are
    passed on as ``GuidedDecodingParams``; unset, TensorRT-LLM runs no guided decoder and
    constrained requests are refused with a 400 (never passed on unenforced).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    build_dir: Path | None = None
    model: str | None = Field(None, min_length=1)
    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    kv_cache_free_gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    enable_block_reuse: bool | None = None
    tokens_per_block: int | None = Field(None, ge=1)
    kv_cache_dtype: Literal["auto", "fp8"] | None = None
    max_batch_size: int | None = Field(None, ge=1)
    max_num_tokens: int | None = Field(None, ge=1)
    max_input_len: int | None = Field(None, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    enable_chunked_prefill: bool | None = None
    cuda_graphs: bool | None = None
    cuda_graph_batch_sizes: list[int] | None = Field(None, min_length=1)
    cuda_graph_padding: bool | None = None
    capacity_scheduler_policy: CapacitySchedulerPolicy | None = None
    scheduling: Literal["front", "in_executor"] = "front"
    seed: int | None = None
    step_timeout_s: float = Field(600.0, gt=0)
    startup_timeout_s: float = Field(1800.0, gt=0)
    stats_interval_s: float = Field(1.0, gt=0)
    guided_decoding_backend: Literal["xgrammar", "llguidance"] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> TrtllmLlmApiConfig:
        if (self.build_dir is None) == (self.model is None):
            raise ValueError(
                "set exactly one of build_dir (a build-engines output folder) and model "
                "(a Hugging Face Hub id or checkpoint folder)"
            )
        return self
