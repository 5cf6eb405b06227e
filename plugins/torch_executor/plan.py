"""What a torch executor runs on and in, chosen once and kept as data: the CPU it reads
(``CpuPlatform``), and its device, dtype, kernel variant and weight format
(``ExecutorPlan``), which the executor builds its runner from and reports as its
platform (``info().platform``, the start-up log, ``/metrics``).

``plan_options`` chooses from the config and the CPU before anything loads (what
``orchestrator doctor`` prints and what ``from_config`` loads the weights in);
``resolve_plan`` makes the choice the executor runs, from the loaded weights' device and
dtype and the kernel variant that loaded (a variant that fails to build falls back to
the next lower one, or to torch ops). Both decide the weight format by
``precision.resolve_weights`` and the dtype by ``precision.resolve_dtype``, so the two
answer alike wherever the kernels load. Nothing here imports torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from plugins.torch_executor import kernel_build
from plugins.torch_executor.config import TorchExecutorConfig
from plugins.torch_executor.cpu_features import CpuFeatures, cpu_model, detect
from plugins.torch_executor.precision import (
    Dtype,
    KVCacheDtype,
    MatmulDtype,
    WeightsName,
    resolve_dtype,
    resolve_kv_cache_dtype,
    resolve_matmul_dtype,
    resolve_weights,
)

# The kernels an executor runs without a variant of the CPU kernels: torch's own ops.
TORCH_OPS = "torch"

Row = tuple[str, str]


@dataclass(frozen=True)
class CpuPlatform:
    """The CPU as the executor reports it: its brand string (``cpu_model``), the features
    read from CPUID (``detect``; not capped by ``$ORCHESTRATOR_CPU_ISA``) and oneDNN's
    ISA cap in force (``$ONEDNN_MAX_CPU_ISA``; ``None``: none)."""

    model: str
    features: CpuFeatures
    onednn_cap: str | None

    @classmethod
    def read(cls) -> CpuPlatform:
        return cls(cpu_model(), detect(), os.environ.get(kernel_build.ONEDNN_ISA_ENV))

    @property
    def feature_names(self) -> str:
        return " ".join(self.features.names()) or "none"


@dataclass(frozen=True)
class ExecutorPlan:
    """One executor's choices: ``device`` (``cpu`` or ``cuda``), ``dtype`` (activations,
    KV cache and dense weights) and why, ``kernels`` (the CPU kernels' variant, or
    ``TORCH_OPS``), ``weights`` (how the projections are stored) and why,
    ``matmul_dtype`` (what the dense matmuls compute in) and why, ``kv_cache_dtype``
    (what the KV cache stores) and why, on ``cpu``."""

    device: str
    dtype: Dtype
    dtype_why: str
    kernels: str
    weights: WeightsName
    weights_why: str
    matmul_dtype: MatmulDtype
    matmul_why: str
    kv_cache_dtype: KVCacheDtype
    kv_cache_why: str
    cpu: CpuPlatform

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def onednn_cap(self) -> str | None:
        """oneDNN's ISA cap where the device is the CPU."""
        return self.cpu.onednn_cap if self.on_cpu else None

    def platform(self, compact_max_rows: int) -> tuple[Row, ...]:
        """``info().platform``: what runs, with the most rows the compact projections
        take (measured at start) where the weights are compact, the matmuls' dtype where
        it is not the model's, and the CPU's features and oneDNN cap where the device is
        the CPU."""
        return (
            ("device", self.device),
            ("dtype", self.dtype),
            ("weights", self.weights),
            *((("compact_max_rows", str(compact_max_rows)),) if self.weights != "dense" else ()),
            *((("matmul_dtype", self.matmul_dtype),) if self.matmul_dtype != self.dtype else ()),
            *(
                (("kv_cache_dtype", self.kv_cache_dtype),)
                if self.kv_cache_dtype != self.dtype
                else ()
            ),
            ("kernels", self.kernels),
            ("cpu", self.cpu.model),
            ("cpu_features", self.cpu.feature_names if self.on_cpu else "none"),
            *((("onednn_max_isa", self.cpu.onednn_cap),) if self.onednn_cap else ()),
        )

    def describe(self) -> tuple[Row, ...]:
        """What ``orchestrator doctor`` prints: the CPU and its features, the kernel
        override, the kernels, the device, the dtype and the weight format, with why."""
        return (
            ("cpu", self.cpu.model),
            ("cpu_features", self.cpu.feature_names),
            ("isa_override", os.environ.get(kernel_build.ISA_ENV) or "none"),
            ("kernels", self.kernels),
            ("device", self.device),
            ("dtype", f"{self.dtype} ({self.dtype_why})"),
            (
                "weights",
                f"{self.weights} ({self.weights_why}; int8 needs the kernels to build or "
                "be prebuilt)",
            ),
            ("matmul_dtype", f"{self.matmul_dtype} ({self.matmul_why})"),
            ("kv_cache_dtype", f"{self.kv_cache_dtype} ({self.kv_cache_why})"),
        )


