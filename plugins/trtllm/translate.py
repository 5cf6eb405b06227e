"""Our settings and sampling parameters as ``tensorrt_llm.bindings.executor`` objects.

``executor_bindings`` is always the bindings module (the real one, or the fake in tests); every name
used on it is listed in ``plugins.trtllm.names`` (a test holds this module to the list).
Constructors are called with keywords only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core import SamplingParams
from plugins.trtllm.settings import EngineSettings

# Disables the executor's end-of-sequence check: the executor leaves the end id out of its
# output (NVIDIA/TensorRT-LLM#2190), so our scheduler would never see the token it stops
# on. Stop ids go in as stop words instead, which the executor returns (TensorRT-LLM's
# own LLM API passes -1 the same way when asked to ignore EOS).
NO_END_ID = -1


def executor_config(
    executor_bindings: Any, settings: EngineSettings, worker_path: Path | None
) -> Any:
    """The ``ExecutorConfig`` of an engine. ``worker_path`` (the ``executorWorker``
    binary) is needed when the engine spans several GPUs: this process then orchestrates
    one MPI worker per GPU."""
    knobs = executor_bindings.ExtendedRuntimePerfKnobConfig()
    # Not constructor arguments in 1.2.x: properties set after construction.
    knobs.cuda_graph_mode = settings.cuda_graph_mode
    knobs.cuda_graph_cache_size = settings.cuda_graph_cache_size
    return executor_bindings.ExecutorConfig(
        max_beam_width=1,
        scheduler_config=executor_bindings.SchedulerConfig(
            capacity_scheduler_policy=getattr(
                executor_bindings.CapacitySchedulerPolicy, settings.capacity_scheduler_policy
            )
        ),
        kv_cache_config=executor_bindings.KvCacheConfig(
            enable_block_reuse=settings.enable_block_reuse,
            max_tokens=settings.kv_cache_max_tokens,
            free_gpu_memory_fraction=settings.kv_cache_free_gpu_memory_fraction,
        ),
        enable_chunked_context=settings.enable_chunked_context,
        max_batch_size=settings.max_batch_size,
        max_num_tokens=settings.max_num_tokens,
        parallel_config=_parallel_config(executor_bindings, settings, worker_path),
        extended_runtime_perf_knob_config=knobs,
    )


def _parallel_config(
    executor_bindings: Any, settings: EngineSettings, worker_path: Path | None
) -> Any:
    if settings.world_size == 1:
        return None  # in-process, on the current GPU
    if worker_path is None:
        raise ValueError(
            f"the engine at {settings.engine_path} spans {settings.world_size} GPUs: "
            "the executorWorker binary is needed (set executor_worker_path)"
        )
    return executor_bindings.ParallelConfig(
        communication_type=executor_bindings.CommunicationType.MPI,
        communication_mode=executor_bindings.CommunicationMode.ORCHESTRATOR,
        orchestrator_config=executor_bindings.OrchestratorConfig(
            is_orchestrator=True, worker_executable_path=str(worker_path)
        ),
    )


def sampling_config(executor_bindings: Any, sampling: SamplingParams, seed: int | None) -> Any:
    """Greedy (temperature 0) is ``top_k=1``. Otherwise ``top_p`` is always passed: the
    executor's default of 0 with ``top_k`` unset would mean greedy, not the full
    distribution. ``top_k`` 0 (off) is left unset, the executor's "all tokens"."""
    if sampling.greedy:
        return executor_bindings.SamplingConfig(beam_width=1, top_k=1)
    return executor_bindings.SamplingConfig(
        beam_width=1,
        top_k=sampling.top_k or None,
        top_p=sampling.top_p,
        temperature=sampling.temperature,
        seed=seed,
    )


def request(
    executor_bindings: Any,
    token_ids: Sequence[int],
    max_tokens: int,
    sampling: SamplingParams,
    *,
    seed: int | None,
    pad_id: int | None,
) -> Any:
    """A streaming request for ``max_tokens`` more tokens after ``token_ids``. Each stop
    id is a one-token stop word; the executor's responses then carry only new tokens,
    stop token included."""
    stop_words = [[t] for t in sampling.stop_token_ids] or None
    return executor_bindings.Request(
        input_token_ids=list(token_ids),
        max_tokens=max_tokens,
        streaming=True,
        sampling_config=sampling_config(executor_bindings, sampling, seed),
        output_config=executor_bindings.OutputConfig(
            return_log_probs=sampling.logprobs is not None,
            exclude_input_from_output=True,
        ),
        end_id=NO_END_ID,
        pad_id=pad_id,
        stop_words=stop_words,
    )
