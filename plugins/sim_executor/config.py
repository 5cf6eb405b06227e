"""Options of the ``sim`` executor, as written under ``executor:`` in a config file.

Importable without anything heavy, so config files validate on any machine.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from orchestrator.common.specs import DType, GPUSpec, ModelSpec, load_gpu_spec, load_model_spec
from orchestrator.core import StrictModel


class SimExecutorConfig(StrictModel):
    """A simulated deployment: which model on which GPUs, in which precision.

    ``model`` and ``hardware`` are names from ``configs/models/`` and
    ``configs/hardware/`` (e.g. ``llama3-70b``, ``h100-sxm``) or paths to YAML files of
    the same shape (``orchestrator calibrate`` writes one for the local machine).
    ``tp`` GPUs hold one replica, each a ``1/tp`` slice of the weights and KV heads.
    ``kv_memory_fraction`` is the share of the memory left after the weights that the
    KV cache takes (TensorRT-LLM's ``kv_cache_free_gpu_memory_fraction``); the rest
    covers activations and the runtime. ``step_overhead_s`` is the fixed cost of one
    step (kernel launches, scheduling, sampling) in seconds; ``allreduce_latency_s`` is
    the fixed cost of one tensor-parallel all-reduce in seconds. ``attention_efficiency``
    is the attention kernels' achieved share of the hardware's (already derated) peaks,
    relative to the dense kernels'; ``orchestrator calibrate`` fits it.
    """

    model: str = "llama3-70b"
    hardware: str = "h100-sxm"
    weight_dtype: DType = "bf16"
    kv_dtype: DType = "bf16"
    tp: int = Field(1, ge=1)
    kv_memory_fraction: float = Field(0.9, gt=0, le=1)
    step_overhead_s: float = Field(0.5e-3, ge=0)
    allreduce_latency_s: float = Field(5e-6, ge=0)
    attention_efficiency: float = Field(1.0, gt=0, le=1.5)

    @field_validator("model")
    @classmethod
    def _model_exists(cls, value: str) -> str:
        load_model_spec(value)
        return value

    @field_validator("hardware")
    @classmethod
    def _hardware_exists(cls, value: str) -> str:
        load_gpu_spec(value)
        return value

    @model_validator(mode="after")
    def _tp_divides_heads(self) -> SimExecutorConfig:
        spec = self.model_spec()
        if spec.num_heads % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide the {spec.num_heads} attention heads of {spec.name}"
            )
        kv = spec.num_kv_heads
        if kv % self.tp and self.tp % kv:
            raise ValueError(
                f"tp={self.tp} neither divides nor is a multiple of the {kv} KV heads of "
                f"{spec.name}"
            )
        return self

    def model_spec(self) -> ModelSpec:
        return load_model_spec(self.model)

    def gpu_spec(self) -> GPUSpec:
        return load_gpu_spec(self.hardware)