def options_dtype(options: TorchExecutorConfig, features: CpuFeatures) -> tuple[Dtype, str]:
    """The dtype ``options`` ask for on a CPU with ``features`` (capped at the forced
    kernel variant's level), and why; raises as ``precision.resolve_dtype`` and, for an
    override this CPU cannot run, as ``kernel_build.select_variant``."""
    return resolve_dtype(options.dtype, options.device, kernel_build.effective(features))


def plan_options(options: TorchExecutorConfig, cpu: CpuPlatform) -> ExecutorPlan:
    """The plan ``options`` make on ``cpu`` where the selected kernel variant loads (the
    kernels of the highest level the CPU runs, or of ``$ORCHESTRATOR_CPU_ISA``'s).
    Raises ``ValueError`` where ``from_config`` would refuse the options."""
    variant = kernel_build.select_variant(cpu.features)
    dtype, why = options_dtype(options, cpu.features)
    on_cpu = options.device == "cpu"
    kernels = variant.name if on_cpu and options.kernels == "auto" else TORCH_OPS
    return resolve_plan(
        options.device,
        (dtype, why),
        kernels,
        options.weights,
        (options.matmul_dtype, options.dtype),
        cpu,
        options.kv_cache_dtype,
    )


def resolve_plan(
    device: str,
    dtype: tuple[Dtype, str],
    kernels: str,
    weights: str,
    matmul_dtype: tuple[str, str],
    cpu: CpuPlatform,
    kv_cache_dtype: str = "auto",
) -> ExecutorPlan:
    """The plan of an executor on ``device`` in ``dtype`` (with why) running ``kernels``
    (a variant that loaded, or ``TORCH_OPS``), its dense matmuls in what ``matmul_dtype``
    asks (``auto``, ``float32`` or ``bfloat16``, with the dtype that was asked for: an
    ``auto`` matmul dtype follows ``dtype: auto`` only; the features are those the
    selected kernel variant assumes), its weights stored as ``weights`` asks (``auto``,
    ``dense``, ``int8`` or ``bfloat16``), its KV cache in what ``kv_cache_dtype`` asks
    (``auto``, ``float32``, ``bfloat16`` or ``float16``); ``ValueError`` for a choice the
    model or the machine cannot use."""
    features = kernel_build.effective(cpu.features)
    matmul, matmul_why = resolve_matmul_dtype(*matmul_dtype, dtype[0], device, features)
    fmt, fmt_why = resolve_weights(weights, dtype[0], device, kernels != TORCH_OPS, matmul)
    kv, kv_why = resolve_kv_cache_dtype(kv_cache_dtype, dtype[0], matmul, fmt, kernels)
    return ExecutorPlan(
        device, dtype[0], dtype[1], kernels, fmt, fmt_why, matmul, matmul_why, kv, kv_why, cpu
    )
