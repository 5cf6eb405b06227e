"""Every TensorRT-LLM name the two executors use, one list per mode.

- Engine mode: ``tensorrt_llm.bindings.executor`` (TensorRT-LLM 1.2.x, the C++
  ``Executor`` and its value types).
- LLM-API mode: ``tensorrt_llm.llmapi`` (the PyTorch backend's ``LLM``, its options and
  its request outputs; 1.2.1 and newer).

Each list is the single source three things are held to:

- the adapter: it reaches TensorRT-LLM only through a module bound to one name
  (``executor_bindings`` in engine mode, ``llmapi`` in LLM-API mode), and a test walks
  its source to check that every ``executor_bindings.X`` / ``llmapi.X``, every keyword
  passed to a listed constructor and every enum member is listed here;
- the fakes the tests run against (``tests/trtllm/fake_tensorrt_llm``,
  ``tests/trtllm/fake_llmapi``): a test checks that their public surface is exactly this
  list, that each constructor takes the listed keywords by position exactly as far as
  ``positional`` says, and that it refuses ``None`` exactly for ``required``;
- ``plugins.trtllm.check_names``, run inside the NGC container, checks every entry
  (names, positional forms and ``None`` refusals) against the installed release.

Signatures were read from TensorRT-LLM's sources; docs/trtllm.md has the table of files
and versions. The adapter itself always passes keywords.
"""

from __future__ import annotations

from dataclasses import dataclass

MODULE = "tensorrt_llm.bindings.executor"
LLM_API_MODULE = "tensorrt_llm.llmapi"


@dataclass(frozen=True)
class Binding:
    """One class or enum of a TensorRT-LLM module.

    ``keywords``: constructor keywords the adapter passes, in the real constructor's
    parameter order. ``positional``: how many of the leading ``keywords`` the real
    constructor also takes by position (it takes further positional parameters the
    adapter does not use, so the fakes stop there). ``required``: keywords whose real
    parameter type is not optional, so ``None`` is refused (C++ ``const&`` parameters,
    ``bool`` and ``int`` parameters, non-``Optional`` pydantic fields).
    ``attributes``: properties read or set and methods called on instances.
    ``members``: enum members. ``optional``: keywords only some releases have (they may
    also be ``required``: ``None`` refused where they exist); the adapter passes each only
    where the installed class has it, and check_names reports whether it is there
    instead of failing.
    """

    name: str
    keywords: tuple[str, ...] = ()
    positional: int = 0
    required: tuple[str, ...] = ()
    attributes: tuple[str, ...] = ()
    members: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.positional > len(self.keywords):
            raise ValueError(f"{self.name}: positional exceeds the listed keywords")
        if not set(self.required) <= set(self.keywords):
            raise ValueError(f"{self.name}: required names an unlisted keyword")
        if not set(self.optional) <= set(self.keywords):
            raise ValueError(f"{self.name}: optional names an unlisted keyword")

    @property
    def is_enum(self) -> bool:
        return bool(self.members)


CAPACITY_SCHEDULER_POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")

# tensorrt_llm.bindings.executor, 1.2.x: cpp/tensorrt_llm/nanobind/executor/
# {executorConfig,request,executor}.cpp (the pybind11 twins declare the same).
# ExtendedRuntimePerfKnobConfig's constructor takes neither cuda_graph_mode nor
# cuda_graph_cache_size: both are properties set after construction, as TensorRT-LLM's
# own LLM API does.
BINDINGS: tuple[Binding, ...] = (
    Binding("ModelType", members=("DECODER_ONLY",)),
    Binding("CapacitySchedulerPolicy", members=CAPACITY_SCHEDULER_POLICIES),
    Binding(
        "FinishReason",
        members=("NOT_FINISHED", "END_ID", "STOP_WORDS", "LENGTH", "TIMED_OUT", "CANCELLED"),
    ),
    Binding("CommunicationType", members=("MPI",)),
    Binding("CommunicationMode", members=("LEADER", "ORCHESTRATOR")),
    Binding(
        "SchedulerConfig",
        keywords=("capacity_scheduler_policy",),
        positional=1,
        required=("capacity_scheduler_policy",),
    ),
    Binding(
        "KvCacheConfig",
        keywords=("enable_block_reuse", "max_tokens", "free_gpu_memory_fraction"),
        positional=2,
        required=("enable_block_reuse",),
    ),
    Binding(
        "ExtendedRuntimePerfKnobConfig",
        attributes=("cuda_graph_mode", "cuda_graph_cache_size"),
    ),
    Binding(
        "OrchestratorConfig",
        keywords=("is_orchestrator", "worker_executable_path"),
        positional=2,
        required=("is_orchestrator", "worker_executable_path"),
    ),
    Binding(
        "ParallelConfig",
        keywords=("communication_type", "communication_mode", "orchestrator_config"),
        positional=2,
        required=("communication_type", "communication_mode"),
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
        positional=4,
        required=(
            "max_beam_width",
            "scheduler_config",
            "kv_cache_config",
            "enable_chunked_context",
            "extended_runtime_perf_knob_config",
        ),
    ),
    Binding(
        "SamplingConfig",
        keywords=("beam_width", "top_k", "top_p", "seed", "temperature"),
        positional=1,
        required=("beam_width",),
    ),
    Binding(
        "OutputConfig",
        keywords=("return_log_probs", "exclude_input_from_output"),
        positional=1,
    ),
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
        positional=2,
        required=("input_token_ids", "max_tokens", "streaming", "sampling_config", "output_config"),
    ),
    Binding(
        "Executor",
        keywords=("model_path", "model_type", "executor_config"),
        positional=3,
        required=("model_path", "model_type", "executor_config"),
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
    # The executor bindings (nanobind and pybind11) expose these as read-write fields.
    Binding(
        "KvCacheStats",
        attributes=("max_num_blocks", "free_num_blocks", "used_num_blocks", "tokens_per_block"),
    ),
)

