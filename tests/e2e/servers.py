"""A fresh ``orchestrator serve`` with the default config in a process of its own, for
the end-to-end checks that need a whole server as ``make serve`` starts it (an
emulated CPU, a kernel variant forced by ``ORCHESTRATOR_CPU_ISA``)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import yaml

from tests.gateway.support import free_port, wait_ready

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "serve" / "smollm2-cpu.yaml"
README_QUESTION = "What is the capital of France?"
SERVE = [sys.executable, "-m", "orchestrator.cli", "serve", "--host", "127.0.0.1"]
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


def chat(base: str, budget: Budget, max_tokens: int) -> str:
    """The README's question, greedy, through the official client: the answer's text."""
    model = yaml.safe_load(CONFIG.read_text())["model"]["name"]
    client = openai.OpenAI(
        base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=budget.left()
    )
    reply = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": README_QUESTION}],
        max_tokens=max_tokens,
        temperature=0,
    )
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= max_tokens
    return reply.choices[0].message.content or ""
