"""Against the real TensorRT-LLM (inside the NGC container): the names check, and a live
run when ``ORCHESTRATOR_TRTLLM_BUILD_DIR`` names a build-engines output folder built for
this machine's GPU."""

from __future__ import annotations

import io
import os

import pytest

from plugins.trtllm import check_names
from plugins.trtllm.names import MODULE

pytestmark = pytest.mark.trtllm

BUILD_DIR_ENV = "ORCHESTRATOR_TRTLLM_BUILD_DIR"


@pytest.fixture(scope="module")
def real_bindings() -> object:
    return pytest.importorskip(
        MODULE, reason="needs TensorRT-LLM 1.2.x (run inside the NGC TensorRT-LLM container)"
    )


def test_every_name_the_adapter_uses_exists(real_bindings: object) -> None:
    out = io.StringIO()
    assert check_names.main([], out=out) == 0, out.getvalue()


def test_the_adapter_generates_on_a_real_engine(real_bindings: object) -> None:
    build_dir = os.environ.get(BUILD_DIR_ENV)
    if not build_dir:
        pytest.skip(f"set {BUILD_DIR_ENV} to a build-engines output folder for this GPU")
    out = io.StringIO()
    assert check_names.main(["--engine-dir", build_dir], out=out) == 0, out.getvalue()
