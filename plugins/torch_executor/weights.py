"""Llama weights: where they come from, the dimensions they imply, and the on-disk cache.

A GGUF checkpoint (the embedded default) is dequantised once through transformers and
written as a plain Hugging Face folder (``config.json`` + ``model.safetensors``) under
the cache directory; every later start reads that folder, which takes seconds instead of
the ~20 s of dequantisation. A local or downloaded Hugging Face folder is read directly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from orchestrator.common.model_source import ModelSourceError, ResolvedSource, resolve_source
from orchestrator.core import ModelConfig
from plugins.torch_executor.linear import Linear

# Bump when the cached layout changes so stale caches are rebuilt, not misread.
CACHE_FORMAT = 1
SUPPORTED_ROPE_TYPES = ("default", "llama3")
# Rows from which the output and down projections run on their dense weight (linear.py).
DENSE_FROM_ROWS = 384


class UnsupportedModelError(ModelSourceError):
    """The checkpoint is not a Llama-architecture model this executor can run."""


@dataclasses.dataclass(frozen=True, slots=True)
class RopeScaling:
    """Llama 3.1 frequency scaling (``rope_type: llama3``); wavelengths in tokens."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True, slots=True)
class ModelArgs:
    """Dimensions and constants of a Llama decoder, read from its Hugging Face config."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        """Parse a ``config.json`` dict; raise ``UnsupportedModelError`` naming the field
        for anything this forward does not implement."""
        model_type = cfg.get("model_type")
        if model_type != "llama":
            raise UnsupportedModelError(f"model_type {model_type!r} is not supported (llama only)")
        for key, expected in (
            ("hidden_act", "silu"),
            ("attention_bias", False),
            ("mlp_bias", False),
        ):
            if cfg.get(key, expected) != expected:
                raise UnsupportedModelError(f"{key}={cfg[key]!r} is not supported ({expected!r})")
        num_heads = int(cfg["num_attention_heads"])
        num_kv_heads = int(cfg.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise UnsupportedModelError(
                f"num_attention_heads ({num_heads}) is not a multiple of "
                f"num_key_value_heads ({num_kv_heads})"
            )
        theta, scaling = _rope_params(cfg)
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // num_heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            eos_token_ids=eos_ids,
        )


def _rope_params(cfg: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    # transformers >= 5 writes ``rope_parameters``; older configs ``rope_theta`` + ``rope_scaling``.
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported ({', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return theta, None
    return theta, RopeScaling(
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(params["original_max_position_embeddings"]),
    )


@dataclasses.dataclass(slots=True)
class LayerWeights:
    """One decoder layer, with projections fused so each runs as a single matmul."""

    input_norm: torch.Tensor  # [hidden]
    qkv: Linear  # [(heads + 2 * kv_heads) * head_dim, hidden]
    o: Linear  # [hidden, heads * head_dim]
    post_norm: torch.Tensor  # [hidden]
    gate_up: Linear  # [2 * intermediate, hidden]
    down: Linear  # [hidden, intermediate]

    @property
    def linears(self) -> tuple[Linear, ...]:
        return (self.qkv, self.o, self.gate_up, self.down)


@dataclasses.dataclass(slots=True)
class LlamaWeights:
    """A model's weights in one dtype, as the forward pass uses them; shared read-only by
    every executor built on them."""

    args: ModelArgs
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden]
    lm_head: Linear  # [vocab, hidden]; a packed copy of ``embed`` when tied

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def num_bytes(self) -> int:
        """Bytes a forward pass reads: every layer, the final norm and the LM head (the
        embedding rows it looks up are negligible)."""
        norms = [self.norm] + [
            t for layer in self.layers for t in (layer.input_norm, layer.post_norm)
        ]
        linears = [lin for layer in self.layers for lin in layer.linears] + [self.lm_head]
        return sum(t.numel() * t.element_size() for t in norms) + sum(x.num_bytes for x in linears)

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @classmethod
    def from_state_dict(
        cls,
        args: ModelArgs,
        state: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> LlamaWeights:
        """Build from Hugging Face Llama parameter names, cast to ``dtype`` on ``device``."""

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise UnsupportedModelError(f"checkpoint has no tensor {name!r}")
            return state[name].to(device=device, dtype=dtype).contiguous()

        layers = []
        for i in range(args.num_layers):
            p = f"model.layers.{i}."
            attn = [take(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")]
            mlp = [take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
            layers.append(
                LayerWeights(
                    input_norm=take(p + "input_layernorm.weight"),
                    qkv=Linear(torch.cat(attn, dim=0)),
                    o=Linear(take(p + "self_attn.o_proj.weight"), dense_from_rows=DENSE_FROM_ROWS),
                    post_norm=take(p + "post_attention_layernorm.weight"),
                    gate_up=Linear(torch.cat(mlp, dim=0)),
                    down=Linear(take(p + "mlp.down_proj.weight"), dense_from_rows=DENSE_FROM_ROWS),
                )
            )
        embed = take("model.embed_tokens.weight")
        tied = args.tie_word_embeddings or "lm_head.weight" not in state
        return cls(
            args=args,
            embed=embed,
            layers=layers,
            norm=take("model.norm.weight"),
            lm_head=Linear(embed if tied else take("lm_head.weight")),
        )


def load_weights(
    model: ModelConfig, cache_dir: Path, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> LlamaWeights:
    """Resolve ``model`` and load its weights in ``dtype`` on ``device``, dequantising a
    GGUF file into ``cache_dir`` on first use."""
    source = resolve_source(model)
    folder = source.directory if source.gguf_file is None else cached_gguf_folder(source, cache_dir)
    return load_folder(folder, dtype, device)


def load_folder(
    folder: Path, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> LlamaWeights:
    """Read a Hugging Face folder: ``config.json`` and one or more ``*.safetensors``."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ModelSourceError(f"{folder}: no config.json")
    args = _with_eos(ModelArgs.from_hf_config(json.loads(config_path.read_text())), folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelSourceError(f"{folder}: no .safetensors files (other formats are not read)")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(f))
    return LlamaWeights.from_state_dict(args, state, dtype, device)


