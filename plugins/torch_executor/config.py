"""Options of the torch executor; importable without torch so config files validate anywhere."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_CACHE_DIR = "~/.cache/orchestrator"


class TorchExecutorConfig(BaseModel):
    """``executor: {type: torch, ...}`` options.

    - ``device``: ``cpu``, or ``cuda`` for the first GPU (the same forward, with
      captured CUDA graphs for decode steps).
    - ``dtype``: activations, residual stream and dense weights. ``auto`` (the default):
      bfloat16 on a CPU with AMX and on CUDA; float32 with bfloat16 matmuls and KV cache
      (``matmul_dtype``) on a CPU whose bfloat16 is native without AMX (AVX512-BF16,
      AVX-NE-CONVERT); float32 elsewhere. An explicit ``bfloat16`` on a CPU that cannot
      run it is a start-up error naming the missing features (``precision.py``).
    - ``weights``: how the projections' weights are stored for small decode batches.
      ``auto``: for the float32 model on CPU with the CPU kernels, ``int8`` (per-group
      scales), or ``bfloat16`` where its matmuls are bfloat16; ``dense`` otherwise.
      ``int8`` and ``bfloat16`` (stored, widened to float32 in registers) need
      ``dtype: float32`` on CPU and the kernels. Accuracy of each: docs/torch_executor.md.
    - ``matmul_dtype``: what the float32 model's dense matmuls (prefill chunks, decode
      batches past the compact weights' bound) compute in: ``float32``, ``bfloat16``
      (inputs and weights rounded to bfloat16, residual sums in float32, and the KV cache
      stored in bfloat16; needs a CPU where oneDNN runs bfloat16), or ``auto`` (the
      default: bfloat16 where ``dtype: auto`` chose float32 on a CPU with native
      bfloat16, else the model's dtype). A bfloat16 model's matmuls are bfloat16.
    - ``kv_cache_dtype``: what the paged KV cache stores, as vLLM's ``--kv-cache-dtype``:
      ``float32``, ``bfloat16`` or ``float16`` (the float32 model's; a bfloat16 model's
      cache is bfloat16), or ``auto`` (the default: bfloat16 with bfloat16 matmuls,
      float16 for the float32 model over compact weights on the avx2 kernels and up,
      else the model's dtype; ``precision.py``). A 16-bit cache halves the bytes a decode
      step's attention reads and the pool's memory per token.
    - ``kernels``: ``auto`` loads the CPU kernels of the highest ISA level this CPU runs
      (``ORCHESTRATOR_CPU_ISA`` forces a lower one), prebuilt or built on first use with
      the system C++ compiler, and falls back to torch ops where none loads; ``torch``
      always uses torch ops (the reference path).
    - ``cuda_graphs``: on CUDA, replay captured graphs for decode-only steps.
    - ``num_threads``: intra-op threads for torch; ``None`` keeps torch's default (one
      per core). torch's thread pool is process-wide, so the last executor built wins.
    - ``kv_cache_gib``: memory for the paged KV pool in GiB (2**30 bytes); the pool holds
      as many whole blocks of ``cache.block_size`` tokens as fit. ``auto`` (the default):
      room for ``scheduler.max_batch_size`` sequences of ``model.max_model_len`` tokens,
      capped at half the memory available at start (``kv_size.py``).
    - ``cache_dir``: where dequantised GGUF weights are cached as safetensors.
    - ``seed``: seeds the generator of sampled requests that carry no seed of their own
      (``None``: fresh entropy per executor).
    - ``constraints``: enforce structured outputs and tool-call grammars with llguidance
      (``grammar.py``; the model's tokenizer is read once at start). ``false``: the
      executor enforces none, and constrained requests are refused with a 400.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Literal["cpu", "cuda"] = "cpu"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    weights: Literal["auto", "dense", "int8", "bfloat16"] = "auto"
    matmul_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    kernels: Literal["auto", "torch"] = "auto"
    cuda_graphs: bool = True
    num_threads: int | None = Field(None, ge=1)
    kv_cache_gib: float | Literal["auto"] = "auto"
    cache_dir: str = DEFAULT_CACHE_DIR
    seed: int | None = None
    constraints: bool = True

    @field_validator("kv_cache_gib")
    @classmethod
    def _positive_size(cls, value: float | str) -> float | str:
        if value != "auto" and not 0 < float(value) < math.inf:
            raise ValueError(f"kv_cache_gib must be a positive number of GiB or auto, got {value}")
        return value

    @property
    def kv_cache_size_gib(self) -> float | None:
        """``kv_cache_gib`` as a number, ``None`` for ``auto``."""
        return None if self.kv_cache_gib == "auto" else float(self.kv_cache_gib)

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser()
