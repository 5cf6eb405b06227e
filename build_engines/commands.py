"""The exact commands and files a build produces, derived from the spec alone.

Nothing here runs anything: the plan prints these, the pipeline executes them, and the
golden tests pin them. Flag names are those of TensorRT-LLM 1.2.x
(``examples/quantization/quantize.py`` and ``trtllm-build``); the LLM-API option names
are those of ``TrtLlmArgs`` (engine backend) and ``TorchLlmArgs`` (PyTorch backend).
``build_engines.check_trtllm_names`` checks all of them against a real install.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from build_engines.spec import BuildSpec

# The NGC release image keeps the TensorRT-LLM examples here.
DEFAULT_EXAMPLES_DIR = "/app/tensorrt_llm/examples"
EXAMPLES_DIR_ENV = "TRTLLM_EXAMPLES_DIR"

# Config, tokenizer and safetensors weights; skips the original/*.pth copies Meta ships.
ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer*")

_QFORMAT = {"fp8": "fp8", "bf16": "full_prec", "fp16": "full_prec"}


@dataclass(frozen=True)
class Toolchain:
    """Where the TensorRT-LLM tools are on the build machine."""

    python: str = "python"
    examples_dir: Path = Path(DEFAULT_EXAMPLES_DIR)
    trtllm_build: str = "trtllm-build"

    @property
    def quantize_script(self) -> Path:
        return self.examples_dir / "quantization" / "quantize.py"

    @classmethod
    def from_env(cls, examples_dir: str | None = None) -> Toolchain:
        """``examples_dir`` if given, else ``$TRTLLM_EXAMPLES_DIR``, else the NGC path."""
        chosen = examples_dir or os.environ.get(EXAMPLES_DIR_ENV) or DEFAULT_EXAMPLES_DIR
        return cls(examples_dir=Path(chosen))


@dataclass(frozen=True)
class Layout:
    """Files and folders under a build's output directory."""

    root: Path

    @property
    def hf_dir(self) -> Path:
        """The downloaded Hugging Face checkpoint."""
        return self.root / "hf"

    @property
    def checkpoint_dir(self) -> Path:
        """The quantised checkpoint (TensorRT-LLM format, or HF format for PyTorch)."""
        return self.root / "checkpoint"

    @property
    def engine_dir(self) -> Path:
        return self.root / "engine"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def stamps_dir(self) -> Path:
        """One JSON stamp per finished step (its input hash), for resumable builds."""
        return self.root / ".steps"

    @property
    def options_path(self) -> Path:
        """LLM-API options (run-time settings) for ``trtllm-serve --config`` (older
        releases: ``--extra_llm_api_options``, of which ``--config`` is an alias)."""
        return self.root / "llm_api_options.yaml"

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"


def source_dir(spec: BuildSpec, layout: Layout) -> Path:
    """The folder quantize.py reads: the local source, or where the download lands."""
    if spec.model.is_local:
        return Path(spec.model.source).expanduser()
    return layout.hf_dir


def artifact_dir(spec: BuildSpec, layout: Layout) -> Path:
    """What the serving side loads: the engine, or the quantised HF checkpoint."""
    return layout.engine_dir if spec.backend == "engine" else layout.checkpoint_dir


def describe_download(spec: BuildSpec, layout: Layout) -> str:
    """The download step as the Python call the runner makes."""
    if spec.model.is_local:
        return f"use local checkpoint {source_dir(spec, layout)} (no download)"
    patterns = ", ".join(repr(p) for p in ALLOW_PATTERNS)
    return (
        f"huggingface_hub.snapshot_download({spec.model.source!r}, "
        f"revision={spec.model.revision!r}, allow_patterns=[{patterns}], "
        f"local_dir={str(layout.hf_dir)!r})"
    )


def quantize_argv(spec: BuildSpec, layout: Layout, toolchain: Toolchain) -> list[str]:
    """``quantize.py`` command line. TP and PP are fixed here for the engine backend
    (the TensorRT-LLM checkpoint is sharded); the PyTorch backend exports one unsharded
    HF checkpoint and applies TP when it loads."""
    q = spec.quantization
    argv = [
        toolchain.python,
        str(toolchain.quantize_script),
        "--model_dir",
        str(source_dir(spec, layout)),
        "--output_dir",
        str(layout.checkpoint_dir),
        "--dtype",
        spec.model.dtype,
        "--qformat",
        _QFORMAT[q.weights],
    ]
    if q.kv_cache in ("fp8", "int8"):
        argv += ["--kv_cache_dtype", q.kv_cache]
    if q.needs_calibration:
        argv += ["--calib_dataset", q.calib_dataset, "--calib_size", str(q.calib_size)]
    if spec.backend == "engine":
        argv += ["--tp_size", str(spec.parallelism.tp), "--pp_size", str(spec.parallelism.pp)]
    else:
        argv += ["--export_format", "hf"]
    return argv


