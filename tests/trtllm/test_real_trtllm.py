"""Against the real TensorRT-LLM (inside the NGC container): the names check of each mode
whose module the installed release has, and live runs when ``ORCHESTRATOR_TRTLLM_BUILD_DIR``
names a ``backend: engine`` build folder or ``ORCHESTRATOR_TRTLLM_MODEL`` a checkpoint (or
``backend: pytorch`` build folder) for this machine's GPU."""

from __future__ import annotations

import importlib
import importlib.util
import io
import os

import pytest

from plugins.trtllm import check_names
from plugins.trtllm.names import LLM_API_MODULE, MODULE

pytestmark = pytest.mark.trtllm

BUILD_DIR_ENV = "ORCHESTRATOR_TRTLLM_BUILD_DIR"
MODEL_ENV = "ORCHESTRATOR_TRTLLM_MODEL"


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # the parent package is missing
        return False


def has_engine_backend() -> bool:
    """The bindings module imports on every release, the PyTorch-only ones included (the
    PyTorch backend uses its value types); only releases with the engine backend have
    its ``Executor``."""
    return importable(MODULE) and hasattr(importlib.import_module(MODULE), "Executor")


needs_engine_mode = pytest.mark.skipif(
    not has_engine_backend(),
    reason="needs TensorRT-LLM 1.2.x with the engine backend (the NGC TensorRT-LLM container)",
)
needs_llm_api = pytest.mark.skipif(
    not importable(LLM_API_MODULE),
    reason="needs TensorRT-LLM 1.2.1 or newer (the NGC TensorRT-LLM container)",
)


def check(*argv: str) -> None:
    out = io.StringIO()
    assert check_names.main(list(argv), out=out) == 0, out.getvalue()


@needs_engine_mode
def test_every_name_engine_mode_uses_exists() -> None:
    check("--mode", "engine")


@needs_llm_api
def test_every_name_llm_api_mode_uses_exists() -> None:
    check("--mode", "llm-api")


@needs_engine_mode
def test_engine_mode_generates_on_a_real_engine() -> None:
    build_dir = os.environ.get(BUILD_DIR_ENV)
    if not build_dir:
        pytest.skip(f"set {BUILD_DIR_ENV} to a backend: engine build folder for this GPU")
    check("--mode", "engine", "--engine-dir", build_dir)


@needs_llm_api
def test_llm_api_mode_generates_on_a_real_model() -> None:
    model = os.environ.get(MODEL_ENV)
    if not model:
        pytest.skip(f"set {MODEL_ENV} to a checkpoint or backend: pytorch build for this GPU")
    check("--mode", "llm-api", "--model", model)
