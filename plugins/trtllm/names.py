"""Every ``tensorrt_llm.bindings.executor`` name the adapter uses (TensorRT-LLM 1.2.x).

This list is the single source three things are held to:

- the adapter: it reaches the bindings only through a module bound to the name ``tle``,
  and a test walks its source to check that every ``tle.X``, every keyword passed to
  ``tle.X(...)`` and every enum member is listed here;
- the fake bindings the tests run against (tests/trtllm/fake_tensorrt_llm): a test checks
  that their public surface is exactly this list, so a use of an unlisted name fails;
- ``plugins.trtllm.check_names``, run inside the NGC container, checks every entry
  against the real bindings.

Constructors are always called with keywords, so one list of keyword names covers them.
Signatures were read from TensorRT-LLM's binding sources (``cpp/tensorrt_llm/nanobind/
executor/*.cpp`` and the pybind11 twins); note that ``ExtendedRuntimePerfKnobConfig``'s
constructor takes neither ``cuda_graph_mode`` nor ``cuda_graph_cache_size``: both are
properties set after construction, as TensorRT-LLM's own LLM API does.
"""

from __future__ import annotations

from dataclasses import dataclass

MODULE = "tensorrt_llm.bindings.executor"


@dataclass(frozen=True)
class Binding:
    """One class or enum of the bindings module.

    ``keywords``: constructor keywords the adapter passes. ``attributes``: properties
    read or set and methods called on instances. ``members``: enum members.
    """

    name: str
    keywords: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    members: tuple[str, ...] = ()

    @property
    def is_enum(self) -> bool:
        return bool(self.members)


CAPACITY_SCHEDULER_POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")

BINDINGS: tuple[Binding, ...] = (
    Binding("ModelType", members=("DECODER_ONLY",)),
    Binding("CapacitySchedulerPolicy", members=CAPACITY_SCHEDULER_POLICIES),
    Binding(
        "FinishReason",
        members=("NOT_FINISHED", "END_ID", "STOP_WORDS", "LENGTH", "TIMED_OUT", "CANCELLED"),
    ),
    Binding("CommunicationType", members=("MPI",)),
    Binding("CommunicationMode", members=("LEADER", "ORCHESTRATOR")),
    Binding("SchedulerConfig", keywords=("capacity_scheduler_policy",)),
    Binding(
        "KvCacheConfig",
        keywords=("enable_block_reuse", "max_tokens", "free_gpu_memory_fraction"),
    ),
    Binding(
        "ExtendedRuntimePerfKnobConfig",
        attributes=("cuda_graph_mode", "cuda_graph_cache_size"),
    ),
    Binding("OrchestratorConfig", keywords=("is_orchestrator", "worker_executable_path")),
    Binding(
        "ParallelConfig",
        keywords=("communication_type", "communication_mode", "orchestrator_config"),
    ),
    Binding(
        "ExecutorConfig",
        keywords=(
            "max_beam_width",
            "scheduler_config",
            "kv_cache_config",
            "enable_chunked_context",
            "max_batch_size",
            "max_num_tokens",
            "parallel_config",
            "extended_runtime_perf_knob_config",
        ),
    ),
    Binding(
        "SamplingConfig",
        keywords=("beam_width", "top_k", "top_p", "temperature", "seed"),
    ),
    Binding("OutputConfig", keywords=("return_log_probs", "exclude_input_from_output")),
    Binding(
        "Request",
        keywords=(
            "input_token_ids",
            "max_tokens",
            "streaming",
            "sampling_config",
            "output_config",
            "end_id",
            "pad_id",
            "stop_words",
        ),
    ),
    Binding(
        "Executor",
        keywords=("model_path", "model_type", "executor_config"),
        attributes=(
            "enqueue_request",
            "await_responses",
            "cancel_request",
            "get_latest_iteration_stats",
            "shutdown",
        ),
    ),
    Binding("Response", attributes=("request_id", "has_error", "error_msg", "result")),
    Binding("Result", attributes=("is_final", "output_token_ids", "log_probs", "finish_reasons")),
    Binding("IterationStats", attributes=("kv_cache_stats",)),
    Binding("KvCacheStats", attributes=("max_num_blocks", "tokens_per_block")),
)

BY_NAME: dict[str, Binding] = {b.name: b for b in BINDINGS}