BY_NAME: dict[str, Binding] = {b.name: b for b in BINDINGS}

# tensorrt_llm.llmapi (tensorrt_llm/llmapi/{__init__,llm,llm_args}.py,
# tensorrt_llm/sampling_params.py, tensorrt_llm/executor/result.py). Every options class
# is a pydantic model (keywords only, unknown keys refused); SamplingParams is a
# keyword-only dataclass; LLM takes ``model`` by position. RequestOutput is made by
# ``LLM.generate_async`` only, and is iterated with ``async for`` on the event loop it
# was created on (its queue is an asyncio one only when a loop runs at creation).
# Per-release keywords (``optional``; docs/trtllm.md names the sources):
# ``KvCacheConfig.use_kv_cache_manager_v2`` (a stored llm_args.py has it as a prototype
# bool; with the V2 manager the PyTorch backend's KVCacheV2Scheduler replaces every
# capacity policy but MAX_UTILIZATION, _torch/pyexecutor/scheduler/scheduler_v2.py at
# 9ba713c3), pinned to False where it exists; ``SchedulerConfig.waiting_queue_policy``
# (FCFS only in waiting_queue.py at 85942da5; a later stored copy adds PRIORITY, which
# serves higher ``generate_async(priority=...)`` first).
LLM_API_BINDINGS: tuple[Binding, ...] = (
    Binding("CapacitySchedulerPolicy", members=CAPACITY_SCHEDULER_POLICIES),
    Binding(
        "SchedulerConfig",
        keywords=("capacity_scheduler_policy", "waiting_queue_policy"),
        required=("capacity_scheduler_policy", "waiting_queue_policy"),
        optional=("waiting_queue_policy",),
    ),
    Binding(
        "KvCacheConfig",
        keywords=(
            "enable_block_reuse",
            "free_gpu_memory_fraction",
            "dtype",
            "tokens_per_block",
            "use_kv_cache_manager_v2",
        ),
        required=("enable_block_reuse", "dtype", "tokens_per_block", "use_kv_cache_manager_v2"),
        optional=("use_kv_cache_manager_v2",),
    ),
    Binding(
        "CudaGraphConfig",
        keywords=("batch_sizes", "max_batch_size", "enable_padding"),
        required=("max_batch_size", "enable_padding"),
    ),
    Binding(
        "SamplingParams",
        keywords=(
            "max_tokens",
            "stop_token_ids",
            "include_stop_str_in_output",
            "top_k",
            "top_p",
            "seed",
            "temperature",
            "logprobs",
            "ignore_eos",
            "detokenize",
        ),
        # A plain dataclass: it validates no types, so None is taken for every field.
    ),
    Binding(
        "LLM",
        keywords=(
            "model",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "kv_cache_config",
            "enable_chunked_prefill",
            "scheduler_config",
            "max_batch_size",
            "max_input_len",
            "max_seq_len",
            "max_num_tokens",
            "cuda_graph_config",
            "enable_iter_perf_stats",
        ),
        positional=1,
        required=(
            "model",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "kv_cache_config",
            "enable_chunked_prefill",
            "scheduler_config",
            "enable_iter_perf_stats",
        ),
        # get_stats is listed because the fake reproduces it; the adapter must not call
        # it (llm_api/stats.py says why) and reads get_stats_async on its loop instead.
        attributes=("generate_async", "generate", "get_stats", "get_stats_async", "shutdown"),
    ),
    Binding("RequestOutput", attributes=("outputs", "finished", "abort")),
    Binding("CompletionOutput", attributes=("token_ids_diff", "logprobs_diff", "finish_reason")),
)

