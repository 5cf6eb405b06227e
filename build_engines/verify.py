"""After the build: read what was built and compare it with what the spec asked for.

Engine backend: the engine's ``config.json`` (TensorRT-LLM 1.2.x layout,
``pretrained_config`` + ``build_config`` with its ``plugin_config``) and one
``rank<N>.engine`` per GPU. PyTorch backend: the quantised HF checkpoint's
``hf_quant_config.json`` and weights. Any difference is reported by its dotted key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from build_engines.commands import Layout, artifact_dir
from build_engines.spec import BuildSpec
from orchestrator.common.build_manifest import Verification

_QUANT_ALGO = {"fp8": "FP8", "int8": "INT8", "bf16": None, "fp16": None}


def expected_engine_config(spec: BuildSpec) -> dict[str, Any]:
    """Dotted ``config.json`` key -> the value the spec asked for (engine backend)."""
    lim, p, q = spec.limits, spec.engine_plugins, spec.quantization
    pc = "build_config.plugin_config"
    return {
        "pretrained_config.dtype": spec.model.dtype,
        "pretrained_config.mapping.tp_size": spec.parallelism.tp,
        "pretrained_config.mapping.pp_size": spec.parallelism.pp,
        "pretrained_config.quantization.quant_algo": _QUANT_ALGO[q.weights],
        "pretrained_config.quantization.kv_cache_quant_algo": _QUANT_ALGO[q.kv_cache],
        "build_config.max_batch_size": lim.max_batch_size,
        "build_config.max_num_tokens": lim.max_num_tokens,
        "build_config.max_input_len": lim.max_input_len,
        "build_config.max_seq_len": lim.max_seq_len,
        "build_config.kv_cache_type": p.kv_cache_type.upper(),
        f"{pc}.paged_kv_cache": p.kv_cache_type == "paged",
        f"{pc}.tokens_per_block": lim.tokens_per_block,
        f"{pc}.context_fmha": p.context_fmha,
        f"{pc}.use_paged_context_fmha": p.use_paged_context_fmha,
        f"{pc}.use_fp8_context_fmha": p.use_fp8_context_fmha,
        f"{pc}.multiple_profiles": p.multiple_profiles,
        f"{pc}.reduce_fusion": p.reduce_fusion,
        f"{pc}.user_buffer": p.user_buffer,
        f"{pc}.norm_quant_fusion": p.norm_quant_fusion,
    }


def expected_checkpoint_quantization(spec: BuildSpec) -> dict[str, Any]:
    """Dotted ``hf_quant_config.json`` key -> expected value (PyTorch backend)."""
    q = spec.quantization
    return {
        "quantization.quant_algo": _QUANT_ALGO[q.weights],
        "quantization.kv_cache_quant_algo": _QUANT_ALGO[q.kv_cache],
    }


_MISSING = object()


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or part not in data:
            return _MISSING
        data = data[part]
    return data


def _same(asked: Any, built: Any) -> bool:
    # Enum names are serialised upper-case by some releases and lower-case by others.
    if isinstance(asked, str) and isinstance(built, str):
        return asked.lower() == built.lower()
    # Guard against True == 1: a boolean switch must come back as a boolean.
    if isinstance(asked, bool) != isinstance(built, bool):
        return False
    return bool(asked == built)


def compare(expected: dict[str, Any], actual: dict[str, Any], source: str) -> list[str]:
    """One line per key of ``expected`` that ``actual`` lacks or holds differently."""
    differences = []
    for key, asked in expected.items():
        built = _lookup(actual, key)
        if built is _MISSING:
            differences.append(f"{key}: missing from {source}")
        elif not _same(asked, built):
            differences.append(f"{key}: asked {asked!r}, {source} has {built!r}")
    return differences


def _read_json(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    try:
        data = json.loads(path.read_text())
    except OSError as err:
        return None, f"{path}: cannot read ({err.strerror})"
    except json.JSONDecodeError as err:
        return None, f"{path}: not valid JSON ({err})"
    if not isinstance(data, dict):
        return None, f"{path}: expected a JSON object"
    return data, None


def verify_engine(spec: BuildSpec, layout: Layout) -> Verification:
    """Compare ``engine/config.json`` and the rank files with the spec."""
    config_path = layout.engine_dir / "config.json"
    expected = expected_engine_config(spec)
    ranks = [f"rank{i}.engine" for i in range(spec.parallelism.world_size)]
    checked = [*expected, *ranks]
    config, error = _read_json(config_path)
    if config is None:
        return Verification(passed=False, checked=checked, differences=[str(error)])
    differences = compare(expected, config, "config.json")
    differences += [
        f"{name}: missing from {layout.engine_dir}"
        for name in ranks
        if not (layout.engine_dir / name).is_file()
    ]
    return Verification(passed=not differences, checked=checked, differences=differences)


def verify_checkpoint(spec: BuildSpec, layout: Layout) -> Verification:
    """Compare the quantised HF checkpoint (PyTorch backend) with the spec."""
    directory = artifact_dir(spec, layout)
    differences = []
    checked = ["config.json", "*.safetensors"]
    if not (directory / "config.json").is_file():
        differences.append(f"config.json: missing from {directory}")
    if not any(directory.glob("*.safetensors")):
        differences.append(f"*.safetensors: no weights in {directory}")
    if spec.quantization.needs_calibration:
        expected = expected_checkpoint_quantization(spec)
        checked += list(expected)
        quant, error = _read_json(directory / "hf_quant_config.json")
        if quant is None:
            differences.append(str(error))
        else:
            differences += compare(expected, quant, "hf_quant_config.json")
    return Verification(passed=not differences, checked=checked, differences=differences)


def verify_artifact(spec: BuildSpec, layout: Layout) -> Verification:
    """The verification the spec's backend calls for."""
    if spec.backend == "engine":
        return verify_engine(spec, layout)
    return verify_checkpoint(spec, layout)
