"""What a torch executor computes in and how it stores its weights, resolved from the
config and this CPU's features, with the reason, before anything loads.

- ``dtype: auto``: on a CPU with AMX, bfloat16 (the AMX projections, ``tile_linear``);
  on one whose bfloat16 is native without AMX (AVX512-BF16, AVX-NE-CONVERT), float32
  activations with bfloat16 matmuls and KV cache (``matmul_dtype: auto``), which was as
  fast as the bfloat16 model at prefill and 64-row decode, faster for small decode
  batches, and closer to float32 (docs/torch_executor.md); float32 elsewhere (without
  native bfloat16, torch's bfloat16 matmuls ran 4x slower than float32 on an AVX2 CPU);
  bfloat16 on CUDA. An explicit ``bfloat16`` on a CPU where oneDNN cannot run it is a
  start-up error naming the missing features.
- ``matmul_dtype``: what the float32 model's dense matmuls compute in (the batches its
  compact weights do not take: prefill chunks, large decode batches). ``float32``;
  ``bfloat16`` rounds their inputs and weights to bfloat16 and keeps residual sums in
  float32, and stores the KV cache in bfloat16 (``runner.kv_cache_dtype``), where
  oneDNN runs bfloat16; ``auto`` (the default) is ``bfloat16`` where ``dtype: auto``
  chose float32 on a CPU with native bfloat16, else the model's dtype. A bfloat16
  model's matmuls are bfloat16 whatever this says.
- ``weights: auto``: for the float32 model on CPU where the CPU kernels load, ``int8``
  (decode reads each weight once, so a step's time follows the weights' bytes), or
  ``bfloat16`` with bfloat16 matmuls, where int8 weights fell just under the accuracy
  bar (docs/torch_executor.md and its test); ``dense`` otherwise. Compact formats need
  the float32 model and the CPU kernels.

- ``kv_cache_dtype``: what the KV cache stores. ``auto``: bfloat16 where the model or its
  matmuls are bfloat16 (K and V already carry bfloat16 rounding); float16 for the float32
  model over compact weights on a kernel variant with F16C (avx2 and up), whose decode
  steps read the cache more than the weights at 64 rows of a few hundred tokens, and
  which met the accuracy bar there where bfloat16 did not (docs/torch_executor.md); the
  model's dtype otherwise. A bfloat16 model's cache is bfloat16.

Features are those the selected kernel variant assumes (``kernel_build.effective``), so
``ORCHESTRATOR_CPU_ISA=avx2`` makes an AVX-512 or AMX machine choose as an AVX2 one does.
"""

from __future__ import annotations

from typing import Literal

from plugins.torch_executor.cpu_features import CpuFeatures

Dtype = Literal["float32", "bfloat16"]
WeightsName = Literal["dense", "int8", "bfloat16"]
MatmulDtype = Literal["float32", "bfloat16"]
KVCacheDtype = Literal["float32", "bfloat16", "float16"]
# Kernel variants without F16C, whose float16 conversions would be scalar code.
_NO_F16C = ("portable", "torch")


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
    if features.amx_bf16:
        return "bfloat16", "auto: AMX"
    if features.native_bfloat16:
        return "float32", "auto: native bfloat16 without AMX"
    return "float32", f"auto: no native bfloat16 ({have})"


def resolve_weights(
    requested: str,
    dtype: Dtype,
    device: str,
    kernels_loaded: bool,
    matmul_dtype: MatmulDtype = "float32",
) -> tuple[WeightsName, str]:
    """``requested`` (``auto``, ``dense``, ``int8`` or ``bfloat16``) for a ``dtype`` model
    whose dense matmuls compute in ``matmul_dtype`` -> the format and why; ``ValueError``
    for a compact format the model or the machine cannot use."""
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
        if matmul_dtype == "bfloat16":
            return "bfloat16", "auto: float32 with bfloat16 matmuls, on CPU with the kernels"
        return "int8", "auto: float32 on CPU with the kernels"
    return "dense", "auto"


def resolve_matmul_dtype(
    requested: str, requested_dtype: str, dtype: Dtype, device: str, features: CpuFeatures
) -> tuple[MatmulDtype, str]:
    """``requested`` (``auto``, ``float32`` or ``bfloat16``) for a ``dtype`` model (which
    ``requested_dtype`` asked for) on ``device`` -> what its dense matmuls compute in and
    why; ``ValueError`` for a choice the machine cannot run."""
    if dtype == "bfloat16":
        return "bfloat16", "the model's dtype"
    if requested == "float32":
        return "float32", "configured"
    if requested == "bfloat16":
        if device != "cpu" or not features.onednn_bfloat16:
            have = " ".join(features.names()) or "no x86 vector extensions"
            raise ValueError(
                "executor.matmul_dtype bfloat16 needs device cpu and a CPU where oneDNN "
                "runs bfloat16 (AMX-BF16, AVX512-BF16, AVX-NE-CONVERT or AVX-512 "
                f"BW/VL/DQ); got device {device}, features: {have}. Use matmul_dtype: auto"
            )
        return "bfloat16", "configured"
    if requested_dtype != "auto":
        return "float32", "auto: dtype float32 configured"
    if device == "cpu" and features.native_bfloat16:
        return "bfloat16", "auto: native bfloat16"
    return "float32", "auto: no native bfloat16" if device == "cpu" else "auto: not on cpu"


def resolve_kv_cache_dtype(
    requested: str, dtype: Dtype, matmul_dtype: MatmulDtype, weights: WeightsName, kernels: str
) -> tuple[KVCacheDtype, str]:
    """``requested`` (``auto``, ``float32``, ``bfloat16`` or ``float16``) for a ``dtype``
    model whose dense matmuls compute in ``matmul_dtype`` over ``weights`` on ``kernels``
    (a kernel variant, or ``torch``) -> what its KV cache stores and why (module doc);
    ``ValueError`` for a cache the bfloat16 model cannot use."""
    if dtype == "bfloat16":
        if requested not in ("auto", "bfloat16"):
            raise ValueError(
                f"executor.kv_cache_dtype {requested} needs dtype float32: the bfloat16 "
                "model's KV cache is bfloat16. Use kv_cache_dtype: auto"
            )
        return "bfloat16", "the model's dtype"
    if requested != "auto":
        return requested, "configured"  # type: ignore[return-value]
    if matmul_dtype == "bfloat16":
        return "bfloat16", "auto: bfloat16 matmuls"
    if weights != "dense" and kernels not in _NO_F16C:
        return "float16", f"auto: compact weights on the {kernels} kernels"
    return "float32", "auto: the model's dtype"
