"""Validating a shipped config checks its executor's options with the executor's own
model, and loads for it neither the executor's heavy dependencies nor any other
executor's plug-in: what ``ExecutorSpec`` imports to validate is the plug-in's package,
whose modules import torch and TensorRT-LLM only when an executor starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVE_CONFIGS = sorted((REPO / "configs" / "serve").glob("*.yaml"))
HEAVY = ("torch", "tensorrt_llm", "numpy", "fastapi", "llguidance", "transformers")
PLUGIN_OF = {"torch": "plugins.torch_executor", "sim": "plugins.sim_executor"}

PROBE = """
import json, sys
from orchestrator.core.config import EngineConfig, load_yaml
config = load_yaml(sys.argv[1], EngineConfig)
print(json.dumps({
    "type": config.executor.type,
    "options": type(config.executor.options).__name__,
    "modules": sorted(m for m in sys.modules if m.split(".")[0] in (%r) or m.startswith("plugins.")),
}))
"""


def test_the_shipped_serve_configs_are_found() -> None:
    # An empty glob would leave the parametrized test below with no cases at all.
    assert len(SERVE_CONFIGS) >= 2, SERVE_CONFIGS


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_a_shipped_config_validates_its_options_without_heavy_imports(path: Path) -> None:
    code = PROBE % (HEAVY,)
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["options"] != "NoneType", "the executor's options were not validated"
    loaded = set(seen["modules"])
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}, loaded
    plugins = {m.split(".")[1] for m in loaded if m.startswith("plugins.")}
    own = PLUGIN_OF.get(seen["type"], "plugins.trtllm").split(".")[1]
    assert plugins <= {own}, f"{path.name} loaded other plug-ins: {sorted(plugins - {own})}"