# ---- guided decoding (structured outputs) -------------------------------------------
# tensorrt_llm/sampling_params.py at 000a01de: ``GuidedDecodingParams`` is a keyword-only
# dataclass (json, regex, grammar, json_object, structural_tag; one guide per request)
# and ``SamplingParams.guided_decoding`` carries it (after ``logprobs`` and the output
# fields, before ``ignore_eos``). tensorrt_llm/llmapi/llm_args.py:
# ``guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = None`` on the
# LLM arguments (llguidance on the PyTorch backend only). What each backend compiles:
# tensorrt_llm/_torch/pyexecutor/grammar_matcher.py at 0fccc5b9 (xgrammar: JSON,
# JSON_SCHEMA, REGEX, EBNF_GRAMMAR, STRUCTURAL_TAG; llguidance: the same but
# STRUCTURAL_TAG, and its EBNF_GRAMMAR is a Lark grammar).
from dataclasses import replace as _replace  # noqa: E402 - kept inside this block

GUIDED_DECODING_BACKENDS = ("xgrammar", "llguidance")
GUIDED_DECODING_PARAMS = Binding(
    "GuidedDecodingParams", keywords=("json", "regex", "grammar", "json_object")
)


def _with_keyword(binding: Binding, keyword: str, before: str | None) -> Binding:
    """``binding`` with ``keyword`` inserted before ``before`` (at the end for ``None``),
    keeping the real parameter order."""
    keywords = list(binding.keywords)
    keywords.insert(keywords.index(before) if before is not None else len(keywords), keyword)
    return _replace(binding, keywords=tuple(keywords))


def _guided(binding: Binding) -> Binding:
    if binding.name == "SamplingParams":
        return _with_keyword(binding, "guided_decoding", before="ignore_eos")
    if binding.name == "LLM":
        return _with_keyword(binding, "guided_decoding_backend", before="enable_iter_perf_stats")
    return binding


LLM_API_BINDINGS = (*map(_guided, LLM_API_BINDINGS), GUIDED_DECODING_PARAMS)
# ---- end of guided decoding -------------------------------------------------------

LLM_API_BY_NAME: dict[str, Binding] = {b.name: b for b in LLM_API_BINDINGS}

# RequestOutput is consumed with ``async for``; these are checked with the attributes.
ASYNC_ITERATION = ("__aiter__", "__anext__")

# ``LLM.generate_async`` keywords the adapter passes: always, and where the release has
# them (``priority``: a float in [0, 1], higher first, default 0.5; a stored llm.py has
# it, llm.py at 4c05a748 does not).
GENERATE_ASYNC_KEYWORDS = ("sampling_params", "streaming")
GENERATE_ASYNC_OPTIONAL = ("priority",)
WAITING_QUEUE_PRIORITY = "PRIORITY"  # the WaitingQueuePolicy member that honours it

# Keys of one ``LLM.get_stats()`` entry the LLM-API executor reads (IterationStats as
# JSON: cpp/tensorrt_llm/executor/jsonSerialization.cpp).
KV_CACHE_STATS_KEY = "kvCacheStats"
KV_CACHE_STATS_FIELDS = ("maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock")


# ======================================================================================
# In-executor scheduling (plugins/trtllm/in_executor): names of TensorRT-LLM's PyTorch
# executor that the in-executor scheduler uses. Private API (not in TensorRT-LLM's
# documented interface), version-gated by in_executor/install.py; checked in the
# container by ``python -m plugins.trtllm.check_names --mode in-executor``. Sources and
# commits: docs/trtllm.md, "In-executor scheduling".
# ======================================================================================


from dataclasses import replace  # noqa: E402 - kept inside this block


@dataclass(frozen=True)
class PrivateNames:
    """Names the in-executor scheduler reads on ``owner`` (a class, or ``""`` for the
    module itself) of ``module``. ``instance``: attributes set per object in
    ``__init__`` (checked live only, on an object)."""

    module: str
    owner: str
    names: tuple[str, ...]
    instance: tuple[str, ...] = ()