def _with_eos(args: ModelArgs, folder: Path) -> ModelArgs:
    """Add ``generation_config.json``'s EOS ids (chat models often list their end-of-turn
    token only there)."""
    gen = folder / "generation_config.json"
    if not gen.exists():
        return args
    eos = json.loads(gen.read_text()).get("eos_token_id")
    extra = eos if isinstance(eos, list) else ([] if eos is None else [eos])
    merged = tuple(dict.fromkeys([*args.eos_token_ids, *map(int, extra)]))
    return dataclasses.replace(args, eos_token_ids=merged)


def cache_folder_for(source: ResolvedSource, cache_dir: Path) -> Path:
    """The cache folder for a GGUF file: keyed by its path, size and mtime, so a replaced
    file is dequantised again."""
    assert source.gguf_file is not None
    gguf = source.directory / source.gguf_file
    stat = gguf.stat()
    key = f"{CACHE_FORMAT}:{source.cache_key}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_dir / "torch_executor" / f"{gguf.stem}-{digest}"


def cached_gguf_folder(source: ResolvedSource, cache_dir: Path) -> Path:
    """Return the cache folder for ``source``'s GGUF file, dequantising it first if absent.

    The folder is written under a temporary name and renamed into place, so a crash or a
    concurrent writer never leaves a half-written cache that a later start would read.
    """
    target = cache_folder_for(source, cache_dir)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        _dequantise_gguf(source, tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            # Another process finished first; its copy is equivalent.
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _dequantise_gguf(source: ResolvedSource, out: Path) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        source.directory, gguf_file=source.gguf_file, dtype=torch.float32
    )
    config = hf.config.to_dict()
    config.pop("quantization_config", None)
    gen_eos = hf.generation_config.eos_token_id
    if gen_eos is not None:
        config["eos_token_id"] = gen_eos
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        # safetensors refuses shared storage; the loader re-ties the head to the embedding.
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2, default=str))
