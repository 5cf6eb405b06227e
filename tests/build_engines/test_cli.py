"""``build-engines`` end to end, with the machine and the tools stood in for."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from build_engines.cli import EXIT_FAILED, EXIT_INVALID, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, main
from build_engines.environment import Environment
from orchestrator.common.specs import CONFIGS_DIR
from tests.build_engines.helpers import FakeTools, ready_environment, spec_data

FLAGSHIP = str(CONFIGS_DIR / "build" / "llama3-70b-fp8-h100-tp2.yaml")


def cli(*argv: str, **kwargs: Any) -> tuple[int, str]:
    buf = io.StringIO()
    code = main(list(argv), console=Console(file=buf, width=250), **kwargs)
    return code, buf.getvalue()


def bare(_toolchain: object) -> Environment:
    return Environment(has_tensorrt_llm=False, trtllm_build=None, quantize_script=False, gpus=())


def write_spec(tmp_path: Path, *overrides: dict[str, Any]) -> str:
    path = tmp_path / "spec.yaml"
    data = spec_data({"output_dir": str(tmp_path / "out")}, *overrides)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_plan_prints_plan_validation_memory_and_commands() -> None:
    code, out = cli("plan", FLAGSHIP)
    assert code == EXIT_OK
    assert "Build plan: llama3-70b-fp8-h100-tp2" in out
    assert "Validation: passed (0 errors, 2 warnings)" in out
    assert "36.33 GB" in out  # weights per GPU
    assert "81,920 B" in out  # KV bytes per token
    assert "448,992" in out  # KV tokens
    assert "quantize.py --model_dir" in out and "--qformat fp8 --kv_cache_dtype fp8" in out
    assert "trtllm-build --checkpoint_dir" in out and "--reduce_fusion enable" in out
    assert "cuda_graph_mode: true" in out


def test_plan_with_errors_exits_invalid(tmp_path: Path) -> None:
    code, out = cli("plan", write_spec(tmp_path, {"parallelism": {"tp": 1}}))
    assert code == EXIT_INVALID
    assert "plugins.reduce_fusion" in out and "nothing was run" in out


def test_invalid_spec_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\n")
    code, out = cli("plan", str(path))
    assert code == EXIT_INVALID
    assert "invalid build spec" in out and "model: Field required" in out


def test_usage_error() -> None:
    assert cli("compile", FLAGSHIP)[0] == EXIT_USAGE


def test_build_here_stops_after_the_plan_naming_what_is_missing() -> None:
    code, out = cli("build", FLAGSHIP, environment=bare)
    assert code == EXIT_UNAVAILABLE
    assert "Memory plan" in out  # the plan was printed first
    assert "Stopped after the plan" in out
    assert "TensorRT-LLM (the tensorrt_llm Python package is not importable)" in out
    assert "an NVIDIA GPU (nvidia-smi lists none)" in out
    assert "nvcr.io/nvidia/tensorrt-llm/release" in out


def test_dry_run_runs_nothing(tmp_path: Path) -> None:
    tools = FakeTools()
    code, out = cli(
        "build", write_spec(tmp_path), "--dry-run", environment=bare, runners=tools.runners()
    )
    assert code == EXIT_OK
    assert "Dry run" in out and "build     run" in out
    assert "A real build here would stop: missing TensorRT-LLM" in out
    assert tools.calls == []
    assert not (tmp_path / "out").exists()


def test_build_runs_verifies_and_resumes(tmp_path: Path) -> None:
    tools = FakeTools()
    spec = write_spec(tmp_path)
    code, out = cli(
        "build", spec, environment=lambda _: ready_environment(), runners=tools.runners()
    )
    assert code == EXIT_OK, out
    assert "Built and verified" in out
    assert (tmp_path / "out" / "manifest.json").is_file()
    code, out = cli(
        "build", spec, environment=lambda _: ready_environment(), runners=tools.runners()
    )
    assert code == EXIT_OK
    assert "skipped" in out
    assert tools.calls == ["download", "quantize", "build"]
    code, out = cli("build", spec, "--dry-run", environment=bare)
    assert "build     skip (up to date)" in out


def test_build_failure_exits_failed(tmp_path: Path) -> None:
    tools = FakeTools()
    tools.fail = "build"
    code, out = cli(
        "build",
        write_spec(tmp_path),
        environment=lambda _: ready_environment(),
        runners=tools.runners(),
    )
    assert code == EXIT_FAILED
    assert "build failed: build exited with status 1" in out


@pytest.mark.parametrize(
    "config", sorted((CONFIGS_DIR / "build").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_shipped_config_plans(config: Path) -> None:
    assert cli("plan", str(config))[0] == EXIT_OK
