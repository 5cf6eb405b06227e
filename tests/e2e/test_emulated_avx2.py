"""The default config on an AVX2-class CPU, emulated: ``orchestrator serve`` with
configs/serve/smollm2-cpu.yaml under ``qemu-x86_64 -cpu Haswell`` answers one chat
request through the official ``openai`` client, and its start-up line says it chose the
AVX2 kernels (or lower), not AVX-512.

QEMU's TCG emulates AVX2 and FMA but no AVX-512 or AMX, and its CPUID says so, which is
what torch, oneDNN and our kernel choice read; so this catches code that assumes the
build machine's CPU. The emulated server's first answer must equal its second (the same
request again, on the prefix cache). Emulation runs Python some twenty times slower, so
the work it must do is cut to the start-up and two short requests: a native run of the same server first
fills the config's cache dir (dequantised weights, built kernels), forced to the AVX2
choices so it builds what the emulated CPU will ask for.
"""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import pytest

from tests.e2e.servers import STARTUP_LINE, Budget, chat, served

QEMU = shutil.which("qemu-x86_64")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        platform.machine().lower() not in ("x86_64", "amd64"),
        reason="emulating an x86 CPU needs an x86-64 host",
    ),
    pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 not on PATH (apt-get install qemu-user)"),
]
# Every wait draws on one budget that ends before the 900 s timeout, so a slow phase
# fails saying which it was. Emulated, torch alone takes about 35 s to import, and a
# server that had to do the first-use work itself once took 127 s to be ready and 316 s
# more for an 8-token answer; on a busy machine all of it stretches, so no phase gets a
# fixed share.
BUDGET_S = 840.0
AVX2_OR_LOWER = {"avx2", "portable"}


def test_default_config_serves_a_chat_on_an_emulated_avx2_cpu(tmp_path: Path) -> None:
    assert QEMU is not None
    # ORCHESTRATOR_CPU_ISA forces the choices an AVX2 CPU makes (kernel variant, dtype,
    # weight format), so the cache holds exactly what the emulated server looks for.
    budget = Budget(BUDGET_S)
    native_log = tmp_path / "native.log"
    with served([], native_log, budget, {"ORCHESTRATOR_CPU_ISA": "avx2"}) as base:
        chat(base, budget, 4)

    emulated_log = tmp_path / "emulated.log"
    with served([QEMU, "-cpu", "Haswell"], emulated_log, budget) as base:
        # The fresh server's first answer, then the same request again (on the prefix
        # cache): the same text.
        first = chat(base, budget, 4)
        assert chat(base, budget, 4) == first

    log = emulated_log.read_text(errors="replace")
    found = STARTUP_LINE.search(log)
    assert found, f"no `torch executor: ... kernels <variant>, ... cpu_features` line in:\n{log}"
    assert found["variant"] in AVX2_OR_LOWER, found[0]
    assert "avx512" not in found["features"] and "amx" not in found["features"], found[0]
