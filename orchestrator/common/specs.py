"""Model and GPU specifications, one source for the simulator, the planner and the
engine builder. Each lives in a YAML file under ``configs/models/`` or
``configs/hardware/``; a name resolves to ``configs/<kind>/<name>.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from orchestrator.core import StrictModel, load_yaml

CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"

DType = Literal["bf16", "fp16", "fp8", "int8", "fp32"]
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0}


class ModelSpec(StrictModel):
    """Dimensions of a Llama-architecture decoder."""

    name: str
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    tie_word_embeddings: bool = False

    @property
    def params_per_layer(self) -> int:
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2  # q, o, k, v
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        return attn + mlp + 2 * h  # two RMSNorm weights

    @property
    def num_params(self) -> int:
        """All parameters, the embedding table and (untied) LM head included."""
        embed = self.vocab_size * self.hidden_size
        head = 0 if self.tie_word_embeddings else embed
        return self.num_layers * self.params_per_layer + embed + head + self.hidden_size


class GPUSpec(StrictModel):
    """Peak figures of one GPU. Bandwidths in bytes/s, FLOP rates in FLOP/s (dense),
    memory in bytes. ``fp8_flops`` is ``None`` where the GPU has no FP8 tensor cores.
    ``interconnect_bw`` is per direction. Efficiency factors scale the peaks to what a
    calibrated run achieves (1.0 is the pure roofline)."""

    name: str
    memory_bytes: float = Field(gt=0)
    hbm_bw: float = Field(gt=0)
    bf16_flops: float = Field(gt=0)
    fp8_flops: float | None = Field(None, gt=0)
    interconnect_bw: float = Field(gt=0)
    bw_efficiency: float = Field(1.0, gt=0, le=1.5)
    flops_efficiency: float = Field(1.0, gt=0, le=1.5)

    def flops(self, dtype: DType) -> float:
        if dtype in ("fp8", "int8"):
            if self.fp8_flops is None:
                raise ValueError(f"{self.name} has no FP8 tensor cores")
            return self.fp8_flops
        return self.bf16_flops


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        return p
    path = CONFIGS_DIR / kind / f"{name_or_path}.yaml"
    if not path.exists():
        known = sorted(f.stem for f in (CONFIGS_DIR / kind).glob("*.yaml"))
        raise ValueError(f"unknown {kind} spec {name_or_path!r}; known: {', '.join(known)}")
    return path


def load_model_spec(name_or_path: str | Path) -> ModelSpec:
    """A name from ``configs/models/`` (e.g. ``llama3-70b``) or a YAML path."""
    return load_yaml(_resolve("models", name_or_path), ModelSpec)


def load_gpu_spec(name_or_path: str | Path) -> GPUSpec:
    """A name from ``configs/hardware/`` (e.g. ``h100-sxm``) or a YAML path."""
    return load_yaml(_resolve("hardware", name_or_path), GPUSpec)
