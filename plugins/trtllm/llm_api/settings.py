"""What the LLM-API executor starts ``tensorrt_llm.LLM`` with: a build's manifest (or the
defaults, for a model given directly), overridden by run-time options. Nothing here
imports TensorRT-LLM."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from orchestrator.core import ConfigError, EngineConfig
from plugins.trtllm.in_executor.settings import InExecutorCore
from plugins.trtllm.llm_api.config import TrtllmLlmApiConfig
from plugins.trtllm.names import CAPACITY_SCHEDULER_POLICIES
from plugins.trtllm.settings import artifact_path, pick, read_manifest


@dataclass(frozen=True)
class CudaGraphs:
    """CUDA graphs for the decode batch sizes ``batch_sizes``, or for every size up to
    ``max_batch_size`` (sequences) when that is ``None``; ``padding`` rounds a batch up
    to the next captured size."""

    batch_sizes: tuple[int, ...] | None
    max_batch_size: int | None
    padding: bool


@dataclass(frozen=True)
class LlmApiSettings:
    """Everything ``LLM`` is built from. ``model`` is a checkpoint folder or a Hub id.
    Limits are in tokens (sequences for ``max_batch_size``); ``None`` leaves a limit to
    TensorRT-LLM (the model's own). ``cuda_graphs`` ``None`` turns graphs off.
    ``in_executor``: set when our scheduler also runs inside TensorRT-LLM's loop."""

    model: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    tokens_per_block: int
    kv_cache_dtype: str
    kv_cache_free_gpu_memory_fraction: float
    enable_block_reuse: bool
    max_batch_size: int
    max_num_tokens: int
    max_input_len: int | None
    max_seq_len: int | None
    enable_chunked_prefill: bool
    cuda_graphs: CudaGraphs | None
    capacity_scheduler_policy: str
    in_executor: InExecutorCore | None = None
    # TensorRT-LLM's grammar backend (``names.GUIDED_DECODING_BACKENDS``), or None: none.
    guided_decoding_backend: str | None = None

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


# A model given directly, without a build: TorchLlmArgs-shaped, as a build writes them.
DEFAULT_OPTIONS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "max_batch_size": 256,
    "max_num_tokens": 8192,
    "max_input_len": None,
    "max_seq_len": None,
    "enable_chunked_prefill": True,
    "kv_cache_config": {
        "free_gpu_memory_fraction": 0.9,
        "enable_block_reuse": True,
        "dtype": "auto",
        "tokens_per_block": 32,
    },
    "scheduler_config": {"capacity_scheduler_policy": "GUARANTEED_NO_EVICT"},
    # No maximum of its own: graphs are captured up to max_batch_size (_cuda_graphs).
    "cuda_graph_config": {"enable_padding": True},
}


