"""What a torch executor computes in and how it stores its weights, resolved from the
config and this CPU's features, with the reason, before anything loads.

- ``dtype: auto``: bfloat16 where the CPU computes it natively (AMX-BF16, AVX512-BF16 or
  AVX-NE-CONVERT) and on CUDA; float32 elsewhere (without native bfloat16, torch's
  bfloat16 matmuls ran 4x slower than float32 on an AVX2 CPU). An explicit ``bfloat16``
  on a CPU where oneDNN cannot run it is a start-up error naming the missing features.
- ``weights: auto``: ``int8`` for the float32 model on CPU where the CPU kernels load
  (decode reads each weight once, so a step's time follows the weights' bytes; the
  accuracy bar int8 meets is in docs/torch_executor.md and its test); ``dense`` otherwise.
  Compact formats need the float32 model and the CPU kernels.

Features are those the selected kernel variant assumes (``kernel_build.effective``), so
``ORCHESTRATOR_CPU_ISA=avx2`` makes an AVX-512 or AMX machine choose as an AVX2 one does.
"""

from __future__ import annotations

from typing import Literal

from plugins.torch_executor.cpu_features import CpuFeatures

Dtype = Literal["float32", "bfloat16"]
WeightsName = Literal["dense", "int8", "bfloat16"]


def resolve_dtype(requested: str, device: str, features: CpuFeatures) -> tuple[Dtype, str]:
    """``requested`` (``auto``, ``float32`` or ``bfloat16``) on ``device`` -> the dtype and
    why; ``ValueError`` for bfloat16 on a CPU that cannot run it."""
    if device == "cuda":
        return ("bfloat16", "cuda") if requested == "auto" else (requested, "configured")  # type: ignore[return-value]
    have = " ".join(features.names()) or "no x86 vector extensions"
    if requested == "bfloat16":
        if not features.onednn_bfloat16:
            raise ValueError(
                "executor.dtype bfloat16 needs a CPU with native bfloat16 (AMX-BF16, "
                "AVX512-BF16 or AVX-NE-CONVERT) or AVX-512 BW/VL/DQ; this one has: "
                f"{have}. Use dtype: float32, or auto"
            )
        return "bfloat16", "configured"
    if requested == "float32":
        return "float32", "configured"
    if features.native_bfloat16:
        return "bfloat16", "auto: native bfloat16"
    return "float32", f"auto: no native bfloat16 ({have})"


def resolve_weights(
    requested: str, dtype: Dtype, device: str, kernels_loaded: bool
) -> tuple[WeightsName, str]:
    """``requested`` (``auto``, ``dense``, ``int8`` or ``bfloat16``) -> the format and why;
    ``ValueError`` for a compact format the model or the machine cannot use."""
    if requested == "dense":
        return "dense", "configured"
    if requested != "auto":
        if device != "cpu" or dtype != "float32":
            raise ValueError(
                f"executor.weights {requested} needs device cpu and dtype float32 "
                f"(got {device}, {dtype}); use weights: dense"
            )
        if not kernels_loaded:
            raise ValueError(
                f"executor.weights {requested} needs the CPU kernels, which could not be "
                "built or loaded here (see the warning above); use weights: dense"
            )
        return requested, "configured"  # type: ignore[return-value]
    if device == "cpu" and dtype == "float32" and kernels_loaded:
        return "int8", "auto: float32 on CPU with the kernels"
    return "dense", "auto"
