"""What a machine lacks for a build, and probing without TensorRT-LLM."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from build_engines import environment
from build_engines.commands import Toolchain
from build_engines.environment import Environment, gpu_family
from orchestrator.common.specs import load_gpu_spec
from tests.build_engines.helpers import PYTORCH, make_spec, ready_environment

H100 = load_gpu_spec("h100-sxm")
TOOLCHAIN = Toolchain(examples_dir=Path("/nowhere"))


def bare() -> Environment:
    return Environment(has_tensorrt_llm=False, trtllm_build=None, quantize_script=False, gpus=())


def test_ready_machine_lacks_nothing() -> None:
    assert ready_environment().missing_for(make_spec(), H100, TOOLCHAIN) == []


def test_bare_machine_names_everything() -> None:
    missing = bare().missing_for(make_spec(), H100, TOOLCHAIN)
    assert len(missing) == 4
    assert missing[0].startswith("TensorRT-LLM")
    assert missing[1] == "trtllm-build (not on PATH)"
    assert "/nowhere/quantization/quantize.py not found" in missing[2]
    assert missing[3].startswith("an NVIDIA GPU")


def test_pytorch_backend_needs_no_trtllm_build() -> None:
    env = Environment(True, None, True, ("NVIDIA H100 80GB HBM3",))
    assert env.missing_for(make_spec(PYTORCH), H100, TOOLCHAIN) == []


def test_wrong_gpu_is_named() -> None:
    env = Environment(True, "/bin/trtllm-build", True, ("NVIDIA A100-SXM4-80GB",))
    (item,) = env.missing_for(make_spec(), H100, TOOLCHAIN)
    assert item.startswith("H100-SXM GPUs: an engine runs only") and "NVIDIA A100-SXM4-80GB" in item


def test_gpu_family() -> None:
    assert gpu_family("H100-SXM") == "H100"
    assert gpu_family("A100-80GB") == "A100"
    assert gpu_family("L40S") == "L40S"


def test_no_nvidia_smi_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)
    assert environment.list_gpus() == ()


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_llm") is not None, reason="TensorRT-LLM is installed"
)
def test_probe_here_reports_trtllm_missing() -> None:
    env = environment.probe(TOOLCHAIN)
    assert not env.has_tensorrt_llm
    assert env.tool_versions["tensorrt_llm"] is None
    assert env.tool_versions["build_engines"] is not None  # this project is installed
