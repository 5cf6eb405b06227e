"""Spec factories and fake step runners for the build pipeline tests.

The fake tools behave like the real ones as far as the pipeline can tell: the fake
quantize.py writes a checkpoint ``config.json`` from its flags, and the fake trtllm-build
reads that checkpoint config and writes an engine ``config.json`` in TensorRT-LLM's
layout plus one ``rank<N>.engine`` per worker, so verification runs for real on it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from build_engines.commands import Layout, Toolchain
from build_engines.environment import Environment
from build_engines.errors import BuildError
from build_engines.plan import BuildPlan, make_plan
from build_engines.runners import DownloadResult, Runners
from build_engines.spec import BuildSpec, ModelSection
from build_engines.verify import verify_artifact
from orchestrator.common.specs import load_gpu_spec, load_model_spec

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOOLCHAIN = Toolchain(python="python", examples_dir=Path("examples"))


def base_spec_data() -> dict[str, Any]:
    """Llama-3-70B FP8 TP2 on H100, sized so that no rule fires (48 sequences fit at
    max_seq_len 8192; 54 would)."""
    return {
        "name": "test-70b",
        "backend": "engine",
        "model": {
            "spec": "llama3-70b",
            "source": "meta-llama/Meta-Llama-3-70B-Instruct",
            "revision": COMMIT,
            "dtype": "bfloat16",
        },
        "quantization": {"weights": "fp8", "kv_cache": "fp8", "calib_size": 512},
        "parallelism": {"tp": 2, "pp": 1},
        "limits": {
            "max_batch_size": 48,
            "max_num_tokens": 8192,
            "max_input_len": 8192,
            "max_seq_len": 8192,
            "tokens_per_block": 32,
        },
        "plugins": {
            "kv_cache_type": "paged",
            "context_fmha": True,
            "use_paged_context_fmha": True,
            "use_fp8_context_fmha": True,
            "multiple_profiles": True,
            "reduce_fusion": True,
            "user_buffer": False,
            "norm_quant_fusion": False,
        },
        "runtime": {"cuda_graphs": True, "cuda_graph_cache_size": 64},
        "target": {"gpu": "h100-sxm"},
        "memory": {"typical_context_len": 2048},
        "output_dir": "out",
    }


# Turns the engine base spec into a valid PyTorch-backend spec.
PYTORCH = {
    "backend": "pytorch",
    "plugins": None,
    "runtime": {"cuda_graph_cache_size": None, "cuda_graph_batch_sizes": [1, 8, 32]},
}


def deep_merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def spec_data(*overrides: dict[str, Any]) -> dict[str, Any]:
    data = base_spec_data()
    for o in overrides:
        data = deep_merge(data, o)
    return data


def make_spec(*overrides: dict[str, Any]) -> BuildSpec:
    return BuildSpec.model_validate(spec_data(*overrides))


def plan_for(spec: BuildSpec, root: Path) -> BuildPlan:
    """Plan ``spec`` with its output under ``root``."""
    return make_plan(
        spec,
        load_model_spec(spec.model.spec),
        load_gpu_spec(spec.target.gpu),
        TOOLCHAIN,
        cwd=root,
    )


def ready_environment() -> Environment:
    """A machine that has everything a build needs."""
    return Environment(
        has_tensorrt_llm=True,
        trtllm_build="/usr/local/bin/trtllm-build",
        quantize_script=True,
        gpus=("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        tool_versions={"tensorrt_llm": "1.2.0", "modelopt": "0.37.0"},
    )


def _flag(argv: Sequence[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


_ALGO = {"fp8": "FP8", "int8": "INT8"}


class FakeTools:
    """Fake download/quantize/build runners that record their calls.

    ``engine_overrides`` (dotted build_config key -> value) lets a test play a
    trtllm-build that silently changes a setting; ``fail`` names a step that fails.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: str | None = None
        self.engine_overrides: dict[str, Any] = {}

    def runners(self, verify: Callable[[BuildSpec, Layout], Any] = verify_artifact) -> Runners:
        return Runners(
            download=self.download, quantize=self.quantize, build=self.build, verify=verify
        )

    def _enter(self, step: str) -> None:
        self.calls.append(step)
        if self.fail == step:
            raise BuildError(f"{step} exited with status 1")

    def download(self, model: ModelSection, target: Path) -> DownloadResult:
        self._enter("download")
        target.mkdir(parents=True, exist_ok=True)
        (target / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (target / "model-00001-of-00001.safetensors").write_bytes(b"\0")
        return DownloadResult(target, COMMIT)

    def quantize(self, argv: Sequence[str], log: Path) -> None:
        self._enter("quantize")
        out = Path(str(_flag(argv, "--output_dir")))
        out.mkdir(parents=True, exist_ok=True)
        qformat = _flag(argv, "--qformat")
        weights = "FP8" if qformat == "fp8" else None
        kv = _ALGO.get(str(_flag(argv, "--kv_cache_dtype")))
        if _flag(argv, "--export_format") == "hf":
            (out / "config.json").write_text("{}")
            (out / "model.safetensors").write_bytes(b"\0")
            quant = {"quant_algo": weights, "kv_cache_quant_algo": kv}
            (out / "hf_quant_config.json").write_text(json.dumps({"quantization": quant}))
            return
        tp, pp = int(str(_flag(argv, "--tp_size"))), int(str(_flag(argv, "--pp_size")))
        config = {
            "architecture": "LlamaForCausalLM",
            "dtype": _flag(argv, "--dtype"),
            "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
            "quantization": {"quant_algo": weights, "kv_cache_quant_algo": kv},
        }
        (out / "config.json").write_text(json.dumps(config))

    def build(self, argv: Sequence[str], log: Path) -> None:
        self._enter("build")
        checkpoint = json.loads(
            (Path(str(_flag(argv, "--checkpoint_dir"))) / "config.json").read_text()
        )
        out = Path(str(_flag(argv, "--output_dir")))
        out.mkdir(parents=True, exist_ok=True)
        switches = {
            name: _flag(argv, f"--{name}") == "enable"
            for name in (
                "context_fmha",
                "use_paged_context_fmha",
                "use_fp8_context_fmha",
                "multiple_profiles",
                "reduce_fusion",
                "user_buffer",
                "norm_quant_fusion",
            )
        }
        kv_type = str(_flag(argv, "--kv_cache_type"))
        build_config: dict[str, Any] = {
            "max_batch_size": int(str(_flag(argv, "--max_batch_size"))),
            "max_num_tokens": int(str(_flag(argv, "--max_num_tokens"))),
            "max_input_len": int(str(_flag(argv, "--max_input_len"))),
            "max_seq_len": int(str(_flag(argv, "--max_seq_len"))),
            "kv_cache_type": kv_type.upper(),
            "plugin_config": {
                **switches,
                "paged_kv_cache": kv_type == "paged",
                "tokens_per_block": int(str(_flag(argv, "--tokens_per_block"))),
                "remove_input_padding": True,
            },
        }
        for key, value in self.engine_overrides.items():
            *parents, leaf = key.split(".")
            node = build_config
            for part in parents:
                node = node[part]
            node[leaf] = value
        engine = {"version": "1.2.0", "pretrained_config": checkpoint, "build_config": build_config}
        (out / "config.json").write_text(json.dumps(engine, indent=2))
        for rank in range(int(str(_flag(argv, "--workers")))):
            (out / f"rank{rank}.engine").write_bytes(b"\0")


class RecordingReporter:
    """Keeps ``(event, step)`` pairs in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def started(self, step: str, detail: str) -> None:
        self.events.append(("started", step))

    def skipped(self, step: str, reason: str) -> None:
        self.events.append(("skipped", step))

    def finished(self, step: str, seconds: float) -> None:
        self.events.append(("finished", step))

    def failed(self, step: str, error: str) -> None:
        self.events.append(("failed", step))


class TickClock:
    """A monotonic clock that advances ``step`` seconds per reading."""

    def __init__(self, step: float = 1.5) -> None:
        self.t = 0.0
        self.step = step

    def __call__(self) -> float:
        self.t += self.step
        return self.t