def load_settings(config: TrtllmLlmApiConfig) -> LlmApiSettings:
    """Resolve ``config``: read the build's manifest (``build_dir``) or take the defaults
    (``model``), then apply the options set. Raises ``ConfigError`` naming the file and
    key when the folder holds no verified ``backend: pytorch`` manifest, its checkpoint
    is missing, or a value is not one TensorRT-LLM takes."""
    if config.build_dir is not None:
        build_dir = config.build_dir.expanduser()
        manifest, manifest_path = read_manifest(build_dir)
        if manifest.serving.backend != "pytorch":
            raise ConfigError(
                f"{manifest_path}: serving.backend is {manifest.serving.backend!r}; the "
                "trtllm-llmapi executor runs PyTorch-backend builds (backend: pytorch); "
                "serve an engine with type: trtllm"
            )
        model = str(artifact_path(build_dir, manifest, manifest_path))
        options, source = manifest.llm_api_options, manifest_path
    else:
        assert config.model is not None  # the config's validator guarantees one source
        model, options, source = config.model, DEFAULT_OPTIONS, None

    def get(override: Any, dotted: str) -> Any:
        if source is None:
            return override if override is not None else _default(dotted)
        return pick(override, options, dotted, source)

    policy = get(config.capacity_scheduler_policy, "scheduler_config.capacity_scheduler_policy")
    if policy not in CAPACITY_SCHEDULER_POLICIES:
        raise ConfigError(
            f"{source}: llm_api_options.scheduler_config.capacity_scheduler_policy: "
            f"{policy!r} is not one of {', '.join(CAPACITY_SCHEDULER_POLICIES)}"
        )
    max_batch_size = get(config.max_batch_size, "max_batch_size")
    max_seq_len = get(config.max_seq_len, "max_seq_len")
    return LlmApiSettings(
        model=model,
        tensor_parallel_size=get(config.tensor_parallel_size, "tensor_parallel_size"),
        pipeline_parallel_size=get(config.pipeline_parallel_size, "pipeline_parallel_size"),
        tokens_per_block=get(config.tokens_per_block, "kv_cache_config.tokens_per_block"),
        kv_cache_dtype=get(config.kv_cache_dtype, "kv_cache_config.dtype"),
        kv_cache_free_gpu_memory_fraction=get(
            config.kv_cache_free_gpu_memory_fraction, "kv_cache_config.free_gpu_memory_fraction"
        ),
        enable_block_reuse=get(config.enable_block_reuse, "kv_cache_config.enable_block_reuse"),
        max_batch_size=max_batch_size,
        max_num_tokens=get(config.max_num_tokens, "max_num_tokens"),
        # Unset here, TensorRT-LLM would apply its own default input limit (1024, below
        # most prompts we serve); the input may use the whole sequence instead, and
        # with_model_len fills it from the engine config when no sequence length is set.
        max_input_len=get(config.max_input_len, "max_input_len") or max_seq_len,
        max_seq_len=max_seq_len,
        enable_chunked_prefill=get(config.enable_chunked_prefill, "enable_chunked_prefill"),
        cuda_graphs=_cuda_graphs(config, options, max_batch_size),
        capacity_scheduler_policy=policy,
        guided_decoding_backend=config.guided_decoding_backend,
    )


def _default(dotted: str) -> Any:
    value: Any = DEFAULT_OPTIONS
    for part in dotted.split("."):
        value = value[part]
    return value


def _cuda_graphs(
    config: TrtllmLlmApiConfig, options: dict[str, Any], max_batch_size: int
) -> CudaGraphs | None:
    """The build's CUDA graph section (``None`` there turns graphs off), with the
    options' overrides. Batch sizes, when given, replace the build's maximum: newer
    releases derive the maximum from them and refuse a different one."""
    if config.cuda_graphs is False:
        return None
    built = options.get("cuda_graph_config")
    if built is None and config.cuda_graphs is None and config.cuda_graph_batch_sizes is None:
        return None
    built = built or {}
    sizes = config.cuda_graph_batch_sizes or built.get("batch_sizes")
    padding = config.cuda_graph_padding
    if padding is None:
        padding = bool(built.get("enable_padding", True))
    if sizes:
        return CudaGraphs(tuple(sorted(sizes)), None, padding)
    # A graph for a batch larger than TensorRT-LLM may run would only cost memory.
    built_max = int(built.get("max_batch_size") or max_batch_size)
    return CudaGraphs(None, min(built_max, max_batch_size), padding)


def with_model_len(settings: LlmApiSettings, engine: EngineConfig) -> LlmApiSettings:
    """Settings whose input limit is never left to TensorRT-LLM's default (1024 tokens,
    to which its own pausing also truncates a paused request): unset, it becomes
    ``model.max_model_len``. Raises ``ConfigError`` when neither is known."""
    if settings.max_input_len is not None:
        return settings
    model_len = engine.model.max_model_len
    if model_len is None:
        raise ConfigError(
            f"set model.max_model_len (or the executor's max_input_len or max_seq_len) for "
            f"{settings.model}: TensorRT-LLM would otherwise cap every input at 1024 tokens"
        )
    return replace(settings, max_input_len=model_len)


