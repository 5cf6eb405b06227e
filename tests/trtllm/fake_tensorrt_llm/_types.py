"""Value types of the fake ``tensorrt_llm.bindings.executor``: the subset of each class
that plugins/trtllm/names.py lists, with TensorRT-LLM 1.2.x's names and defaults.

Constructors take the listed keywords by position exactly as far as the real ones do
(``Binding.positional``; beyond that the real order continues with parameters the
adapter does not use, so the fake takes keywords only) and check argument types the way
the C++ bindings do: a wrong type fails here as it would there, and ``None`` is refused
wherever the real parameter is not ``std::optional`` (``Binding.required``).
``__slots__`` keeps every instance to its listed attributes.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from typing import Any

_UINT64_MAX = (1 << 64) - 1
_INT32_MAX = (1 << 31) - 1
# The default of a C++ ``const&`` parameter: a default-constructed object, made per call.
_DEFAULT: Any = object()


def _check(owner: str, name: str, value: Any, *types: type, optional: bool = False) -> None:
    if value is None and optional:
        return
    # bool is an int in Python, not in the bindings.
    if isinstance(value, bool) and bool not in types:
        raise TypeError(f"{owner}(): {name}={value!r} is not {_names(types)}")
    if not isinstance(value, types):
        raise TypeError(f"{owner}(): {name}={value!r} is not {_names(types)}")


def _names(types: Sequence[type]) -> str:
    return " or ".join(t.__name__ for t in types)


def _tokens(owner: str, name: str, value: Any) -> list[int]:
    if not isinstance(value, list | tuple) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    ):
        raise TypeError(f"{owner}(): {name} must be a list of ints, got {value!r}")
    return list(value)


class ModelType(enum.Enum):
    DECODER_ONLY = 0


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


class SchedulerConfig:
    __slots__ = ("capacity_scheduler_policy",)

    def __init__(
        self,
        capacity_scheduler_policy: CapacitySchedulerPolicy = (
            CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        ),
    ) -> None:
        _check(
            "SchedulerConfig",
            "capacity_scheduler_policy",
            capacity_scheduler_policy,
            CapacitySchedulerPolicy,
        )
        self.capacity_scheduler_policy = capacity_scheduler_policy


class KvCacheConfig:
    """``free_gpu_memory_fraction`` is the fifth positional parameter of the real class,
    after two the adapter does not use; the fake takes it by keyword only."""

    __slots__ = ("enable_block_reuse", "free_gpu_memory_fraction", "max_tokens")

    def __init__(
        self,
        enable_block_reuse: bool = True,
        max_tokens: int | None = None,
        *,
        free_gpu_memory_fraction: float | None = None,
    ) -> None:
        _check("KvCacheConfig", "enable_block_reuse", enable_block_reuse, bool)
        _check("KvCacheConfig", "max_tokens", max_tokens, int, optional=True)
        _check(
            "KvCacheConfig",
            "free_gpu_memory_fraction",
            free_gpu_memory_fraction,
            float,
            int,
            optional=True,
        )
        self.enable_block_reuse = enable_block_reuse
        self.max_tokens = max_tokens
        self.free_gpu_memory_fraction = free_gpu_memory_fraction


class ExtendedRuntimePerfKnobConfig:
    """As in 1.2.x, CUDA graph settings are properties, not constructor arguments."""

    __slots__ = ("_cuda_graph_cache_size", "_cuda_graph_mode")

    def __init__(self) -> None:
        self._cuda_graph_mode = False
        self._cuda_graph_cache_size = 0

    @property
    def cuda_graph_mode(self) -> bool:
        return self._cuda_graph_mode

    @cuda_graph_mode.setter
    def cuda_graph_mode(self, value: bool) -> None:
        _check("ExtendedRuntimePerfKnobConfig", "cuda_graph_mode", value, bool)
        self._cuda_graph_mode = value

    @property
    def cuda_graph_cache_size(self) -> int:
        return self._cuda_graph_cache_size

    @cuda_graph_cache_size.setter
    def cuda_graph_cache_size(self, value: int) -> None:
        _check("ExtendedRuntimePerfKnobConfig", "cuda_graph_cache_size", value, int)
        self._cuda_graph_cache_size = value


class OrchestratorConfig:
    __slots__ = ("is_orchestrator", "worker_executable_path")

    def __init__(self, is_orchestrator: bool = True, worker_executable_path: str = "") -> None:
        _check("OrchestratorConfig", "is_orchestrator", is_orchestrator, bool)
        _check("OrchestratorConfig", "worker_executable_path", worker_executable_path, str)
        self.is_orchestrator = is_orchestrator
        self.worker_executable_path = worker_executable_path


class ParallelConfig:
    """``orchestrator_config`` is positional in the real class only after two unused
    parameters (device and participant ids)."""

    __slots__ = ("communication_mode", "communication_type", "orchestrator_config")

    def __init__(
        self,
        communication_type: CommunicationType = CommunicationType.MPI,
        communication_mode: CommunicationMode = CommunicationMode.LEADER,
        *,
        orchestrator_config: OrchestratorConfig | None = None,
    ) -> None:
        _check("ParallelConfig", "communication_type", communication_type, CommunicationType)
        _check("ParallelConfig", "communication_mode", communication_mode, CommunicationMode)
        _check(
            "ParallelConfig",
            "orchestrator_config",
            orchestrator_config,
            OrchestratorConfig,
            optional=True,
        )
        self.communication_type = communication_type
        self.communication_mode = communication_mode
        self.orchestrator_config = orchestrator_config


class ExecutorConfig:
    """The real constructor takes every parameter by position; after the first four the
    fake takes keywords only, because the real order continues with parameters the
    adapter does not use. ``scheduler_config``, ``kv_cache_config`` and
    ``extended_runtime_perf_knob_config`` are ``const&`` parameters: ``None`` is
    refused, a default-constructed object is the default."""

    __slots__ = (
        "enable_chunked_context",
        "extended_runtime_perf_knob_config",
        "kv_cache_config",
        "max_batch_size",
        "max_beam_width",
        "max_num_tokens",
        "parallel_config",
        "scheduler_config",
    )

    def __init__(
        self,
        max_beam_width: int = 1,
        scheduler_config: SchedulerConfig = _DEFAULT,
        kv_cache_config: KvCacheConfig = _DEFAULT,
        enable_chunked_context: bool = False,
        *,
        max_batch_size: int | None = None,
        max_num_tokens: int | None = None,
        parallel_config: ParallelConfig | None = None,
        extended_runtime_perf_knob_config: ExtendedRuntimePerfKnobConfig = _DEFAULT,
    ) -> None:
        owner = "ExecutorConfig"
        scheduler_config = SchedulerConfig() if scheduler_config is _DEFAULT else scheduler_config
        kv_cache_config = KvCacheConfig() if kv_cache_config is _DEFAULT else kv_cache_config
        if extended_runtime_perf_knob_config is _DEFAULT:
            extended_runtime_perf_knob_config = ExtendedRuntimePerfKnobConfig()
        _check(owner, "max_beam_width", max_beam_width, int)
        _check(owner, "scheduler_config", scheduler_config, SchedulerConfig)
        _check(owner, "kv_cache_config", kv_cache_config, KvCacheConfig)
        _check(owner, "enable_chunked_context", enable_chunked_context, bool)
        _check(owner, "max_batch_size", max_batch_size, int, optional=True)
        _check(owner, "max_num_tokens", max_num_tokens, int, optional=True)
        _check(owner, "parallel_config", parallel_config, ParallelConfig, optional=True)
        _check(
            owner,
            "extended_runtime_perf_knob_config",
            extended_runtime_perf_knob_config,
            ExtendedRuntimePerfKnobConfig,
        )
        self.max_beam_width = max_beam_width
        self.scheduler_config = scheduler_config
        self.kv_cache_config = kv_cache_config
        self.enable_chunked_context = enable_chunked_context
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.parallel_config = parallel_config
        self.extended_runtime_perf_knob_config = extended_runtime_perf_knob_config


class SamplingConfig:
    """Unset fields take the C++ defaults: top_k 0 (all tokens), top_p 0, temperature 1,
    seed 0. As in the real class, only ``beam_width`` is positional."""

    __slots__ = ("beam_width", "seed", "temperature", "top_k", "top_p")

    def __init__(
        self,
        beam_width: int = 1,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        temperature: float | None = None,
    ) -> None:
        owner = "SamplingConfig"
        _check(owner, "beam_width", beam_width, int)
        _check(owner, "top_k", top_k, int, optional=True)
        _check(owner, "top_p", top_p, float, int, optional=True)
        _check(owner, "seed", seed, int, optional=True)
        _check(owner, "temperature", temperature, float, int, optional=True)
        if seed is not None and not 0 <= seed <= _UINT64_MAX:
            raise TypeError(f"{owner}(): seed={seed} does not fit an unsigned 64-bit integer")
        if beam_width != 1:
            raise ValueError("the fake executor decodes with beam width 1 only")
        self.beam_width = beam_width
        self.top_k = top_k
        self.top_p = top_p
        self.seed = seed
        self.temperature = temperature


class OutputConfig:
    """Every parameter of the real constructor is an optional bool (``None``: false);
    ``exclude_input_from_output`` is its fourth, after two the adapter does not use."""

    __slots__ = ("exclude_input_from_output", "return_log_probs")

    def __init__(
        self,
        return_log_probs: bool | None = None,
        *,
        exclude_input_from_output: bool | None = None,
    ) -> None:
        _check("OutputConfig", "return_log_probs", return_log_probs, bool, optional=True)
        _check(
            "OutputConfig",
            "exclude_input_from_output",
            exclude_input_from_output,
            bool,
            optional=True,
        )
        self.return_log_probs = bool(return_log_probs)
        self.exclude_input_from_output = bool(exclude_input_from_output)


class Request:
    """As in the real class, ``input_token_ids`` and ``max_tokens`` are positional and
    the rest keyword-only; ``sampling_config`` and ``output_config`` are ``const&``
    parameters (``None`` refused, a default-constructed object is the default)."""

    __slots__ = (
        "end_id",
        "input_token_ids",
        "max_tokens",
        "output_config",
        "pad_id",
        "sampling_config",
        "stop_words",
        "streaming",
    )

    def __init__(
        self,
        input_token_ids: list[int],
        max_tokens: int,
        *,
        streaming: bool = False,
        sampling_config: SamplingConfig = _DEFAULT,
        output_config: OutputConfig = _DEFAULT,
        end_id: int | None = None,
        pad_id: int | None = None,
        stop_words: list[list[int]] | None = None,
    ) -> None:
        owner = "Request"
        sampling_config = SamplingConfig() if sampling_config is _DEFAULT else sampling_config
        output_config = OutputConfig() if output_config is _DEFAULT else output_config
        self.input_token_ids = _tokens(owner, "input_token_ids", input_token_ids)
        _check(owner, "max_tokens", max_tokens, int)
        if not -_INT32_MAX <= max_tokens <= _INT32_MAX:
            raise TypeError(f"{owner}(): max_tokens={max_tokens} does not fit a 32-bit integer")
        _check(owner, "streaming", streaming, bool)
        _check(owner, "sampling_config", sampling_config, SamplingConfig)
        _check(owner, "output_config", output_config, OutputConfig)
        _check(owner, "end_id", end_id, int, optional=True)
        _check(owner, "pad_id", pad_id, int, optional=True)
        if stop_words is not None:
            if not isinstance(stop_words, list):
                raise TypeError(f"{owner}(): stop_words must be a list of token lists")
            stop_words = [_tokens(owner, "stop_words", w) for w in stop_words]
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.sampling_config = sampling_config
        self.output_config = output_config
        self.end_id = end_id
        self.pad_id = pad_id
        self.stop_words = stop_words


class Result:
    __slots__ = ("finish_reasons", "is_final", "log_probs", "output_token_ids")

    def __init__(self) -> None:
        self.is_final = False
        self.output_token_ids: list[list[int]] = []
        self.log_probs: list[list[float]] | None = None
        self.finish_reasons: list[FinishReason] = []


class Response:
    """Either a result or an error message; reading the other raises, as in C++."""

    __slots__ = ("_error", "_request_id", "_result")
    _request_id: int
    _result: Result | None
    _error: str | None

    def __init__(self) -> None:
        raise TypeError("Response objects come from Executor.await_responses()")

    @classmethod
    def _make(cls, request_id: int, result: Result | None, error: str | None) -> Response:
        response = object.__new__(cls)
        response._request_id = request_id
        response._result = result
        response._error = error
        return response

    @property
    def request_id(self) -> int:
        return self._request_id

    def has_error(self) -> bool:
        return self._error is not None

    @property
    def error_msg(self) -> str:
        if self._error is None:
            raise RuntimeError("Cannot get the error message of a response without an error")
        return self._error

    @property
    def result(self) -> Result:
        if self._result is None:
            raise RuntimeError(f"Cannot get the result of a response with an error: {self._error}")
        return self._result


class KvCacheStats:
    __slots__ = ("free_num_blocks", "max_num_blocks", "tokens_per_block", "used_num_blocks")

    def __init__(self) -> None:
        self.max_num_blocks = 0
        self.free_num_blocks = 0
        self.used_num_blocks = 0
        self.tokens_per_block = 0


class IterationStats:
    __slots__ = ("kv_cache_stats",)

    def __init__(self) -> None:
        self.kv_cache_stats: KvCacheStats | None = None


def model_path_arg(value: Any) -> str:
    """``std::filesystem::path`` accepts ``str`` and path-like objects."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"Executor(): model_path={value!r} is not a path")
    return os.fspath(value)
