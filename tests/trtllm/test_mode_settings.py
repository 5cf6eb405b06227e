"""What both TensorRT-LLM executors' options and settings do alike, once per mode: an
engine config that does not fit is refused by name, options validate without
TensorRT-LLM, unknown options are refused. Each mode's own settings are tested in
test_settings.py and test_llmapi_settings.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core.config import ConfigError
from plugins.trtllm import TrtllmExecutor, TrtllmLlmApiExecutor
from tests.trtllm.builds import FakeBuild, engine_config, write_build

# (executor class, build backend, the option naming the build folder, minimal options)
MODES = [
    pytest.param(TrtllmExecutor, "engine", "engine_dir", {"engine_dir": "/x"}, id="engine"),
    pytest.param(TrtllmLlmApiExecutor, "pytorch", "build_dir", {"model": "m"}, id="llm-api"),
]


@pytest.mark.parametrize(("cls", "backend", "folder", "minimal"), MODES)
def test_an_engine_config_that_does_not_fit_is_refused(
    tmp_path: Path, cls: Any, backend: str, folder: str, minimal: dict[str, Any]
) -> None:
    options = cls.Config(**{folder: write_build(tmp_path, FakeBuild(backend=backend))})
    cls.resolve(options, engine_config(options, block_size=16, max_batch_size=8))
    with pytest.raises(ConfigError, match=r"set cache.block_size: 16"):
        cls.resolve(options, engine_config(options, block_size=32))
    with pytest.raises(ConfigError, match=r"at most 8 sequences"):
        cls.resolve(options, engine_config(options, max_batch_size=9))


@pytest.mark.parametrize(("cls", "backend", "folder", "minimal"), MODES)
def test_the_config_validates_without_tensorrt_llm(
    cls: Any, backend: str, folder: str, minimal: dict[str, Any]
) -> None:
    code = (
        "import sys\n"
        f"from plugins.trtllm import {cls.__name__}\n"
        f"c = {cls.__name__}.Config.model_validate({minimal!r} | {{'seed': 3}})\n"
        "print(c.seed, 'tensorrt_llm' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "False"]


@pytest.mark.parametrize(("cls", "backend", "folder", "minimal"), MODES)
def test_unknown_options_are_refused(
    cls: Any, backend: str, folder: str, minimal: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match="kv_cache_fraction"):
        cls.Config.model_validate({**minimal, "kv_cache_fraction": 0.5})
