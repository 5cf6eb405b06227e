"""The build spec: one YAML file that describes a TensorRT-LLM build end to end.

A spec names the model dimensions (``model.spec``, a file under ``configs/models/``) and
the target GPU (``target.gpu``, a file under ``configs/hardware/``) instead of copying
them, so the planner, the simulator and the builder read one source. Every section
forbids unknown keys; errors name the file and the dotted key.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field

from orchestrator.common.build_manifest import Backend, KVCacheDType
from orchestrator.common.specs import GPUSpec, ModelSpec, load_gpu_spec, load_model_spec
from orchestrator.core import ConfigError, StrictModel, load_yaml

WeightDType = Literal["fp8", "bf16", "fp16"]
ActivationDType = Literal["bfloat16", "float16"]
CapacitySchedulerPolicy = Literal["MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"]

_COMMIT_HASH = re.compile(r"^[0-9a-f]{40}$")


class ModelSection(StrictModel):
    """Which checkpoint to build from.

    ``spec`` names the dimensions file (``configs/models/<spec>.yaml``). ``source`` is a
    Hugging Face Hub repo id (``owner/name``) or a local folder (a path starting with
    ``/``, ``.`` or ``~``). ``revision`` pins the Hub commit; ``dtype`` is the precision
    of everything that is not quantised (embedding, LM head, norms, activations).
    """

    spec: str
    source: str
    revision: str | None = None
    dtype: ActivationDType = "bfloat16"

    @property
    def is_local(self) -> bool:
        return self.source.startswith(("/", ".", "~"))

    @property
    def revision_is_commit(self) -> bool:
        return self.revision is not None and bool(_COMMIT_HASH.match(self.revision))


class QuantizationSection(StrictModel):
    """Weight and KV cache precision; calibration data for the FP8/INT8 scales.

    ``calib_size`` is a number of samples of ``calib_dataset`` (a Hugging Face dataset name
    or a local folder), used only when something is quantised.
    """

    weights: WeightDType = "fp8"
    kv_cache: KVCacheDType = "fp8"
    calib_dataset: str = "cnn_dailymail"
    calib_size: int = Field(512, ge=1)

    @property
    def needs_calibration(self) -> bool:
        return self.weights == "fp8" or self.kv_cache in ("fp8", "int8")


class ParallelismSection(StrictModel):
    """Tensor and pipeline parallel sizes; the engine needs ``tp * pp`` GPUs."""

    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


class LimitsSection(StrictModel):
    """Shape limits compiled into the engine (all in tokens, except the batch size in
    sequences). ``tokens_per_block`` is the paged KV cache block size."""

    max_batch_size: int = Field(ge=1)
    max_num_tokens: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_seq_len: int = Field(ge=1)
    tokens_per_block: int = Field(32, ge=1)


class PluginSection(StrictModel):
    """``trtllm-build`` plugin and feature switches (engine backend only). Each is passed
    explicitly, so a changed ``trtllm-build`` default cannot change the engine."""

    kv_cache_type: Literal["paged", "continuous"] = "paged"
    context_fmha: bool = True
    use_paged_context_fmha: bool = True
    use_fp8_context_fmha: bool = True
    multiple_profiles: bool = True
    reduce_fusion: bool = False
    user_buffer: bool = False
    norm_quant_fusion: bool = False


class RuntimeSection(StrictModel):
    """Run-time settings that ship with the artefact (written to its LLM-API options file
    and to the manifest).

    ``cuda_graph_cache_size`` (graphs kept) is for the engine backend;
    ``cuda_graph_batch_sizes`` and ``cuda_graph_padding`` are for the PyTorch backend.
    ``kv_cache_free_gpu_memory_fraction`` is the share of the memory left after weights
    and runtime buffers that the KV cache takes.
    """

    cuda_graphs: bool = True
    cuda_graph_cache_size: int | None = Field(None, ge=0)
    cuda_graph_batch_sizes: list[int] | None = Field(None, min_length=1)
    cuda_graph_padding: bool | None = None
    kv_cache_free_gpu_memory_fraction: float = Field(0.9, gt=0, le=1)
    enable_chunked_context: bool = True
    enable_block_reuse: bool = True
    capacity_scheduler_policy: CapacitySchedulerPolicy = "GUARANTEED_NO_EVICT"


class TargetSection(StrictModel):
    """The GPU the engine is built for (``configs/hardware/<gpu>.yaml``). Engines only
    run on the GPU architecture they were built on."""

    gpu: str


class MemorySection(StrictModel):
    """Inputs of the memory plan that are estimates, not engine settings.

    ``typical_context_len`` (tokens) is the prompt-plus-output length the batch size is
    sized for; ``runtime_reserve_bytes`` covers the CUDA context, NCCL and all-reduce
    buffers, cuBLAS workspaces and CUDA graphs.
    """

    typical_context_len: int = Field(2048, ge=1)
    runtime_reserve_bytes: int = Field(2_000_000_000, ge=0)


class BuildSpec(StrictModel):
    """One build: checkpoint -> quantised checkpoint -> engine (or LLM-API options)."""

    name: str
    backend: Backend = "engine"
    model: ModelSection
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)
    parallelism: ParallelismSection = Field(default_factory=ParallelismSection)
    limits: LimitsSection
    plugins: PluginSection | None = None
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)
    target: TargetSection
    memory: MemorySection = Field(default_factory=MemorySection)
    output_dir: Path

    @property
    def engine_plugins(self) -> PluginSection:
        """The plugin switches ``trtllm-build`` gets (defaults where the spec has none)."""
        return self.plugins if self.plugins is not None else PluginSection()

    @property
    def spec_hash(self) -> str:
        """Hash of everything that shapes the artefact (the output location excluded)."""
        return content_hash(self.model_dump(mode="json", exclude={"output_dir"}))


def content_hash(data: Any) -> str:
    """SHA-256 (hex) of ``data`` as canonical JSON."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class LoadedSpec:
    """A build spec with the model and GPU specs it names. ``backend_given``: the file
    set ``backend`` (else it took the default it was loaded with)."""

    spec: BuildSpec
    model: ModelSpec
    gpu: GPUSpec
    path: Path
    backend_given: bool = True


def load_build_spec(path: str | Path, *, default_backend: Backend = "engine") -> LoadedSpec:
    """Read a build spec and the model/GPU specs it names; a spec without ``backend``
    takes ``default_backend``.

    Raises ``ConfigError`` naming the file and key for any invalid or unknown value.
    """
    path = Path(path)
    spec = load_yaml(path, BuildSpec)
    given = "backend" in spec.model_fields_set
    if not given:
        spec = spec.model_copy(update={"backend": default_backend})
    model = _load_named(path, "model.spec", load_model_spec, spec.model.spec)
    gpu = _load_named(path, "target.gpu", load_gpu_spec, spec.target.gpu)
    return LoadedSpec(spec, model, gpu, path, given)


T = TypeVar("T")


def _load_named(path: Path, key: str, loader: Callable[[str], T], name: str) -> T:
    try:
        return loader(name)
    except ConfigError:
        raise  # already names its own file and key
    except ValueError as err:  # an unknown name: say which key of which file holds it
        raise ConfigError(f"{path}: {key}: {err}") from None
