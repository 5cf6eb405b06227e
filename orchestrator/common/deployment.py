"""A simulated deployment: which model on which GPUs, in which precision, with which
runtime costs. It is the ``sim`` executor's options record (``executor: {type: sim,
...}``) and what the planner, the report and calibration reason about, so they share
one record without reaching into the executor.

Importable without anything heavy, so config files validate on any machine.
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator, model_validator

from orchestrator.common.capacity import DEFAULT_RUNTIME_RESERVE_BYTES, CapacityPlan, capacity_plan
from orchestrator.common.cost_model import CostModel
from orchestrator.common.specs import DType, GPUSpec, ModelSpec, load_gpu_spec, load_model_spec
from orchestrator.core import CacheConfig, SchedulerConfig, StrictModel


class DoesNotFitError(ValueError):
    """The weights and the workspace leave no room for a KV cache on the GPUs given."""


class Deployment(StrictModel):
    """One replica of ``model`` on ``tp`` GPUs of kind ``hardware``.

    ``model`` and ``hardware`` are names from ``configs/models/`` and
    ``configs/hardware/`` (e.g. ``llama3-70b``, ``h100-sxm``) or paths to YAML files of
    the same shape (``orchestrator calibrate`` writes one for the local machine).
    ``tp`` GPUs hold one replica, each a ``1/tp`` slice of the weights and KV heads.
    ``kv_memory_fraction`` is the share of the memory left after the weights and the
    workspace that the KV cache takes (TensorRT-LLM's
    ``kv_cache_free_gpu_memory_fraction``); ``runtime_reserve_bytes`` is the part of
    the workspace that does not scale with the batch (CUDA context, NCCL, cuBLAS, CUDA
    graphs; bytes per GPU, the engine builder's default). See
    ``orchestrator/common/capacity.py`` for the whole accounting. ``step_overhead_s`` is
    the fixed cost of one step (kernel launches, scheduling, sampling) in seconds;
    ``allreduce_latency_s`` is the fixed cost of one tensor-parallel all-reduce in
    seconds. ``attention_efficiency`` is the attention kernels' achieved share of the
    hardware's (already derated) peaks, relative to the dense kernels';
    ``orchestrator calibrate`` fits it.
    """

    model: str = "llama3-70b"
    hardware: str = "h100-sxm"
    weight_dtype: DType = "bf16"
    kv_dtype: DType = "bf16"
    tp: int = Field(1, ge=1)
    kv_memory_fraction: float = Field(0.9, gt=0, le=1)
    runtime_reserve_bytes: int = Field(DEFAULT_RUNTIME_RESERVE_BYTES, ge=0)
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
    def _tp_divides_heads(self) -> Deployment:
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

    @property
    def activation_dtype(self) -> DType:
        """What the unquantised parts (norms, embedding, LM head) are stored in: the
        weight dtype itself, or BF16 under FP8/INT8 weights (quantisation leaves them
        alone)."""
        return "bf16" if self.weight_dtype in ("fp8", "int8") else self.weight_dtype

    def cost_model(self) -> CostModel:
        """The roofline model of one step of this replica."""
        return CostModel(
            self.model_spec(),
            self.gpu_spec(),
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            tp=self.tp,
            step_overhead_s=self.step_overhead_s,
            allreduce_latency_s=self.allreduce_latency_s,
            attention_efficiency=self.attention_efficiency,
        )

    def capacity(self, scheduler: SchedulerConfig, block_size: int) -> CapacityPlan:
        """Per-GPU memory of this replica with the workspace sized for ``scheduler``'s
        step (``max_num_tokens``, ``max_batch_size``) and KV blocks of ``block_size``
        tokens. Raises ``DoesNotFitError`` when weights and workspace fill the GPU."""
        model, gpu = self.model_spec(), self.gpu_spec()
        plan = capacity_plan(
            model,
            gpu,
            weight_dtype=self.weight_dtype,
            kv_dtype=self.kv_dtype,
            activation_dtype=self.activation_dtype,
            kv_memory_fraction=self.kv_memory_fraction,
            tokens_per_block=block_size,
            max_num_tokens=scheduler.max_num_tokens,
            max_batch_size=scheduler.max_batch_size,
            tp=self.tp,
            runtime_reserve_bytes=self.runtime_reserve_bytes,
        )
        if not plan.fits:
            raise DoesNotFitError(
                f"{model.name} in {self.weight_dtype} needs {plan.weight_bytes / 1e9:.1f} GB "
                f"of weights and {plan.workspace_bytes / 1e9:.1f} GB of workspace per GPU at "
                f"tp={self.tp}, more than the {gpu.memory_bytes / 1e9:.0f} GB of {gpu.name}; "
                "use a larger tp or a smaller weight dtype"
            )
        return plan

    def decode_ceiling(
        self,
        scheduler: SchedulerConfig,
        cache: CacheConfig,
        mean_prompt_len: float,
        mean_output_len: float,
    ) -> float:
        """Output tokens/s of one replica decoding a full batch: as many requests as
        ``max_batch_size`` and the KV pool allow (each holding its whole prompt plus
        output, in blocks of ``cache.block_size``), half-way through their outputs.
        Prefill is left out, so real schedules of this workload stay below it. The pool
        is the capacity plan's, or ``cache.num_blocks`` where that is smaller, as the
        engine runs it."""
        capacity = self.capacity(scheduler, cache.block_size)
        blocks = min(capacity.kv_blocks, cache.num_blocks or capacity.kv_blocks)
        per_sequence = capacity.blocks_for(math.ceil(mean_prompt_len + mean_output_len))
        batch = max(1, min(scheduler.max_batch_size, blocks // per_sequence))
        return self.cost_model().decode_tokens_per_s(
            batch, round(mean_prompt_len + mean_output_len / 2)
        )
