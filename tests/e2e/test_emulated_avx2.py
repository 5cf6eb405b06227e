"""The default config on an AVX2-class CPU, emulated: ``orchestrator serve`` with
configs/serve/smollm2-cpu.yaml under ``qemu-x86_64 -cpu Haswell`` answers one chat
request through the official ``openai`` client, and its start-up line says it chose the
AVX2 kernels (or lower), not AVX-512.

QEMU's TCG emulates AVX2 and FMA but no AVX-512 or AMX, and its CPUID says so, which is
what torch, oneDNN and our kernel choice read; so this catches code that assumes the
build machine's CPU. Emulation runs Python some twenty times slower, so the work it must
do is cut to the start-up and one short request: a native run of the same server first
fills the config's cache dir (dequantised weights, built kernels), forced to the AVX2
choices so it builds what the emulated CPU will ask for.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

from tests.gateway.support import free_port, wait_ready

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve" / "smollm2-cpu.yaml"
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
SERVE = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1"]
# Every wait draws on one budget that ends before the 900 s timeout, so a slow phase
# fails saying which it was. Emulated, torch alone takes about 35 s to import, and a
# server that had to do the first-use work itself once took 127 s to be ready and 316 s
# more for an 8-token answer; on a busy machine all of it stretches, so no phase gets a
# fixed share.
BUDGET_S = 840.0
STOP_S = 20  # SIGTERM (a drain with nothing in flight), then SIGKILL
# The executor's start-up line: `torch executor: device cpu, dtype float32, weights int8,
# kernels avx2, cpu <brand string>, cpu_features avx2 fma f16c (weights: <why>)`.
STARTUP_LINE = re.compile(
    r"torch executor: .*?\bkernels (?P<variant>\w+), .*\bcpu_features (?P<features>[\w ]+)"
)
AVX2_OR_LOWER = {"avx2", "portable"}


class Budget:
    """Seconds left of one deadline."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())


@contextlib.contextmanager
def served(
    prefix: list[str], log_path: Path, budget: Budget, env: dict[str, str] | None = None
) -> Iterator[str]:
    """``orchestrator serve`` with the default config, run through ``prefix`` (an
    emulator, or nothing), on a free port of 127.0.0.1; yields its base URL once /ready
    answers, and stops it afterwards (SIGTERM, then SIGKILL). The log's tail goes to
    stdout, which pytest shows when the test fails."""
    port = free_port()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*prefix, *SERVE, "--config", str(CONFIG), "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        wait_ready(f"http://127.0.0.1:{port}", budget.left(), alive=lambda: proc.poll() is None)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # qemu warns about the CPU flags TCG lacks at every thread start; those say nothing.
        lines = log_path.read_text(errors="replace").splitlines()
        lines = [line for line in lines if not line.startswith("qemu-x86_64: warning")]
        print(f"--- {log_path.name} (last 40 lines)", *lines[-40:], sep="\n")


def chat_once(base: str, budget: Budget) -> None:
    """One short greedy chat through the official client; raises if it fails."""
    model = yaml.safe_load(CONFIG.read_text())["model"]["name"]
    client = openai.OpenAI(
        base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=budget.left()
    )
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 4


def test_default_config_serves_a_chat_on_an_emulated_avx2_cpu(tmp_path: Path) -> None:
    assert QEMU is not None
    # ORCHESTRATOR_CPU_ISA forces the choices an AVX2 CPU makes (kernel variant, dtype,
    # weight format), so the cache holds exactly what the emulated server looks for.
    budget = Budget(BUDGET_S)
    native_log = tmp_path / "native.log"
    with served([], native_log, budget, {"ORCHESTRATOR_CPU_ISA": "avx2"}) as base:
        chat_once(base, budget)

    emulated_log = tmp_path / "emulated.log"
    with served([QEMU, "-cpu", "Haswell"], emulated_log, budget) as base:
        chat_once(base, budget)

    log = emulated_log.read_text(errors="replace")
    found = STARTUP_LINE.search(log)
    assert found, f"no `torch executor: ... kernels <variant>, ... cpu_features` line in:\n{log}"
    assert found["variant"] in AVX2_OR_LOWER, found[0]
    assert "avx512" not in found["features"] and "amx" not in found["features"], found[0]