def _switch(flag: bool) -> str:
    return "enable" if flag else "disable"


def build_argv(spec: BuildSpec, layout: Layout, toolchain: Toolchain) -> list[str]:
    """``trtllm-build`` command line (engine backend). Every plugin switch the validator
    reasons about is passed explicitly."""
    lim, p = spec.limits, spec.engine_plugins
    return [
        toolchain.trtllm_build,
        "--checkpoint_dir",
        str(layout.checkpoint_dir),
        "--output_dir",
        str(layout.engine_dir),
        "--max_batch_size",
        str(lim.max_batch_size),
        "--max_num_tokens",
        str(lim.max_num_tokens),
        "--max_input_len",
        str(lim.max_input_len),
        "--max_seq_len",
        str(lim.max_seq_len),
        "--kv_cache_type",
        p.kv_cache_type,
        "--tokens_per_block",
        str(lim.tokens_per_block),
        "--context_fmha",
        _switch(p.context_fmha),
        "--use_paged_context_fmha",
        _switch(p.use_paged_context_fmha),
        "--use_fp8_context_fmha",
        _switch(p.use_fp8_context_fmha),
        "--multiple_profiles",
        _switch(p.multiple_profiles),
        "--reduce_fusion",
        _switch(p.reduce_fusion),
        "--user_buffer",
        _switch(p.user_buffer),
        "--norm_quant_fusion",
        _switch(p.norm_quant_fusion),
        "--workers",
        str(spec.parallelism.world_size),
    ]


def llm_api_options(spec: BuildSpec) -> dict[str, Any]:
    """Run-time settings as LLM-API options (the YAML ``trtllm-serve`` and ``LLM(...)``
    accept). Engine backend: ``TrtLlmArgs`` keys, whose CUDA graph knobs become
    ``ExtendedRuntimePerfKnobConfig.cuda_graph_mode`` / ``cuda_graph_cache_size`` of the
    executor. PyTorch backend: ``TorchLlmArgs`` keys, including the limits an engine would
    otherwise carry."""
    rt, lim = spec.runtime, spec.limits
    kv_cache: dict[str, Any] = {
        "free_gpu_memory_fraction": rt.kv_cache_free_gpu_memory_fraction,
        "enable_block_reuse": rt.enable_block_reuse,
    }
    options: dict[str, Any] = {
        "enable_chunked_prefill": rt.enable_chunked_context,
        "kv_cache_config": kv_cache,
        "scheduler_config": {"capacity_scheduler_policy": rt.capacity_scheduler_policy},
    }
    if spec.backend == "engine":
        options["extended_runtime_perf_knob_config"] = {
            "cuda_graph_mode": rt.cuda_graphs,
            "cuda_graph_cache_size": rt.cuda_graph_cache_size or 0,
        }
        return options
    kv_cache["dtype"] = "fp8" if spec.quantization.kv_cache == "fp8" else "auto"
    kv_cache["tokens_per_block"] = lim.tokens_per_block
    options.update(
        tensor_parallel_size=spec.parallelism.tp,
        pipeline_parallel_size=spec.parallelism.pp,
        max_batch_size=lim.max_batch_size,
        max_num_tokens=lim.max_num_tokens,
        max_input_len=lim.max_input_len,
        max_seq_len=lim.max_seq_len,
    )
    if not rt.cuda_graphs:
        options["cuda_graph_config"] = None  # None turns CUDA graphs off
    elif rt.cuda_graph_batch_sizes is not None:
        options["cuda_graph_config"] = {
            "batch_sizes": sorted(rt.cuda_graph_batch_sizes),
            "enable_padding": bool(rt.cuda_graph_padding),
        }
    else:
        options["cuda_graph_config"] = {
            "max_batch_size": lim.max_batch_size,
            "enable_padding": bool(rt.cuda_graph_padding),
        }
    return options


def shell(argv: list[str]) -> str:
    return shlex.join(argv)
