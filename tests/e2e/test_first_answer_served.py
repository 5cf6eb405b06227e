"""A freshly started server's first answer equals its second, on every kernel variant
this CPU runs (``ORCHESTRATOR_CPU_ISA``; the AVX2-only case emulated is
``test_emulated_avx2.py``): ``orchestrator serve`` with the default config in a process
of its own, the README's question asked twice, greedy. The second runs on the prefix
cache; before a prompt's last block attended the same way in both, a bfloat16 server on
an AMX CPU answered the first time "L'Étoile, la Marseillaise, ..." and then "The
capital of France is Paris." (docs/torch_executor.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.torch_executor import kernel_build
from plugins.torch_executor.cpu_features import detect
from tests.e2e.servers import STARTUP_LINE, Budget, chat, served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

BUDGET_S = 540.0


@pytest.mark.parametrize("variant", [v.name for v in kernel_build.runnable(detect())])
def test_a_fresh_servers_first_answer_equals_its_second(variant: str, tmp_path: Path) -> None:
    budget = Budget(BUDGET_S)
    log = tmp_path / "serve.log"
    with served([], log, budget, {kernel_build.ISA_ENV: variant}) as base:
        first = chat(base, budget, 24)
        second = chat(base, budget, 24)
    found = STARTUP_LINE.search(log.read_text(errors="replace"))
    assert found and found["variant"] == variant, found
    print(f"{variant}: first {first!r}, second {second!r}")
    assert first == second
    # The README's answer, which transformers' float32 Llama gives on the same weights.
    assert "Paris" in first, first
