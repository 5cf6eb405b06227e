"""Per-GPU capacity of a build, computed before anything runs.

The accounting is the shared capacity model's (``orchestrator/common/capacity.py``, where
the reasoning from TensorRT-LLM's sources is written out); this module maps a build spec
onto it and adds what only a build knows: the sequence limits the plan is checked
against. The figures are estimates with stated assumptions, so that an impossible batch
size is caught on a laptop rather than after a 40-minute build.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from build_engines.spec import BuildSpec
from orchestrator.common.capacity import CapacityPlan, capacity_plan
from orchestrator.common.specs import DType, GPUSpec, ModelSpec, load_gpu_spec, load_model_spec

_ACTIVATION_DTYPE: dict[str, DType] = {"bfloat16": "bf16", "float16": "fp16"}


@dataclass(frozen=True, slots=True)
class BuildCapacity(CapacityPlan):
    """A build's capacity plan with the limits it is checked against: ``max_seq_len``
    (tokens, prompt plus output), ``typical_context_len`` (tokens, what the batch is
    sized for) and ``max_batch_size`` (sequences)."""

    max_seq_len: int
    typical_context_len: int
    max_batch_size: int

    @property
    def sequences_at_max_seq_len(self) -> int:
        return self.sequences_at(self.max_seq_len)

    @property
    def sequences_at_typical_context(self) -> int:
        return self.sequences_at(self.typical_context_len)


def build_capacity(
    spec: BuildSpec, model: ModelSpec, gpu: GPUSpec, *, kv_memory_fraction: float | None = None
) -> CapacityPlan:
    """The shared capacity plan of ``spec`` on ``gpu``: its dtypes, TP x PP layout, KV
    block size, step limits, runtime reserve and KV fraction (``kv_memory_fraction``
    overrides the spec's ``runtime.kv_cache_free_gpu_memory_fraction``, as a run-time
    option does)."""
    fraction = (
        spec.runtime.kv_cache_free_gpu_memory_fraction
        if kv_memory_fraction is None
        else kv_memory_fraction
    )
    return capacity_plan(
        model,
        gpu,
        weight_dtype=spec.quantization.weights,
        kv_dtype=spec.quantization.kv_cache,
        activation_dtype=_ACTIVATION_DTYPE[spec.model.dtype],
        kv_memory_fraction=fraction,
        tokens_per_block=spec.limits.tokens_per_block,
        max_num_tokens=spec.limits.max_num_tokens,
        max_batch_size=spec.limits.max_batch_size,
        tp=spec.parallelism.tp,
        pp=spec.parallelism.pp,
        runtime_reserve_bytes=spec.memory.runtime_reserve_bytes,
    )


def plan_memory(spec: BuildSpec, model: ModelSpec, gpu: GPUSpec) -> BuildCapacity:
    """The capacity plan ``build-engines plan`` prints and validates for ``spec``."""
    plan = build_capacity(spec, model, gpu)
    return BuildCapacity(
        **{f.name: getattr(plan, f.name) for f in fields(plan)},
        max_seq_len=spec.limits.max_seq_len,
        typical_context_len=spec.memory.typical_context_len,
        max_batch_size=spec.limits.max_batch_size,
    )


def expected_capacity(
    spec_data: Mapping[str, Any], *, kv_memory_fraction: float | None = None
) -> CapacityPlan:
    """What a built artefact's KV cache should hold, from the spec its manifest records
    (``Manifest.spec``) and the model and GPU specs that spec names; for a server to
    compare with the KV capacity the runtime reports. ``kv_memory_fraction`` is the
    run-time fraction where it overrides the build's. Raises ``pydantic.ValidationError``
    for a spec that does not validate and ``ValueError`` for an unknown model or GPU name.
    """
    spec = BuildSpec.model_validate(dict(spec_data))
    model, gpu = load_model_spec(spec.model.spec), load_gpu_spec(spec.target.gpu)
    return build_capacity(spec, model, gpu, kv_memory_fraction=kv_memory_fraction)