def check_engine_config(settings: LlmApiSettings, engine: EngineConfig) -> None:
    """Refuse an engine config our scheduler could not honour on this executor: KV blocks
    of another size than TensorRT-LLM's, or more sequences per step than it batches."""
    if engine.cache.block_size != settings.tokens_per_block:
        raise ConfigError(
            f"cache.block_size is {engine.cache.block_size} but TensorRT-LLM's KV blocks for "
            f"{settings.model} hold {settings.tokens_per_block} tokens; set cache.block_size: "
            f"{settings.tokens_per_block} (or the executor's tokens_per_block)"
        )
    if engine.scheduler.max_batch_size > settings.max_batch_size:
        raise ConfigError(
            f"scheduler.max_batch_size is {engine.scheduler.max_batch_size} but TensorRT-LLM "
            f"is started for at most {settings.max_batch_size} sequences (max_batch_size)"
        )


def with_scheduling(
    settings: LlmApiSettings, config: TrtllmLlmApiConfig, engine: EngineConfig
) -> LlmApiSettings:
    """Settings for ``config.scheduling``: unchanged for ``front``; for ``in_executor``,
    the core the worker builds, KV block reuse off (TensorRT-LLM's reuse moves a
    request's context position after our plan is made, so the core's chunk would start
    at the wrong token), chunked prefill on (the core's chunks) and ``max_seq_len`` set to the core's context limit (tokens).
    Raises ``ConfigError`` for more than one pipeline-parallel rank
    (``in_executor.install.check_executor`` says why; tensor parallelism is fine: rank
    0 decides, the others follow), for guided decoding (a paused constrained request
    would restart its grammar) and for a core step budget above TensorRT-LLM's
    ``max_num_tokens``."""
    if config.scheduling == "front":
        return settings
    if settings.pipeline_parallel_size > 1:
        raise ConfigError(
            "executor.scheduling: in_executor runs on one pipeline-parallel rank; "
            f"{settings.model} is set for pipeline_parallel_size "
            f"{settings.pipeline_parallel_size}. Remove executor.scheduling "
            "(TensorRT-LLM's own scheduler then runs under ours)"
        )
    if settings.guided_decoding_backend is not None:
        # TensorRT-LLM's guided decoder builds a fresh grammar matcher for a request on
        # its last context chunk (guided_decoder.py: require_matcher_init); a request the
        # core pauses comes back as a context request, so its grammar would restart in
        # the middle of its output.
        raise ConfigError(
            "executor.scheduling: in_executor cannot run with guided_decoding_backend: a "
            "constrained request paused inside TensorRT-LLM's loop would restart its "
            "grammar. Remove executor.scheduling (TensorRT-LLM's own scheduler then runs "
            "under ours), or guided_decoding_backend"
        )
    if engine.scheduler.max_num_tokens > settings.max_num_tokens:
        # TensorRT-LLM's model engine asserts total_num_tokens <= max_num_tokens in the
        # forward pass and answers the error by failing every active request.
        raise ConfigError(
            f"executor.scheduling: in_executor: scheduler.max_num_tokens is "
            f"{engine.scheduler.max_num_tokens} but TensorRT-LLM runs at most "
            f"{settings.max_num_tokens} tokens per iteration (max_num_tokens) for "
            f"{settings.model}; lower scheduler.max_num_tokens or raise the executor's"
        )
    model_len = settings.max_seq_len or engine.model.max_model_len or settings.max_input_len
    assert model_len is not None  # with_model_len always sets max_input_len
    return replace(
        settings,
        enable_block_reuse=False,
        # The core prefills prompts in chunks; without chunked prefill TensorRT-LLM's
        # executor has no context-chunking config (py_executor_creator: ctx_chunk_config
        # only with enable_chunked_prefill) and a later chunk's attention is not set up
        # to read the earlier chunks' KV from the paged cache.
        enable_chunked_prefill=True,
        # Unset, TensorRT-LLM takes the model's own length, which may exceed the core's
        # limit: requests (and the KV estimation's dummies) it accepts, ours would refuse.
        max_seq_len=model_len,
        in_executor=InExecutorCore(engine, model_len, settings.tensor_parallel_size),
    )