IN_EXECUTOR_SCHEDULER_MODULE = "tensorrt_llm._torch.pyexecutor.scheduler"
IN_EXECUTOR_LLM_REQUEST_MODULE = "tensorrt_llm._torch.pyexecutor.llm_request"
IN_EXECUTOR_RESOURCE_MANAGER_MODULE = "tensorrt_llm._torch.pyexecutor.resource_manager"
IN_EXECUTOR_CREATOR_MODULE = "tensorrt_llm._torch.pyexecutor.py_executor_creator"
IN_EXECUTOR_PY_EXECUTOR_MODULE = "tensorrt_llm._torch.pyexecutor.py_executor"
IN_EXECUTOR_FACTORY = "create_py_executor_instance"
# The KV estimation pass runs on TensorRT-LLM's own scheduler (in_executor/install.py).
IN_EXECUTOR_UTIL_MODULE = "tensorrt_llm._torch.pyexecutor._util"
IN_EXECUTOR_KV_CREATOR = "KvCacheCreator"
IN_EXECUTOR_KV_ESTIMATION = "configure_kv_cache_capacity"
# More than one tensor-parallel rank (in_executor/workers.py): the proxy's module global
# that it submits to every MPI worker, and TensorRT-LLM's own, which ours calls there.
IN_EXECUTOR_PROXY_MODULE = "tensorrt_llm.executor.proxy"
IN_EXECUTOR_WORKER_MODULE = "tensorrt_llm.executor.worker"
IN_EXECUTOR_WORKER_MAIN = "worker_main"
# The executor's Distributed (rank 0 decides, the others follow: in_executor/ranks.py).
IN_EXECUTOR_DISTRIBUTED_MODULE = "tensorrt_llm._torch.distributed"

IN_EXECUTOR_NAMES: tuple[PrivateNames, ...] = (
    PrivateNames(IN_EXECUTOR_SCHEDULER_MODULE, "", ("SchedulerOutput", "RequestScheduler")),
    PrivateNames(
        IN_EXECUTOR_SCHEDULER_MODULE, "RequestScheduler", ("schedule_request", "can_schedule")
    ),
    PrivateNames(
        IN_EXECUTOR_LLM_REQUEST_MODULE,
        "LlmRequestState",
        ("CONTEXT_INIT", "GENERATION_IN_PROGRESS", "GENERATION_COMPLETE"),
    ),
    PrivateNames(
        IN_EXECUTOR_LLM_REQUEST_MODULE,
        "LlmRequest",
        (
            "state",
            "get_tokens",
            "get_last_tokens",
            "get_num_tokens",
            "max_new_tokens",
            "context_current_position",
            "context_chunk_size",
        ),
        instance=("py_request_id", "py_client_id"),
    ),
    PrivateNames(IN_EXECUTOR_CREATOR_MODULE, "", (IN_EXECUTOR_FACTORY,)),
    PrivateNames(IN_EXECUTOR_UTIL_MODULE, IN_EXECUTOR_KV_CREATOR, (IN_EXECUTOR_KV_ESTIMATION,)),
    PrivateNames(IN_EXECUTOR_PY_EXECUTOR_MODULE, "PyExecutor", ("_schedule", "_pause_requests")),
    PrivateNames(
        IN_EXECUTOR_PY_EXECUTOR_MODULE,
        "PyExecutor",
        (),
        instance=(
            "scheduler",
            "resource_manager",
            "dist",
            "disable_overlap_scheduler",
            "enable_attention_dp",
            "max_input_len",
        ),
    ),
    PrivateNames(IN_EXECUTOR_RESOURCE_MANAGER_MODULE, "KVCacheManager", ("get_kv_cache_stats",)),
    PrivateNames(IN_EXECUTOR_PROXY_MODULE, "", (IN_EXECUTOR_WORKER_MAIN,)),
    PrivateNames(IN_EXECUTOR_WORKER_MODULE, "", (IN_EXECUTOR_WORKER_MAIN,)),
    PrivateNames(
        IN_EXECUTOR_DISTRIBUTED_MODULE,
        "Distributed",
        ("rank", "tp_size", "pp_size", "cp_size", "broadcast"),
    ),
)

# TorchLlmArgs fields the LLM is built with in this mode only (in_executor/start.py).
IN_EXECUTOR_LLM_OPTIONS = ("disable_overlap_scheduler",)
# The id a request's facts are registered under (RequestOutput.request_id, the client
# id the worker's LlmRequest keeps as py_client_id).
IN_EXECUTOR_REQUEST_OUTPUT = ("request_id",)

# The LLM-API list gains what this mode reads on request outputs (kept here, so the
# list above stays as the other executors use it).
LLM_API_BINDINGS = tuple(
    replace(b, attributes=b.attributes + IN_EXECUTOR_REQUEST_OUTPUT)
    if b.name == "RequestOutput"
    else b
    for b in LLM_API_BINDINGS
)
LLM_API_BY_NAME = {b.name: b for b in LLM_API_BINDINGS}
# ============================================================ end of in-executor names
