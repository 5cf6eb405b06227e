"""The scheduler core runs on plain Python: importing it pulls in no heavy framework."""

from __future__ import annotations

import subprocess
import sys

CORE = [
    "orchestrator.core.request",
    "orchestrator.core.sched.scheduler",
    "orchestrator.core.kv.manager",
    "orchestrator.core.engine",
    "orchestrator.core",
]
HEAVY = ["torch", "fastapi", "starlette", "tensorrt_llm", "tensorrt", "transformers", "numpy"]


def test_core_imports_no_heavy_dependency() -> None:
    # A fresh interpreter: other tests in this process import torch.
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in CORE)
        + f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
